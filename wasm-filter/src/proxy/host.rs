//! Bindings to the raw proxy-wasm 0.2.1 host functions, and safe wrappers
//! that turn every host answer into a `Result`: no status the host may
//! return can make the module trap.

use super::pairs;

pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

pub const BUFFER_REQUEST_BODY: u32 = 0;
pub const BUFFER_RESPONSE_BODY: u32 = 1;
pub const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
pub const MAP_RESPONSE_TRAILERS: u32 = 3;

const STATUS_OK: u32 = 0;
const STATUS_NOT_FOUND: u32 = 1;

/// A host status other than Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStatus(pub u32);

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message: *const u8, len: usize) -> u32;
    fn proxy_get_buffer_bytes(kind: u32, start: usize, max: usize, ret_ptr: *mut *mut u8, ret_len: *mut usize) -> u32;
    fn proxy_set_buffer_bytes(kind: u32, start: usize, size: usize, data: *const u8, len: usize) -> u32;
    fn proxy_get_header_map_value(map: u32, key: *const u8, key_len: usize, ret_ptr: *mut *mut u8, ret_len: *mut usize) -> u32;
    fn proxy_replace_header_map_value(map: u32, key: *const u8, key_len: usize, value: *const u8, value_len: usize) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
}

pub fn log(level: u32, message: &str) {
    // Nothing useful can be done if logging itself fails.
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

/// Takes ownership of a buffer the host allocated in this module through
/// `proxy_on_memory_allocate` (a `Vec` with capacity == length).
unsafe fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        Vec::new()
    } else {
        Vec::from_raw_parts(ptr, len, len)
    }
}

fn check(status: u32) -> Result<(), HostStatus> {
    if status == STATUS_OK { Ok(()) } else { Err(HostStatus(status)) }
}

pub fn buffer(kind: u32, start: usize, max: usize) -> Result<Vec<u8>, HostStatus> {
    let (mut ptr, mut len) = (std::ptr::null_mut(), 0usize);
    let status = unsafe { proxy_get_buffer_bytes(kind, start, max, &mut ptr, &mut len) };
    let bytes = unsafe { take(ptr, len) };
    match status {
        STATUS_OK => Ok(bytes),
        STATUS_NOT_FOUND => Ok(Vec::new()),
        other => Err(HostStatus(other)),
    }
}

/// Replaces the first `size` bytes of a buffer with `data`.
pub fn set_buffer(kind: u32, size: usize, data: &[u8]) -> Result<(), HostStatus> {
    check(unsafe { proxy_set_buffer_bytes(kind, 0, size, data.as_ptr(), data.len()) })
}

pub fn header(map: u32, key: &str) -> Option<String> {
    let (mut ptr, mut len) = (std::ptr::null_mut(), 0usize);
    let status = unsafe { proxy_get_header_map_value(map, key.as_ptr(), key.len(), &mut ptr, &mut len) };
    let bytes = unsafe { take(ptr, len) };
    (status == STATUS_OK).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

pub fn set_header(map: u32, key: &str, value: &str) -> Result<(), HostStatus> {
    check(unsafe { proxy_replace_header_map_value(map, key.as_ptr(), key.len(), value.as_ptr(), value.len()) })
}

pub fn remove_header(map: u32, key: &str) -> Result<(), HostStatus> {
    check(unsafe { proxy_remove_header_map_value(map, key.as_ptr(), key.len()) })
}

/// Answers the client directly; the host sends it when the callback returns.
pub fn send_reply(http_status: u16, body: &str, headers: &[(&str, &[u8])]) -> Result<(), HostStatus> {
    let map = pairs::serialize(headers);
    let details = "grpc_wasm";
    check(unsafe {
        proxy_send_local_response(
            u32::from(http_status),
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    })
}
