//! A proxy-wasm filter that traps on purpose, so that the tests can show
//! what Envoy does with the README's `failure_policy` when a module traps
//! (grpc-wasm's own module has no known trap left to use). A request whose
//! path starts with `/trap` hits `unreachable`; any other gets a local 200
//! reply `ok`. Built by the test with plain `rustc`: no crates, no std.
#![no_std]

use core::arch::wasm32::unreachable;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unreachable()
}

const MAP_REQUEST_HEADERS: u32 = 0;
const PAUSE: u32 = 1;

extern "C" {
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *mut *const u8,
        value_len: *mut usize,
    ) -> u32;
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

/// Where the host writes what it hands over: one header value at a time.
static mut SCRATCH: [u8; 4096] = [0; 4096];

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size > 4096 {
        return core::ptr::null_mut();
    }
    // The module is single-threaded, and the host copies one value at a
    // time into this buffer before the filter reads it.
    core::ptr::addr_of_mut!(SCRATCH) as *mut u8
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_context: u32, _parent: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_root: u32, _size: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_context: u32, _headers: u32, _eos: u32) -> u32 {
    let key = b":path";
    let mut value: *const u8 = core::ptr::null();
    let mut len = 0usize;
    // SAFETY: the host writes a pointer and a length into the two locals.
    let status = unsafe {
        proxy_get_header_map_value(MAP_REQUEST_HEADERS, key.as_ptr(), key.len(), &mut value, &mut len)
    };
    if status == 0 && len >= 5 && !value.is_null() {
        // SAFETY: the host gave `len` bytes at `value`, in SCRATCH.
        let path = unsafe { core::slice::from_raw_parts(value, len) };
        if &path[..5] == b"/trap" {
            unreachable();
        }
    }
    let body = b"ok";
    // SAFETY: every pointer is to `len` readable bytes of this module.
    unsafe {
        proxy_send_local_response(200, b"".as_ptr(), 0, body.as_ptr(), body.len(), b"".as_ptr(), 0, -1);
    }
    PAUSE
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_context: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_context: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_delete(_context: u32) {}
