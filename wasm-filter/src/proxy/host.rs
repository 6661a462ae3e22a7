//! Bindings to the raw proxy-wasm 0.2.1 host functions, and safe wrappers
//! that turn every host answer into a `Result`: no status the host may
//! return can make the module trap.

use std::cell::RefCell;
use std::ops::Range;

use super::pairs::{self, Change};

use super::contract::{BufferType, LogLevel, MapType, Status};

/// A host status other than Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStatus(pub u32);

const STATUS_OK: u32 = Status::Ok as u32;
const STATUS_NOT_FOUND: u32 = Status::NotFound as u32;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message: *const u8, len: usize) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        ret_ptr: *mut *mut u8,
        ret_len: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        kind: u32,
        start: usize,
        size: usize,
        data: *const u8,
        len: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
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
    fn proxy_get_header_map_pairs(map: u32, ret_ptr: *mut *mut u8, ret_len: *mut usize) -> u32;
    fn proxy_get_current_time_nanoseconds(ret: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_len: usize,
        ret_ptr: *mut *mut u8,
        ret_len: *mut usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_call_foreign_function(
        name: *const u8,
        name_len: usize,
        args: *const u8,
        args_len: usize,
        ret_ptr: *mut *mut u8,
        ret_len: *mut usize,
    ) -> u32;
    fn proxy_http_call(
        upstream: *const u8,
        upstream_len: usize,
        headers: *const u8,
        headers_len: usize,
        body: *const u8,
        body_len: usize,
        trailers: *const u8,
        trailers_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_call(
        upstream: *const u8,
        upstream_len: usize,
        service: *const u8,
        service_len: usize,
        method: *const u8,
        method_len: usize,
        metadata: *const u8,
        metadata_len: usize,
        message: *const u8,
        message_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_stream(
        upstream: *const u8,
        upstream_len: usize,
        service: *const u8,
        service_len: usize,
        method: *const u8,
        method_len: usize,
        metadata: *const u8,
        metadata_len: usize,
        token: *mut u32,
    ) -> u32;
    fn proxy_grpc_send(token: u32, message: *const u8, message_len: usize, end_stream: u32) -> u32;
    fn proxy_grpc_close(token: u32) -> u32;
    fn proxy_grpc_cancel(token: u32) -> u32;
    fn proxy_get_status(code: *mut u32, message_ptr: *mut *mut u8, message_len: *mut usize) -> u32;
}

pub fn log(level: LogLevel, message: &str) {
    // Nothing useful can be done if logging itself fails.
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    let _ = unsafe { proxy_log(level.into(), message.as_ptr(), message.len()) };
}

/// Takes ownership of a buffer the host allocated in this module through
/// `proxy_on_memory_allocate` (a `Vec` with capacity == length).
unsafe fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the host allocated it through `proxy_on_memory_allocate`, a
        // `Vec<u8>` of exactly `len` bytes, and hands it over (this
        // function's contract).
        unsafe { Vec::from_raw_parts(ptr, len, len) }
    }
}

/// Runs a host call that answers with a buffer through out-parameters;
/// returns its status and the buffer (taken back into a `Vec`).
///
/// # Safety
/// `call` writes into its out-parameters only a buffer the host allocated
/// through `proxy_on_memory_allocate`, or nothing: a proxy-wasm host call
/// that answers with a buffer.
unsafe fn with_buffer(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> (u32, Vec<u8>) {
    let (mut ptr, mut len) = (std::ptr::null_mut(), 0usize);
    let status = call(&mut ptr, &mut len);
    // SAFETY: the host wrote a buffer from proxy_on_memory_allocate, or nothing.
    (status, unsafe { take(ptr, len) })
}

fn check(status: u32) -> Result<(), HostStatus> {
    if status == STATUS_OK {
        Ok(())
    } else {
        Err(HostStatus(status))
    }
}

pub fn buffer(kind: BufferType, start: usize, max: usize) -> Result<Vec<u8>, HostStatus> {
    // SAFETY: a host call that writes only a buffer it allocated in this
    // module into the out-parameters, as `with_buffer` requires.
    let (status, bytes) = unsafe {
        with_buffer(|ptr, len| proxy_get_buffer_bytes(kind.into(), start, max, ptr, len))
    };
    match status {
        STATUS_OK => Ok(bytes),
        STATUS_NOT_FOUND => Ok(Vec::new()),
        other => Err(HostStatus(other)),
    }
}

/// Replaces the first `size` bytes of a buffer with `data`.
pub fn set_buffer(kind: BufferType, size: usize, data: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe { proxy_set_buffer_bytes(kind.into(), 0, size, data.as_ptr(), data.len()) })
}

pub fn set_header(map: MapType, key: &str, value: &str) -> Result<(), HostStatus> {
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe {
        proxy_replace_header_map_value(
            map.into(),
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

pub fn remove_header(map: MapType, key: &str) -> Result<(), HostStatus> {
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe { proxy_remove_header_map_value(map.into(), key.as_ptr(), key.len()) })
}

/// A header map read in one host call; lookups stay in the module and
/// borrow from the host's bytes.
#[derive(Debug, Default)]
pub struct HeaderMap {
    bytes: Vec<u8>,
    entries: Vec<(Range<usize>, Range<usize>)>,
}

impl HeaderMap {
    pub fn read(map: MapType) -> HeaderMap {
        // SAFETY: a host call that writes only a buffer it allocated in this
        // module into the out-parameters, as `with_buffer` requires.
        let (status, bytes) =
            unsafe { with_buffer(|ptr, len| proxy_get_header_map_pairs(map.into(), ptr, len)) };
        let entries = match status {
            STATUS_OK => pairs::index(&bytes).unwrap_or_default(),
            _ => Vec::new(),
        };
        HeaderMap { bytes, entries }
    }

    /// The first value of `name`, whatever its case: Envoy lower-cases
    /// names, but HTTP/1 hosts (ngx_wasm_module) keep `Content-Type`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(k, _)| self.bytes[k.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| &self.bytes[v.clone()])
    }

    /// Sets `set` and drops `remove` in the host's map `map` (the one this
    /// was read from), with a host call only for what differs.
    pub fn edit(
        &self,
        map: MapType,
        set: &[(&str, &str)],
        remove: &[&str],
    ) -> Result<(), HostStatus> {
        for change in pairs::changes(self.pairs(), set, remove) {
            match change {
                Change::Set(name, value) => set_header(map, name, value)?,
                Change::Remove(name) => remove_header(map, name)?,
            }
        }
        Ok(())
    }

    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries
            .iter()
            .map(|(k, v)| (&self.bytes[k.clone()], &self.bytes[v.clone()]))
    }
}

/// The one period of every root's ticks: they enforce callout deadlines
/// and pace configuration fetches.
pub const TICK_MS: u32 = 50;

thread_local! {
    /// Roots whose ticks run. ngx_wasm_module traps when a period is set
    /// while one runs, so a running period is never set again.
    static TICKING: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Starts or stops `root_id`'s ticks; `root_id` must be the current
/// context.
pub fn ticks(root_id: u32, on: bool) -> Result<(), HostStatus> {
    if TICKING.with(|t| t.borrow().contains(&root_id)) == on {
        return Ok(());
    }
    let period = if on { TICK_MS } else { 0 };
    // SAFETY: plain integers (and locals the host writes once); no memory is shared.
    check(unsafe { proxy_set_tick_period_milliseconds(period) })?;
    TICKING.with(|t| {
        let mut t = t.borrow_mut();
        if on {
            t.push(root_id);
        } else {
            t.retain(|r| *r != root_id);
        }
    });
    Ok(())
}

pub fn now_nanos() -> u64 {
    let mut now = 0u64;
    // SAFETY: plain integers (and locals the host writes once); no memory is shared.
    let _ = unsafe { proxy_get_current_time_nanoseconds(&mut now) };
    now
}

/// A host property by its path segments; `None` when the host has none.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let joined = path.join("\0");
    // SAFETY: a host call that writes only a buffer it allocated in this
    // module into the out-parameters, as `with_buffer` requires.
    let (status, bytes) = unsafe {
        with_buffer(|ptr, len| proxy_get_property(joined.as_ptr(), joined.len(), ptr, len))
    };
    (status == STATUS_OK).then_some(bytes)
}

/// Makes later calls (replies, headers) act on this HTTP stream; gRPC
/// callbacks arrive on the root context.
pub fn set_effective_context(context_id: u32) -> Result<(), HostStatus> {
    // SAFETY: plain integers (and locals the host writes once); no memory is shared.
    check(unsafe { proxy_set_effective_context(context_id) })
}

/// Calls a function the host registered under `name`; `Err(HostStatus(1))`
/// (NotFound) on hosts that have none by that name.
pub fn call_foreign(name: &str, args: &[u8]) -> Result<Vec<u8>, HostStatus> {
    // SAFETY: a host call that writes only a buffer it allocated in this
    // module into the out-parameters, as `with_buffer` requires.
    let (status, bytes) = unsafe {
        with_buffer(|ptr, len| {
            proxy_call_foreign_function(
                name.as_ptr(),
                name.len(),
                args.as_ptr(),
                args.len(),
                ptr,
                len,
            )
        })
    };
    check(status).map(|()| bytes)
}

/// An HTTP GET through the host; returns its token. The answer arrives in
/// `proxy_on_http_call_response`.
pub fn http_get(
    upstream: &str,
    authority: &str,
    path: &str,
    timeout_ms: u32,
) -> Result<u32, HostStatus> {
    let headers = pairs::serialize(&[
        (":method", "GET"),
        (":path", path),
        (":authority", authority),
        (":scheme", "http"),
    ]);
    let trailers = pairs::serialize::<&str, &str>(&[]);
    let mut token = 0u32;
    // SAFETY: every pointer and length comes from a live slice, and `token`
    // is a local the host writes once.
    check(unsafe {
        proxy_http_call(
            upstream.as_ptr(),
            upstream.len(),
            headers.as_ptr(),
            headers.len(),
            std::ptr::null(),
            0,
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    })
    .map(|()| token)
}

/// Where and what to call: the host frames the bare message itself.
pub struct GrpcTarget<'a> {
    pub upstream: &'a [u8],
    pub service: &'a str,
    pub method: &'a str,
    pub metadata: &'a [(String, String)],
}

impl GrpcTarget<'_> {
    fn metadata_map(&self) -> Vec<u8> {
        let pairs: Vec<(&str, &[u8])> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        pairs::serialize(&pairs)
    }
}

/// A unary call; returns its token.
pub fn grpc_call(target: &GrpcTarget, message: &[u8], timeout_ms: u64) -> Result<u32, HostStatus> {
    let map = target.metadata_map();
    let (u, s, m) = (target.upstream, target.service, target.method);
    let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX).max(1);
    let mut token = 0u32;
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe {
        proxy_grpc_call(
            u.as_ptr(),
            u.len(),
            s.as_ptr(),
            s.len(),
            m.as_ptr(),
            m.len(),
            map.as_ptr(),
            map.len(),
            message.as_ptr(),
            message.len(),
            timeout,
            &mut token,
        )
    })
    .map(|()| token)
}

/// Opens a stream; returns its token. Streams have no host deadline: the
/// caller enforces its own.
pub fn grpc_stream(target: &GrpcTarget) -> Result<u32, HostStatus> {
    let map = target.metadata_map();
    let (u, s, m) = (target.upstream, target.service, target.method);
    let mut token = 0u32;
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe {
        proxy_grpc_stream(
            u.as_ptr(),
            u.len(),
            s.as_ptr(),
            s.len(),
            m.as_ptr(),
            m.len(),
            map.as_ptr(),
            map.len(),
            &mut token,
        )
    })
    .map(|()| token)
}

pub fn grpc_send(token: u32, message: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
    check(unsafe { proxy_grpc_send(token, message.as_ptr(), message.len(), 0) })
}

/// Half-closes a stream (the spec's way; an empty message would be a message).
pub fn grpc_close(token: u32) -> Result<(), HostStatus> {
    // SAFETY: plain integers (and locals the host writes once); no memory is shared.
    check(unsafe { proxy_grpc_close(token) })
}

pub fn grpc_cancel(token: u32) -> Result<(), HostStatus> {
    // SAFETY: plain integers (and locals the host writes once); no memory is shared.
    check(unsafe { proxy_grpc_cancel(token) })
}

/// The status of the gRPC callback in progress: code and message.
pub fn grpc_status() -> (u32, String) {
    let mut code = 0u32;
    // SAFETY: a host call that writes the code into `code` and only a buffer
    // it allocated in this module into the out-parameters (`with_buffer`).
    let (status, bytes) = unsafe { with_buffer(|ptr, len| proxy_get_status(&mut code, ptr, len)) };
    if status != STATUS_OK {
        return (2, format!("the host gave no status (host status {status})"));
    }
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// Answers the client directly; the host sends it when the callback returns.
pub fn send_reply(
    http_status: u16,
    details: &str,
    body: &str,
    headers: &[(&str, &[u8])],
) -> Result<(), HostStatus> {
    send_reply_map(http_status, details, body, &pairs::serialize(headers))
}

/// [`send_reply`] with the headers already serialized.
pub fn send_reply_map(
    http_status: u16,
    details: &str,
    body: &str,
    map: &[u8],
) -> Result<(), HostStatus> {
    // SAFETY: every pointer and length comes from a live slice that outlives the call.
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
