//! The [`Host`] of the wasm32 build: the raw proxy-wasm 0.2.1 host
//! functions, each answer turned into a `Result`.

use super::{GrpcCall, Host, HostStatus};
use crate::contract::{BufferType, ContextId, LogLevel, MapType, MetricType, ProxyStatus, Token};

const STATUS_OK: u32 = ProxyStatus::Ok as u32;

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
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
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
/// returns the buffer (taken back into a `Vec`), or the host's status.
///
/// # Safety
/// `call` writes into its out-parameters only a buffer the host allocated
/// through `proxy_on_memory_allocate`, or nothing: a proxy-wasm host call
/// that answers with a buffer.
unsafe fn with_buffer(
    call: impl FnOnce(*mut *mut u8, *mut usize) -> u32,
) -> Result<Vec<u8>, HostStatus> {
    let (mut ptr, mut len) = (std::ptr::null_mut(), 0usize);
    let status = call(&mut ptr, &mut len);
    // SAFETY: the host wrote a buffer from proxy_on_memory_allocate, or nothing.
    let bytes = unsafe { take(ptr, len) };
    check(status).map(|()| bytes)
}

fn check(status: u32) -> Result<(), HostStatus> {
    if status == STATUS_OK {
        Ok(())
    } else {
        Err(HostStatus(status))
    }
}

/// The proxy that runs the module.
pub struct AbiHost;

impl Host for AbiHost {
    fn log(&self, level: LogLevel, message: &str) {
        // Nothing useful can be done if logging itself fails.
        // SAFETY: every pointer and length comes from a live slice that outlives the call.
        let _ = unsafe { proxy_log(level.into(), message.as_ptr(), message.len()) };
    }

    fn get_buffer(
        &self,
        kind: BufferType,
        start: usize,
        max: usize,
    ) -> Result<Vec<u8>, HostStatus> {
        // SAFETY: a host call that writes only a buffer it allocated in this
        // module into the out-parameters, as `with_buffer` requires.
        unsafe { with_buffer(|ptr, len| proxy_get_buffer_bytes(kind.into(), start, max, ptr, len)) }
    }

    fn set_buffer(
        &self,
        kind: BufferType,
        start: usize,
        size: usize,
        data: &[u8],
    ) -> Result<(), HostStatus> {
        // SAFETY: every pointer and length comes from a live slice that outlives the call.
        check(unsafe {
            proxy_set_buffer_bytes(kind.into(), start, size, data.as_ptr(), data.len())
        })
    }

    fn get_header_pairs(&self, map: MapType) -> Result<Vec<u8>, HostStatus> {
        // SAFETY: a host call that writes only a buffer it allocated in this
        // module into the out-parameters, as `with_buffer` requires.
        unsafe { with_buffer(|ptr, len| proxy_get_header_map_pairs(map.into(), ptr, len)) }
    }

    fn replace_header(&self, map: MapType, key: &str, value: &str) -> Result<(), HostStatus> {
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

    fn remove_header(&self, map: MapType, key: &str) -> Result<(), HostStatus> {
        // SAFETY: every pointer and length comes from a live slice that outlives the call.
        check(unsafe { proxy_remove_header_map_value(map.into(), key.as_ptr(), key.len()) })
    }

    fn set_tick_period(&self, period_ms: u32) -> Result<(), HostStatus> {
        // SAFETY: a plain integer; no memory is shared.
        check(unsafe { proxy_set_tick_period_milliseconds(period_ms) })
    }

    fn current_time_nanos(&self) -> u64 {
        let mut now = 0u64;
        // SAFETY: `now` is a local the host writes once.
        let _ = unsafe { proxy_get_current_time_nanoseconds(&mut now) };
        now
    }

    fn get_property(&self, path: &[u8]) -> Result<Vec<u8>, HostStatus> {
        // SAFETY: a host call that writes only a buffer it allocated in this
        // module into the out-parameters, as `with_buffer` requires.
        unsafe { with_buffer(|ptr, len| proxy_get_property(path.as_ptr(), path.len(), ptr, len)) }
    }

    fn set_effective_context(&self, context_id: ContextId) -> Result<(), HostStatus> {
        // SAFETY: a plain integer; no memory is shared.
        check(unsafe { proxy_set_effective_context(context_id.0) })
    }

    fn call_foreign(&self, name: &str, args: &[u8]) -> Result<Vec<u8>, HostStatus> {
        // SAFETY: a host call that writes only a buffer it allocated in this
        // module into the out-parameters, as `with_buffer` requires.
        unsafe {
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
        }
    }

    fn http_call(
        &self,
        upstream: &str,
        headers: &[u8],
        trailers: &[u8],
        timeout_ms: u32,
    ) -> Result<Token, HostStatus> {
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
        .map(|()| Token(token))
    }

    fn grpc_call(
        &self,
        call: &GrpcCall,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<Token, HostStatus> {
        let (u, s, m, map) = (call.upstream, call.service, call.method, call.metadata);
        let mut token = 0u32;
        // SAFETY: every pointer and length comes from a live slice, and `token`
        // is a local the host writes once.
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
                timeout_ms,
                &mut token,
            )
        })
        .map(|()| Token(token))
    }

    fn grpc_stream(&self, call: &GrpcCall) -> Result<Token, HostStatus> {
        let (u, s, m, map) = (call.upstream, call.service, call.method, call.metadata);
        let mut token = 0u32;
        // SAFETY: every pointer and length comes from a live slice, and `token`
        // is a local the host writes once.
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
        .map(|()| Token(token))
    }

    fn grpc_send(&self, token: Token, message: &[u8]) -> Result<(), HostStatus> {
        // SAFETY: every pointer and length comes from a live slice that outlives the call.
        check(unsafe { proxy_grpc_send(token.0, message.as_ptr(), message.len(), 0) })
    }

    fn grpc_close(&self, token: Token) -> Result<(), HostStatus> {
        // SAFETY: a plain integer; no memory is shared.
        check(unsafe { proxy_grpc_close(token.0) })
    }

    fn grpc_cancel(&self, token: Token) -> Result<(), HostStatus> {
        // SAFETY: a plain integer; no memory is shared.
        check(unsafe { proxy_grpc_cancel(token.0) })
    }

    fn get_status(&self) -> Result<(u32, Vec<u8>), HostStatus> {
        let mut code = 0u32;
        // SAFETY: a host call that writes the code into `code` and only a
        // buffer it allocated in this module into the out-parameters.
        let message = unsafe { with_buffer(|ptr, len| proxy_get_status(&mut code, ptr, len)) }?;
        Ok((code, message))
    }

    fn send_local_response(
        &self,
        http_status: u32,
        details: &str,
        body: &[u8],
        headers: &[u8],
    ) -> Result<(), HostStatus> {
        // SAFETY: every pointer and length comes from a live slice that outlives the call.
        check(unsafe {
            proxy_send_local_response(
                http_status,
                details.as_ptr(),
                details.len(),
                body.as_ptr(),
                body.len(),
                headers.as_ptr(),
                headers.len(),
                -1,
            )
        })
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, HostStatus> {
        let mut id = 0u32;
        // SAFETY: the name comes from a live slice that outlives the call,
        // and `id` is a local the host writes once.
        check(unsafe { proxy_define_metric(kind.into(), name.as_ptr(), name.len(), &mut id) })
            .map(|()| id)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostStatus> {
        // SAFETY: plain integers; no memory is shared.
        check(unsafe { proxy_increment_metric(id, offset) })
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostStatus> {
        // SAFETY: plain integers; no memory is shared.
        check(unsafe { proxy_record_metric(id, value) })
    }
}
