//! The exported proxy-wasm callbacks: one root context per plugin
//! configuration, one stream context per HTTP exchange.
//!
//! This module is the dispatcher: it hands each callback to
//! [`transcode_callbacks`] (the filter on the proxy's route, the default)
//! or to [`callout_callbacks`] (`"callout"` in the configuration: the
//! filter makes the gRPC call itself). An exchange's state is a [`stream::Stream`],
//! kept in the [`contexts`] maps; [`host_kind`](mod@host_kind) says what the host lacks;
//! [`answer`](mod@answer) says what each callback answers the host and sends local replies.

mod answer;
mod callout_callbacks;
mod contexts;
mod host_kind;
mod stream;
mod transcode_callbacks;

use super::callout::host as callout_host;
use super::messages::Route;
use std::cell::RefCell;
use std::rc::Rc;

use super::config::{FilterConfig, Loaded};
use super::fetch;
use super::host::{self, *};
use super::metrics;
use super::reflection;
use super::reply::Reply;
use super::transcode::{self, Plan};
use crate::code::Code;
use crate::contract::{BufferType, ContextId, LogLevel, MapType, Token};
use crate::http_rule::{escaped_again, is_raw_form_of};
use crate::status::Status;
use answer::{answer, send_local, CONTINUE, PAUSE};
use contexts::{with_stream, ROOTS, STREAMS};
use host_kind::{check_host, host_is_shim, host_kind};
use stream::Stream;

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host's allocator for buffers it hands to the module; `host::take`
/// turns them back into `Vec`s, so capacity must equal the size.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut buf = Vec::<u8>::with_capacity(size);
    let ptr = buf.as_mut_ptr();
    std::mem::forget(buf);
    ptr
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent_id: u32) {
    let context_id = ContextId(context_id);
    let parent_id = ContextId(parent_id);
    if parent_id == ContextId(0) {
        return;
    }
    let Some(config) = ROOTS.with(|r| r.borrow().get(&parent_id).cloned()) else {
        if !fetch::adopt(context_id, parent_id) {
            reflection::adopt(context_id, parent_id);
        }
        return;
    };
    STREAMS.with(|s| {
        s.borrow_mut()
            .insert(context_id, Rc::new(RefCell::new(Stream::new(config))))
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_vm_start(_root_id: u32, _size: u32) -> u32 {
    1
}

/// A bad configuration is refused here, with one log line naming the
/// problem, so that it never fails later at request time.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_configure(root_id: u32, size: u32) -> u32 {
    let root_id = ContextId(root_id);
    let bytes = match host::buffer(BufferType::PluginConfiguration, 0, size as usize) {
        Ok(bytes) => bytes,
        Err(status) => {
            log(
                LogLevel::Error,
                &format!(
                    "grpc-wasm: cannot read the plugin configuration (host status {})",
                    status.0
                ),
            );
            return 0;
        }
    };
    match FilterConfig::load(&bytes) {
        Ok(Loaded::Ready(config)) => install(root_id, *config),
        Ok(Loaded::Fetch(_)) if host_is_shim() => {
            log(LogLevel::Error, "grpc-wasm: bad configuration: fetch: the OpenResty shim has no HTTP calls; give \"protos\" or \"descriptor_set\"");
            0
        }
        Ok(Loaded::Fetch(f)) => {
            fetch::start(root_id, bytes, f);
            1
        }
        Ok(Loaded::Reflect(_)) if host_is_shim() => {
            log(LogLevel::Error, "grpc-wasm: bad configuration: reflection: in OpenResty, load a server's descriptors with grpc.reflect");
            0
        }
        Ok(Loaded::Reflect(_)) if !host_kind::has_grpc_calls_while_configuring() => {
            log(LogLevel::Error, "grpc-wasm: bad configuration: reflection: this host has no gRPC calls (ngx_wasm_module); give \"protos\" or \"descriptor_set\"");
            0
        }
        Ok(Loaded::Reflect(r)) => {
            // What the host checks of a configuration is checked now, on
            // the inline part, not after each load.
            let inline = FilterConfig::with_reflected(&bytes, &[]).and_then(check_host);
            if let Err(e) = inline {
                log(
                    LogLevel::Error,
                    &format!("grpc-wasm: bad configuration: {e}"),
                );
                return 0;
            }
            reflection::start(root_id, bytes, r);
            1
        }
        Err(e) => {
            log(
                LogLevel::Error,
                &format!("grpc-wasm: bad configuration: {e}"),
            );
            0
        }
    }
}

/// Makes `config` the configuration of `root_id`, once the host checks pass.
fn install(root_id: ContextId, config: FilterConfig) -> u32 {
    match check_host(config) {
        Ok(config) => {
            for why in &config.left_out {
                log(
                    LogLevel::Warn,
                    &format!("grpc-wasm: a google.api.http binding is left out: {why}"),
                );
            }
            log_loopback(&config);
            metrics::reconfigured();
            if host_kind().defines_metrics() {
                metrics::descriptor_files(config.registry.pool().files().len());
                metrics::held_bytes(super::held::vm_total());
            } else {
                // Its metrics live in a shared slab that only its Lua
                // bridge reads, and a definition the slab cannot hold
                // traps the module.
                metrics::turn_off("ngx_wasm_module traps a metric definition its shared memory cannot hold, and only its Lua bridge reads metrics");
            }
            // Streams have no host deadline: ticks enforce them, and hand
            // the counters to the host. Without calls of the filter's own
            // (callouts, and the bodiless requests of bindings) or metrics
            // nothing needs ticks (a fetch may have started them).
            let calls = config.callout.is_some() || !config.bindings.is_empty();
            let refreshes = reflection::loads(root_id);
            let _ = host::ticks(root_id, calls || refreshes || metrics::are_on());
            ROOTS.with(|r| r.borrow_mut().insert(root_id, Rc::new(config)));
            log(LogLevel::Info, "grpc-wasm: configured");
            1
        }
        Err(e) => {
            log(
                LogLevel::Error,
                &format!("grpc-wasm: bad configuration: {e}"),
            );
            0
        }
    }
}

/// One line when the loopback cluster decides what some requests get: none
/// where the filter needs it (they are refused), one where it is not used.
fn log_loopback(config: &FilterConfig) {
    let transcodes = config.callout.is_none() && !config.bindings.is_empty();
    let needs = host_kind().calls_for_bodiless_requests();
    match &config.loopback_cluster {
        None if transcodes && needs => log(
            LogLevel::Warn,
            &format!("grpc-wasm: no \"loopback_cluster\": requests without a body and google.api.HttpBody answers are refused with 501 UNIMPLEMENTED: {}", callout_callbacks::NO_LOOPBACK),
        ),
        Some(cluster) if !needs => log(
            LogLevel::Warn,
            &format!("grpc-wasm: loopback_cluster \"{cluster}\" is not used: this host lets the filter give a request without a body its message in the stream"),
        ),
        _ => {}
    }
}

/// The fetched configuration document (see [`fetch`]).
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_http_call_response(
    root_id: u32,
    token: u32,
    _headers: u32,
    body_size: u32,
    _trailers: u32,
) {
    let root_id = ContextId(root_id);
    let token = Token(token);
    if let Some(config) = fetch::on_response(root_id, token, body_size as usize, check_host) {
        install(root_id, config);
    }
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_request_headers(
    context_id: u32,
    _headers: u32,
    end_of_stream: u32,
) -> u32 {
    let context_id = ContextId(context_id);
    if let Some(reply) = fetch::not_ready(context_id).or_else(|| reflection::not_ready(context_id))
    {
        return send_local(&reply);
    }
    with_stream(context_id, CONTINUE, |stream| {
        let headers = HeaderMap::read(MapType::HttpRequestHeaders);
        let http_method = headers.get(":method").unwrap_or_default();
        let path = headers.get(":path").unwrap_or_default();
        let end_of_stream = end_of_stream != 0;
        let client_path = client_path();
        let plan = transcode::plan(
            &stream.config,
            http_method,
            client_path.as_deref().unwrap_or(path),
            headers.get("content-type"),
        );
        if let Plan::Transcode(route) = &plan {
            let method = &route.method;
            let metrics = metrics::of_method(method.path(), method.service_name(), method.name());
            stream.meter.start(metrics);
        }
        match plan {
            Plan::PassThrough => CONTINUE,
            Plan::Reply(reply) => answer(stream, &reply),
            Plan::Transcode(route) if stream.config.callout.is_some() => {
                callout_callbacks::start(stream, context_id, route, &headers, end_of_stream)
            }
            Plan::Transcode(route) if calls_on_loopback(&route, end_of_stream) => {
                callout_callbacks::start_on_loopback(
                    stream,
                    context_id,
                    route,
                    &headers,
                    end_of_stream,
                )
            }
            Plan::Transcode(route) => transcode_callbacks::request_headers(
                stream,
                route,
                &headers,
                (http_method, path),
                end_of_stream,
            ),
        }
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_request_body(
    context_id: u32,
    body_size: u32,
    end_of_stream: u32,
) -> u32 {
    let context_id = ContextId(context_id);
    with_stream(context_id, CONTINUE, |stream| {
        let (size, end_of_stream) = (body_size as usize, end_of_stream != 0);
        if stream.call.is_some() {
            return callout_callbacks::request_body(stream, context_id, size, end_of_stream);
        }
        transcode_callbacks::request_body(stream, size, end_of_stream)
    })
}

/// The path the bindings read, where the host's `:path` is decoded (see
/// `HostKind::decodes_path`): the client's, when it says the same segment
/// by segment, so that path variables keep the escapes `url_unescape_spec`
/// keeps, as in Envoy; else (nginx rewrote it, or a `%2F` split a segment)
/// nginx's own, escaped again so that a decoded `?` starts no query.
fn client_path() -> Option<String> {
    if !host_kind().decodes_path() {
        return None;
    }
    let text = |name: &str| {
        let bytes = host::property(&["request", name])?;
        String::from_utf8(bytes).ok()
    };
    // nginx's `$uri` is decoded: its bytes need not be UTF-8.
    let uri = host::property(&["request", "url_path"])?;
    let args = text("query").unwrap_or_default();
    if let Some(raw) = text("path").filter(|raw| is_raw_form_of(raw, &uri, &args)) {
        return Some(raw);
    }
    let path = escaped_again(&uri);
    Some(if args.is_empty() {
        path
    } else {
        format!("{path}?{args}")
    })
}

/// Whether a request for `route` in transcoding mode becomes a call of the
/// filter's own, through the loopback cluster: where a binding's fields come
/// from the path and query alone, as Envoy lets no filter add the body the
/// upstream needs (a host that does, ngx_wasm_module, gets the body in
/// `transcoding`); and where the response is an HttpBody, as its
/// Content-Type comes with the message, after the response headers have
/// left (a filter on Envoy cannot hold them and still see the body).
fn calls_on_loopback(route: &Route, end_of_stream: bool) -> bool {
    let host = host_kind();
    let bodiless = end_of_stream && !host.sets_request_body_at_headers();
    route.binding.is_some()
        && host.has_grpc_calls()
        && (bodiless || route.response_http_body().is_some())
}

/// A request that ends with trailers ends here, not in a body callback.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _trailers: u32) -> u32 {
    let context_id = ContextId(context_id);
    with_stream(context_id, CONTINUE, request_trailers)
}

/// A request the filter handles (transcoded or called out) never gets its
/// body transcoded when it ends with trailers: the body callbacks saw no
/// end. Without this callback the host forwarded the client's own bytes
/// upstream under the rewritten path, bypassing every rule that trusts the
/// REST path and the JSON validation. Such a request is refused
/// in every mode. The trailers are held in any case (PAUSE): when the host
/// refuses the reply, or the exchange is answered already, the upstream
/// gets no end of request rather than an untranscoded one. A refused reply
/// then leaves the stream to the host's own timeouts (Envoy's stream idle
/// timeout); Envoy takes a local reply at this point, resetting the stream
/// when the response has started.
fn request_trailers(stream: &mut Stream) -> u32 {
    if stream.route.is_none() {
        return CONTINUE;
    }
    if !stream.phase.is_decided() {
        if let Some(call) = stream.call.take() {
            callout_host::cancel(&call);
        }
        let status = Status::new(Code::InvalidArgument, REQUEST_TRAILERS);
        answer(stream, &Reply::error(&stream.config, &status));
    }
    PAUSE
}

/// The answer to a transcoded request that ends with trailers.
pub const REQUEST_TRAILERS: &str =
    "request trailers are not supported: a JSON request ends with its body";

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_headers(
    context_id: u32,
    _headers: u32,
    end_of_stream: u32,
) -> u32 {
    let context_id = ContextId(context_id);
    with_stream(context_id, CONTINUE, |stream| {
        transcode_callbacks::response_headers(stream, end_of_stream != 0)
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_body(
    context_id: u32,
    body_size: u32,
    end_of_stream: u32,
) -> u32 {
    let context_id = ContextId(context_id);
    with_stream(context_id, CONTINUE, |stream| {
        transcode_callbacks::response_body(stream, body_size as usize, end_of_stream != 0)
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _trailers: u32) -> u32 {
    let context_id = ContextId(context_id);
    with_stream(context_id, CONTINUE, transcode_callbacks::response_trailers)
}

/// ngx_wasm_module calls `proxy_on_done` and `proxy_on_log` at the end of
/// every request without checking that the module exports them (nginx
/// crashes on a missing one), so both exist; the filter needs neither.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_done(_context_id: u32) -> u32 {
    1
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_log(_context_id: u32) {}

/// The host lets calls outlive the HTTP stream: ours end with it.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    let context_id = ContextId(context_id);
    let removed = STREAMS.with(|s| s.borrow_mut().remove(&context_id));
    if let Some(cell) = removed {
        if let Ok(mut stream) = cell.try_borrow_mut() {
            if let Some(call) = stream.call.take() {
                callout_host::cancel(&call);
            }
            transcode_callbacks::ended_with_headers_held(&stream);
            stream.meter.drop_unended();
        }
    }
    ROOTS.with(|r| r.borrow_mut().remove(&context_id));
    fetch::forget(context_id);
    reflection::forget(context_id);
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_receive_initial_metadata(_root_id: u32, token: u32, _headers: u32) {
    let token = Token(token);
    callout_callbacks::with_call(token, |_, call, _| {
        callout_host::on_initial_metadata(call);
        None
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_receive(_root_id: u32, token: u32, size: u32) {
    let token = Token(token);
    if reflection::owns(token) {
        if let Some((root_id, config)) = reflection::on_receive(token, size as usize) {
            if install(root_id, config) == 1 {
                reflection::installed(root_id);
            }
        }
        return;
    }
    callout_callbacks::with_call(token, |stream, call, context_id| {
        // The message as it came, in its gRPC frame.
        stream.meter.received(1, size as usize + 5);
        let route = stream.route.as_ref()?;
        callout_host::on_message(&stream.config, route, call, context_id, size as usize)
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_receive_trailing_metadata(
    _root_id: u32,
    token: u32,
    _trailers: u32,
) {
    let token = Token(token);
    callout_callbacks::with_call(token, |_, call, _| {
        callout_host::on_trailing_metadata(call);
        None
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_close(_root_id: u32, token: u32, status_code: u32) {
    let token = Token(token);
    if reflection::owns(token) {
        if let Some((root_id, config)) = reflection::on_close(token, status_code) {
            if install(root_id, config) == 1 {
                reflection::installed(root_id);
            }
        }
        return;
    }
    callout_callbacks::with_call(token, |stream, call, _| {
        let route = stream.route.as_ref()?;
        Some(callout_host::on_close(
            &stream.config,
            route,
            call,
            status_code,
        ))
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_tick(root_id: u32) {
    let root_id = ContextId(root_id);
    fetch::on_tick(root_id);
    reflection::on_tick(root_id);
    callout_callbacks::tick();
    metrics::flush();
}

#[cfg(test)]
mod tests;

/// Every file root context `root_id` serves, as an encoded
/// `FileDescriptorSet`, options included: what the shim describes
/// (`grpc.services()` / `grpc.describe()`) with the core's `describe`,
/// natively, so that the module carries none of it.
#[cfg(feature = "compiler")]
pub fn descriptor_set(root_id: ContextId) -> Result<Vec<u8>, String> {
    let config = ROOTS
        .with(|r| r.borrow().get(&root_id).cloned())
        .ok_or("no configuration is loaded")?;
    Ok(config.registry.encode_descriptor_set())
}
