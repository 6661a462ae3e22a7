//! The filter's callout mode: the request is answered by a gRPC call the
//! filter makes itself (`proxy_grpc_call` / `proxy_grpc_stream`), and the
//! upstream never sees it.

use super::super::callout::host as callout_host;
use std::rc::Rc;

use crate::code::Code;
use crate::status::Status;

use super::super::callout::loopback_authority;
use super::super::config::{Callout, FilterConfig};
use super::super::host::{self, *};
use super::super::messages::{self, Route};
use super::super::reply::{self, Reply};
use super::answer::{answer, internal, reply_details, PAUSE};
use super::contexts::{with_stream, STREAMS};
use super::host_kind::host_kind;
use super::stream::{Origin, Phase, Stream};
use crate::contract::{BufferType, ContextId, LogLevel, Token};
use callout_host::Call;

const NO_GRPC_CALLS: &str = "callout: this host (ngx_wasm_module) has no gRPC calls (proxy_grpc_call); remove \"callout\" from the filter's configuration and put the filter in front of grpc_pass to transcode";

/// Runs `f` on the call of the stream that owns `token`; a reply it returns
/// ends the HTTP exchange.
pub(super) fn with_call(
    token: Token,
    f: impl FnOnce(&mut Stream, &mut Call, ContextId) -> Option<Reply>,
) {
    let Some(context_id) = callout_host::context_of(token) else {
        return;
    };
    with_stream(context_id, 0, |stream| {
        let Some(mut call) = stream.call.take() else {
            return 0;
        };
        if let Some(reply) = f(stream, &mut call, context_id) {
            reply_to_call(stream, context_id, &call, &reply);
        }
        stream.call = Some(call);
        0
    });
}

/// The final reply of a callout, sent from a root-context callback.
fn reply_to_call(stream: &mut Stream, context_id: ContextId, call: &Call, reply: &Reply) {
    if stream.phase.is_decided() {
        return;
    }
    stream.phase = Phase::Answered;
    let origin = if call.failed_here() {
        Origin::Filter
    } else {
        Origin::Upstream
    };
    stream.end(reply.code, origin);
    if let Err(s) = set_effective_context(context_id) {
        log(
            LogLevel::Warn,
            &format!(
                "grpc-wasm: the HTTP stream of a finished call is gone (host status {})",
                s.0
            ),
        );
        return;
    }
    let headers = callout_host::reply_headers(call, reply);
    let (_, body) = reply.content();
    if let Err(s) = send_reply_map(reply.http_status, reply_details(), body, &headers) {
        log(
            LogLevel::Error,
            &format!("grpc-wasm: the host refused a local reply (status {})", s.0),
        );
    }
}

/// Callout mode, request headers: prepare the call; start it now when there
/// is no body, or open the stream its body will feed. The request stays
/// here (headers paused; the host must deliver the body anyway, which
/// Envoy does with `allow_on_headers_stop_iteration`).
pub(super) fn start(
    stream: &mut Stream,
    context_id: ContextId,
    route: Route,
    headers: &HeaderMap,
    end_of_stream: bool,
) -> u32 {
    if !host_kind().has_grpc_calls() {
        let status = Status::new(Code::Unimplemented, NO_GRPC_CALLS);
        return answer(stream, &Reply::error(&stream.config, &status));
    }
    let call = callout_host::prepare(&stream.config, headers);
    start_prepared(stream, context_id, route, call, end_of_stream)
}

/// Transcoding mode, a request that cannot go on as itself (see
/// `calls_on_loopback` in `filter`): the filter makes the call itself,
/// back through the loopback cluster, whose chain gives it the filters
/// after this one and the route by its gRPC path, as a request with a body
/// gets them; a server stream comes back gathered. With no loopback
/// cluster the call would reach an upstream past those filters: refused.
pub(super) fn start_on_loopback(
    stream: &mut Stream,
    context_id: ContextId,
    route: Route,
    headers: &HeaderMap,
    end_of_stream: bool,
) -> u32 {
    let Some(cluster) = stream.config.loopback_cluster.as_deref() else {
        let status = Status::new(Code::Unimplemented, NO_LOOPBACK);
        return answer(stream, &Reply::error(&stream.config, &status));
    };
    let authority = match loopback_authority(headers.get(":authority").unwrap_or_default()) {
        Ok(authority) => authority,
        Err(status) => return answer(stream, &Reply::error(&stream.config, &status)),
    };
    let path = headers.get(":path").unwrap_or_default();
    let callout = Callout::to_loopback(cluster, authority.as_bytes(), path);
    let call = callout_host::prepare_with(&callout, headers);
    start_prepared(stream, context_id, route, call, end_of_stream)
}

/// Why a request that needs the loopback is refused without one; the
/// same words are logged once when the configuration is installed.
pub(super) const NO_LOOPBACK: &str = "this request has no body to carry its message (or its answer is a google.api.HttpBody), so the filter would call the method itself, and without \"loopback_cluster\" that call would skip the filters after grpc-wasm and the route: give the cluster of an internal listener with this filter chain (grpc-wasm-config writes one)";

fn start_prepared(
    stream: &mut Stream,
    context_id: ContextId,
    mut route: Route,
    call: Result<Call, Status>,
    end_of_stream: bool,
) -> u32 {
    let mut call = match call {
        Ok(call) => call,
        Err(status) => return answer(stream, &Reply::error(&stream.config, &status)),
    };
    route.json = call.json.take();
    if route.method.streaming() != crate::StreamingKind::Unary || callout_host::unary_as_stream() {
        callout_host::add_stream_deadline(&mut call);
    }
    let started = if messages::streams_requests(&route) {
        callout_host::open_stream(&stream.config, &route, &mut call, context_id).and_then(|()| {
            if end_of_stream {
                let meter = &mut stream.meter;
                callout_host::send_streamed(&stream.config, &route, &mut call, b"", true, meter)
                    .map(|_| ())
            } else {
                Ok(())
            }
        })
    } else if end_of_stream {
        let meter = &mut stream.meter;
        callout_host::start_with_body(&stream.config, &route, &mut call, context_id, b"", meter)
    } else {
        Ok(())
    };
    stream.route = Some(Rc::new(route));
    stream.call = Some(call);
    match started {
        Ok(()) => PAUSE,
        Err(reply) => fail_call(stream, &reply),
    }
}

/// Callout mode, request body: a streaming body feeds the stream as its
/// messages complete; any other body waits for its end, then starts the call.
pub(super) fn request_body(
    stream: &mut Stream,
    context_id: ContextId,
    size: usize,
    end_of_stream: bool,
) -> u32 {
    // Answered already (the deadline passed while the body came): a call
    // started now would run for nobody.
    if stream.phase.is_decided() {
        return PAUSE;
    }
    let (Some(route), Some(mut call)) = (stream.route.clone(), stream.call.take()) else {
        return PAUSE;
    };
    let result = if size > stream.config.max_request_bytes {
        Err(reply::too_large(
            &stream.config,
            "request",
            size,
            stream.config.max_request_bytes,
        ))
    } else if messages::streams_requests(&route) {
        read_body(&stream.config, size).and_then(|body| {
            let used = callout_host::send_streamed(
                &stream.config,
                &route,
                &mut call,
                &body,
                end_of_stream,
                &mut stream.meter,
            )?;
            // Sent messages leave the host's buffer (Envoy drains `used` bytes).
            let _ = set_buffer(BufferType::HttpRequestBody, used, b"");
            Ok(())
        })
    } else if end_of_stream {
        read_body(&stream.config, size).and_then(|body| {
            let meter = &mut stream.meter;
            callout_host::start_with_body(
                &stream.config,
                &route,
                &mut call,
                context_id,
                &body,
                meter,
            )
        })
    } else {
        Ok(())
    };
    stream.call = Some(call);
    match result {
        Ok(()) => PAUSE,
        Err(reply) => fail_call(stream, &reply),
    }
}

fn read_body(config: &FilterConfig, size: usize) -> Result<Vec<u8>, Reply> {
    host::buffer(BufferType::HttpRequestBody, 0, size).map_err(|s| {
        internal(
            config,
            &format!("cannot read the request body (host status {})", s.0),
        )
    })
}

/// A callout that failed on the request side: cancel what started, answer.
/// Ends the call with `reply`, and holds the request either way: when the
/// host refuses the reply, letting it on would send the client's JSON to
/// the route's own upstream.
fn fail_call(stream: &mut Stream, reply: &Reply) -> u32 {
    if let Some(call) = &stream.call {
        callout_host::cancel(call);
    }
    answer(stream, reply);
    PAUSE
}

/// The calls' deadlines, checked at each tick.
pub(super) fn tick() {
    let contexts: Vec<ContextId> = STREAMS.with(|s| {
        s.borrow()
            .iter()
            .filter(|(_, st)| st.try_borrow().is_ok_and(|st| st.call.is_some()))
            .map(|(id, _)| *id)
            .collect()
    });
    for context_id in contexts {
        with_stream(context_id, 0, |stream| {
            if stream.phase.is_decided() {
                return 0;
            }
            let Some(mut call) = stream.call.take() else {
                return 0;
            };
            if let Some(reply) = callout_host::expire(&stream.config, &mut call) {
                reply_to_call(stream, context_id, &call, &reply);
            }
            stream.call = Some(call);
            0
        });
    }
}
