//! The proxy-wasm 0.2.1 host functions the module imports, as wasmtime
//! host functions. Each one checks every pointer it is given and answers
//! with a proxy-wasm status, never a trap: the module sees what Envoy would
//! show it.

use std::time::{SystemTime, UNIX_EPOCH};

use grpc_wasm::contract::{BufferType, MapType, MetricType, ProxyStatus, HOST_PROPERTY, SHIM_HOST};
use wasmtime::{Caller, Linker};

use super::state::{GrpcCommand, HostState, LocalReply, TokenKind};
use crate::call::header_block as pairs;
use crate::call::{CallId, GrpcTarget, HeaderBlock, Token};

/// The host function the shim offers through `proxy_call_foreign_function`.
pub use grpc_wasm::contract::DELIVER_FUNCTION;

// The answers as wasmtime host functions return them.

type Ctx<'a> = Caller<'a, HostState>;

/// Registers a host function that answers a [`ProxyStatus`]: the ABI's
/// `u32` is made here, and only here.
macro_rules! answering {
    ($linker:expr, $name:literal, $f:expr, ($($arg:ident: $ty:ty),*)) => {
        $linker.func_wrap("env", $name, |c: Ctx, $($arg: $ty),*| -> u32 {
            u32::from($f(c, $($arg),*))
        })?
    };
}

pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    answering!(linker, "proxy_log", log, (level: u32, ptr: u32, len: u32));
    answering!(linker, "proxy_get_buffer_bytes", get_buffer_bytes,
        (kind: u32, start: u32, max: u32, ret_ptr: u32, ret_len: u32));
    answering!(linker, "proxy_set_buffer_bytes", set_buffer_bytes,
        (kind: u32, start: u32, size: u32, ptr: u32, len: u32));
    answering!(linker, "proxy_get_header_map_value", get_header_map_value,
        (kind: u32, kptr: u32, klen: u32, ret_ptr: u32, ret_len: u32));
    answering!(linker, "proxy_get_header_map_pairs", get_header_map_pairs,
        (kind: u32, ret_ptr: u32, ret_len: u32));
    answering!(linker, "proxy_replace_header_map_value", replace_header_map_value,
        (kind: u32, kptr: u32, klen: u32, vptr: u32, vlen: u32));
    answering!(linker, "proxy_remove_header_map_value", remove_header_map_value,
        (kind: u32, kptr: u32, klen: u32));
    answering!(linker, "proxy_send_local_response", send_local_response,
        (status: u32, dptr: u32, dlen: u32, bptr: u32, blen: u32, hptr: u32, hlen: u32, grpc: i32));
    answering!(linker, "proxy_get_current_time_nanoseconds", current_time, (ret: u32));
    answering!(linker, "proxy_set_tick_period_milliseconds", set_tick_period, (ms: u32));
    answering!(linker, "proxy_get_property", get_property,
        (ptr: u32, len: u32, ret_ptr: u32, ret_len: u32));
    // The module fetches a configuration with HTTP calls only where the
    // shim is not (it refuses "fetch" here); the answer still is a status.
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |_: Ctx, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32| {
            u32::from(ProxyStatus::Unimplemented)
        },
    )?;
    answering!(linker, "proxy_set_effective_context", set_effective_context, (id: u32));
    answering!(linker, "proxy_call_foreign_function", call_foreign_function,
        (nptr: u32, nlen: u32, aptr: u32, alen: u32, ret_ptr: u32, ret_len: u32));
    answering!(linker, "proxy_grpc_call", grpc_call,
        (uptr: u32, ulen: u32, sptr: u32, slen: u32, mptr: u32, mlen: u32, hptr: u32, hlen: u32,
         msg_ptr: u32, msg_len: u32, timeout_ms: u32, token_ptr: u32));
    answering!(linker, "proxy_grpc_stream", grpc_stream,
        (uptr: u32, ulen: u32, sptr: u32, slen: u32, mptr: u32, mlen: u32, hptr: u32, hlen: u32,
         token_ptr: u32));
    answering!(linker, "proxy_grpc_send", grpc_send, (token: u32, ptr: u32, len: u32, end: u32));
    answering!(linker, "proxy_grpc_close", grpc_close, (token: u32));
    answering!(linker, "proxy_grpc_cancel", grpc_cancel, (token: u32));
    answering!(linker, "proxy_get_status", get_status, (code_ptr: u32, ret_ptr: u32, ret_len: u32));
    answering!(linker, "proxy_define_metric", define_metric,
        (kind: u32, ptr: u32, len: u32, id_ptr: u32));
    answering!(linker, "proxy_increment_metric", increment_metric, (id: u32, offset: i64));
    answering!(linker, "proxy_record_metric", record_metric, (id: u32, value: u64));
    Ok(())
}

fn define_metric(mut c: Ctx, kind: u32, ptr: u32, len: u32, id_ptr: u32) -> ProxyStatus {
    let Ok(kind) = MetricType::try_from(kind) else {
        return ProxyStatus::BadArgument;
    };
    // Refused before it is copied out of the module.
    if len as usize > super::metrics::MAX_NAME_BYTES {
        return ProxyStatus::BadArgument;
    }
    let Some(name) = read_str(&mut c, ptr, len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    match c.data_mut().metrics.define(kind, &name) {
        Ok(id) if write_u32(&mut c, id_ptr, id) => ProxyStatus::Ok,
        Ok(_) => ProxyStatus::InvalidMemoryAccess,
        Err(status) => status,
    }
}

fn increment_metric(mut c: Ctx, id: u32, offset: i64) -> ProxyStatus {
    match c.data_mut().metrics.increment(id, offset) {
        Ok(()) => ProxyStatus::Ok,
        Err(status) => status,
    }
}

fn record_metric(mut c: Ctx, id: u32, value: u64) -> ProxyStatus {
    match c.data_mut().metrics.record(id, value) {
        Ok(()) => ProxyStatus::Ok,
        Err(status) => status,
    }
}

fn set_tick_period(mut c: Ctx, ms: u32) -> ProxyStatus {
    c.data_mut().tick_ms = ms;
    ProxyStatus::Ok
}

fn set_effective_context(mut c: Ctx, id: u32) -> ProxyStatus {
    let known = id == super::ROOT_ID || c.data().http.contains_key(&id);
    if !known {
        return ProxyStatus::BadArgument;
    }
    c.data_mut().effective = id;
    ProxyStatus::Ok
}

fn grpc_send(mut c: Ctx, token: u32, ptr: u32, len: u32, _end: u32) -> ProxyStatus {
    let Some(message) = read(&mut c, ptr, len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let compress = !c.data().uncompressed_sends;
    c.data_mut().outputs.commands.push(GrpcCommand::Send {
        token: Token(token),
        message,
        compress,
    });
    ProxyStatus::Ok
}

fn grpc_close(mut c: Ctx, token: u32) -> ProxyStatus {
    c.data_mut().outputs.commands.push(GrpcCommand::Close {
        token: Token(token),
    });
    ProxyStatus::Ok
}

fn grpc_cancel(mut c: Ctx, token: u32) -> ProxyStatus {
    // A cancelled call gets no more events, its close included.
    let token = Token(token);
    c.data_mut().release(token);
    c.data_mut()
        .outputs
        .commands
        .push(GrpcCommand::Cancel { token });
    ProxyStatus::Ok
}

fn read(c: &mut Ctx, ptr: u32, len: u32) -> Option<Vec<u8>> {
    let memory = c.data().memory?;
    let (start, end) = (ptr as usize, (ptr as usize).checked_add(len as usize)?);
    memory.data(&*c).get(start..end).map(<[u8]>::to_vec)
}

fn read_str(c: &mut Ctx, ptr: u32, len: u32) -> Option<String> {
    let memory = c.data().memory?;
    let (start, end) = (ptr as usize, (ptr as usize).checked_add(len as usize)?);
    memory.data(&*c).get(start..end).map(pairs::text)
}

fn write_u32(c: &mut Ctx, addr: u32, value: u32) -> bool {
    let Some(memory) = c.data().memory else {
        return false;
    };
    let start = addr as usize;
    match memory.data_mut(&mut *c).get_mut(start..start + 4) {
        Some(slot) => {
            slot.copy_from_slice(&value.to_le_bytes());
            true
        }
        None => false,
    }
}

/// One property: the one by which the module recognises this host (it
/// trusts the shim's callers with `callout.upstream_header`).
fn get_property(mut c: Ctx, ptr: u32, len: u32, ret_ptr: u32, ret_len: u32) -> ProxyStatus {
    let Some(path) = read(&mut c, ptr, len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    if path == HOST_PROPERTY.as_bytes() {
        give(&mut c, SHIM_HOST, ret_ptr, ret_len)
    } else {
        ProxyStatus::NotFound
    }
}

/// Copies `bytes` into memory the module allocates, and writes its address
/// and length where the module asked.
fn give(c: &mut Ctx, bytes: &[u8], ret_ptr: u32, ret_len: u32) -> ProxyStatus {
    let Some(allocate) = c.data().allocate.clone() else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let Ok(len) = u32::try_from(bytes.len()) else {
        return ProxyStatus::BadArgument;
    };
    let addr = match allocate.call(&mut *c, len) {
        Ok(addr) => addr,
        Err(e) => {
            // The module's state is not to be trusted after a trap: the
            // host call that led here fails with it (see ProxyHost::checked).
            c.data_mut().trapped = Some(crate::wasm::instance::trap_reason(&e));
            return ProxyStatus::InvalidMemoryAccess;
        }
    };
    let Some(memory) = c.data().memory else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let start = addr as usize;
    let Some(dst) = memory.data_mut(&mut *c).get_mut(start..start + bytes.len()) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    dst.copy_from_slice(bytes);
    if write_u32(c, ret_ptr, addr) && write_u32(c, ret_len, len) {
        ProxyStatus::Ok
    } else {
        ProxyStatus::InvalidMemoryAccess
    }
}

fn log(mut c: Ctx, level: u32, ptr: u32, len: u32) -> ProxyStatus {
    let Some(message) = read_str(&mut c, ptr, len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    if level >= 4 {
        c.data_mut().last_error = message.clone();
    }
    if level >= 3 || std::env::var_os("GRPC_WASM_DEBUG").is_some() {
        eprintln!("[grpc-wasm] {message}");
    }
    ProxyStatus::Ok
}

fn buffer_of<'a>(c: &'a Ctx<'_>, kind: u32) -> Option<&'a [u8]> {
    let state = c.data();
    match BufferType::try_from(kind).ok()? {
        BufferType::HttpRequestBody => state
            .http
            .get(&state.effective)
            .map(|h| h.request_body.as_slice()),
        BufferType::GrpcReceiveBuffer => Some(&state.grpc_message),
        BufferType::PluginConfiguration => Some(&state.plugin_config),
        _ => None,
    }
}

fn get_buffer_bytes(
    mut c: Ctx,
    kind: u32,
    start: u32,
    max: u32,
    ret_ptr: u32,
    ret_len: u32,
) -> ProxyStatus {
    // Only the asked-for range is copied out of the host's buffer.
    let Some(range) = buffer_of(&c, kind).map(|buffer| {
        let start = (start as usize).min(buffer.len());
        let end = start.saturating_add(max as usize).min(buffer.len());
        buffer[start..end].to_vec()
    }) else {
        return ProxyStatus::NotFound;
    };
    give(&mut c, &range, ret_ptr, ret_len)
}

/// Envoy's rule: at 0, drop `size` bytes and put `data` in front; at or past
/// the end, append; anything else is refused.
fn set_buffer_bytes(
    mut c: Ctx,
    kind: u32,
    start: u32,
    size: u32,
    ptr: u32,
    len: u32,
) -> ProxyStatus {
    let Some(data) = read(&mut c, ptr, len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    if BufferType::try_from(kind) != Ok(BufferType::HttpRequestBody) {
        return ProxyStatus::NotFound;
    }
    let effective = c.data().effective;
    let Some(http) = c.data_mut().http.get_mut(&effective) else {
        return ProxyStatus::NotFound;
    };
    let body = &mut http.request_body;
    if start == 0 {
        body.drain(..(size as usize).min(body.len()));
        body.splice(0..0, data);
    } else if start as usize >= body.len() {
        body.extend_from_slice(&data);
    } else {
        return ProxyStatus::BadArgument;
    }
    ProxyStatus::Ok
}

fn map_of<'a>(c: &'a mut Ctx<'_>, kind: u32) -> Option<&'a mut HeaderBlock> {
    let state = c.data_mut();
    match MapType::try_from(kind).ok()? {
        MapType::HttpRequestHeaders => state
            .http
            .get_mut(&state.effective)
            .map(|h| &mut h.request_headers),
        MapType::GrpcReceiveInitialMetadata => Some(&mut state.grpc_initial),
        MapType::GrpcReceiveTrailingMetadata => Some(&mut state.grpc_trailing),
        _ => None,
    }
}

fn get_header_map_value(
    mut c: Ctx,
    kind: u32,
    kptr: u32,
    klen: u32,
    ret_ptr: u32,
    ret_len: u32,
) -> ProxyStatus {
    let Some(key) = read_str(&mut c, kptr, klen) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let Some(map) = map_of(&mut c, kind) else {
        return ProxyStatus::NotFound;
    };
    let Some(value) = map.get_ignore_case(&key).map(<[u8]>::to_vec) else {
        return ProxyStatus::NotFound;
    };
    give(&mut c, &value, ret_ptr, ret_len)
}

fn get_header_map_pairs(mut c: Ctx, kind: u32, ret_ptr: u32, ret_len: u32) -> ProxyStatus {
    let Some(map) = map_of(&mut c, kind) else {
        return ProxyStatus::NotFound;
    };
    // `give` re-enters the module (its allocator), which needs the store:
    // the map steps out of it meanwhile instead of being copied.
    let block = std::mem::take(map);
    let status = give(&mut c, block.bytes(), ret_ptr, ret_len);
    if let Some(map) = map_of(&mut c, kind) {
        *map = block;
    }
    status
}

fn replace_header_map_value(
    mut c: Ctx,
    kind: u32,
    kptr: u32,
    klen: u32,
    vptr: u32,
    vlen: u32,
) -> ProxyStatus {
    let (Some(key), Some(value)) = (read_str(&mut c, kptr, klen), read(&mut c, vptr, vlen)) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let Some(map) = map_of(&mut c, kind) else {
        return ProxyStatus::NotFound;
    };
    map.replace(&key, Some(&value));
    ProxyStatus::Ok
}

fn remove_header_map_value(mut c: Ctx, kind: u32, kptr: u32, klen: u32) -> ProxyStatus {
    let Some(key) = read_str(&mut c, kptr, klen) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let Some(map) = map_of(&mut c, kind) else {
        return ProxyStatus::NotFound;
    };
    map.replace(&key, None);
    ProxyStatus::Ok
}

#[allow(clippy::too_many_arguments)]
fn send_local_response(
    mut c: Ctx,
    status: u32,
    _dptr: u32,
    _dlen: u32,
    bptr: u32,
    blen: u32,
    hptr: u32,
    hlen: u32,
    _grpc_status: i32,
) -> ProxyStatus {
    let (Some(body), Some(map)) = (read(&mut c, bptr, blen), read(&mut c, hptr, hlen)) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let Some(headers) = HeaderBlock::parse(map) else {
        return ProxyStatus::BadArgument;
    };
    let effective = c.data().effective;
    if !c.data().http.contains_key(&effective) {
        return ProxyStatus::BadArgument;
    }
    c.data_mut().outputs.replies.push((
        CallId(effective),
        LocalReply {
            http_status: status,
            body,
            headers,
        },
    ));
    ProxyStatus::Ok
}

fn current_time(mut c: Ctx, ret: u32) -> ProxyStatus {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let Some(memory) = c.data().memory else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    match memory
        .data_mut(&mut c)
        .get_mut(ret as usize..ret as usize + 8)
    {
        Some(slot) => {
            slot.copy_from_slice(&nanos.to_le_bytes());
            ProxyStatus::Ok
        }
        None => ProxyStatus::InvalidMemoryAccess,
    }
}

fn call_foreign_function(
    mut c: Ctx,
    nptr: u32,
    nlen: u32,
    aptr: u32,
    alen: u32,
    _ret_ptr: u32,
    _ret_len: u32,
) -> ProxyStatus {
    let (Some(name), Some(args)) = (read_str(&mut c, nptr, nlen), read(&mut c, aptr, alen)) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    if name != DELIVER_FUNCTION {
        return ProxyStatus::NotFound;
    }
    if args.len() < 4 {
        return ProxyStatus::BadArgument;
    }
    let context = u32::from_le_bytes([args[0], args[1], args[2], args[3]]);
    c.data_mut()
        .outputs
        .messages
        .push((CallId(context), args[4..].to_vec()));
    ProxyStatus::Ok
}

#[allow(clippy::too_many_arguments)]
fn target(
    c: &mut Ctx,
    up: (u32, u32),
    service: (u32, u32),
    method: (u32, u32),
    map: (u32, u32),
) -> Result<GrpcTarget, ProxyStatus> {
    let upstream = read_str(c, up.0, up.1).ok_or(ProxyStatus::InvalidMemoryAccess)?;
    let service = read_str(c, service.0, service.1).ok_or(ProxyStatus::InvalidMemoryAccess)?;
    let method = read_str(c, method.0, method.1).ok_or(ProxyStatus::InvalidMemoryAccess)?;
    let map = read(c, map.0, map.1).ok_or(ProxyStatus::InvalidMemoryAccess)?;
    let metadata = pairs::deserialize(&map).ok_or(ProxyStatus::BadArgument)?;
    Ok(GrpcTarget {
        upstream,
        service,
        method,
        metadata,
        // The caller's choice, set by the client before the call starts.
        compression: Default::default(),
    })
}

#[allow(clippy::too_many_arguments)]
fn grpc_call(
    mut c: Ctx,
    uptr: u32,
    ulen: u32,
    sptr: u32,
    slen: u32,
    mptr: u32,
    mlen: u32,
    hptr: u32,
    hlen: u32,
    msg_ptr: u32,
    msg_len: u32,
    timeout_ms: u32,
    token_ptr: u32,
) -> ProxyStatus {
    let Some(message) = read(&mut c, msg_ptr, msg_len) else {
        return ProxyStatus::InvalidMemoryAccess;
    };
    let parts = ((uptr, ulen), (sptr, slen), (mptr, mlen), (hptr, hlen));
    let context = CallId(c.data().effective);
    open_call(
        &mut c,
        parts,
        token_ptr,
        TokenKind::Call,
        |token, target| GrpcCommand::Call {
            token,
            target,
            message,
            timeout_ms,
            context,
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn grpc_stream(
    mut c: Ctx,
    uptr: u32,
    ulen: u32,
    sptr: u32,
    slen: u32,
    mptr: u32,
    mlen: u32,
    hptr: u32,
    hlen: u32,
    token_ptr: u32,
) -> ProxyStatus {
    let parts = ((uptr, ulen), (sptr, slen), (mptr, mlen), (hptr, hlen));
    let context = CallId(c.data().effective);
    open_call(
        &mut c,
        parts,
        token_ptr,
        TokenKind::Stream,
        |token, target| GrpcCommand::Stream {
            token,
            target,
            context,
        },
    )
}

type Span = (u32, u32);

/// What calls and streams share: read the target, hand out a token, queue
/// the command for the transport.
fn open_call(
    c: &mut Ctx,
    (upstream, service, method, metadata): (Span, Span, Span, Span),
    token_ptr: u32,
    kind: TokenKind,
    command: impl FnOnce(Token, GrpcTarget) -> GrpcCommand,
) -> ProxyStatus {
    let target = match target(c, upstream, service, method, metadata) {
        Ok(t) => t,
        Err(status) => return status,
    };
    let token = c.data_mut().token(kind);
    if !write_u32(c, token_ptr, token.0) {
        c.data_mut().release(token);
        return ProxyStatus::InvalidMemoryAccess;
    }
    c.data_mut().outputs.commands.push(command(token, target));
    ProxyStatus::Ok
}

fn get_status(mut c: Ctx, code_ptr: u32, ret_ptr: u32, ret_len: u32) -> ProxyStatus {
    let (code, message) = c.data().grpc_status.clone();
    if !write_u32(&mut c, code_ptr, code) {
        return ProxyStatus::InvalidMemoryAccess;
    }
    give(&mut c, &message, ret_ptr, ret_len)
}
