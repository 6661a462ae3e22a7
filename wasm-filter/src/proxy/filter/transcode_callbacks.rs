//! Transcoding on the proxy's own route: the JSON request becomes a gRPC
//! request for the upstream, and its gRPC response becomes JSON.
//!
//! Request: JSON for a known method is held until its end, then replaced by
//! one gRPC frame (headers: `content-type: application/grpc`, `te:
//! trailers`, no `content-length`; a path that the filter rewrites is kept
//! in `x-grpc-wasm-original-path`). Response: a trailers-only status (the
//! usual form of a gRPC error) becomes a JSON error with the HTTP status
//! mapped from `grpc-status`; otherwise the gRPC body is held until the
//! trailers and replaced by JSON. Envoy holds the headers of one answer
//! until then too, so its HTTP status is the answer's; ngx_wasm_module
//! sends them on at once, and there (as in a stream) a status that only
//! arrives after the headers changes the body (a `google.rpc.Status`
//! object), not the HTTP status.

use std::rc::Rc;

use crate::code::Code;
use crate::framing::{self, Compression, FrameDecoder, FrameError};
use crate::limits::LARGE_MESSAGE_BYTES;
use crate::status::Status;

use super::super::host::{self, *};
use super::super::messages::{self, Route};
use super::super::metrics::frames_in;
use super::super::reply::{self, Reply};
use super::super::transcode;
use super::answer::{
    answer, answer_from, answer_response, internal, make_headers_the_replys, CONTINUE, PAUSE,
};
use super::host_kind::host_kind;
use super::stream::{Origin, Phase, Stream};
use crate::contract::{BufferType, LogLevel, MapType, ORIGINAL_PATH_HEADER};

/// Request headers of a method to transcode here: the request becomes a
/// gRPC request, whose body the body callback writes. The request line
/// is the one the dispatcher read from `headers`.
pub(super) fn request_headers(
    stream: &mut Stream,
    route: Route,
    headers: &HeaderMap,
    (http_method, path): (&str, &str),
    end_of_stream: bool,
) -> u32 {
    let bodiless = end_of_stream || has_no_body(headers);
    if bodiless && route.binding.is_some() && host_kind().sets_request_body_at_headers() {
        return body_from_the_request_line(stream, route, headers, path);
    }
    if bodiless {
        // Envoy gives a filter no way to add a body to a request that has
        // none: the dispatcher makes such a request a call of its own to
        // the route's cluster (see `callout_callbacks::start_on_route`).
        let status = if route.binding.is_some() {
            Status::new(Code::Unimplemented, format!("{http_method} {path} has no body and this host lets no filter add one: bodiless bindings need the filter's callout mode (\"callout\" in the configuration)"))
        } else {
            Status::new(
                Code::InvalidArgument,
                "a JSON request body is required (use {} for an empty message)",
            )
        };
        return answer(stream, &Reply::error(&stream.config, &status));
    }
    if host_kind().forwards_replaced_headers() && headers.get(ORIGINAL_PATH_HEADER).is_some() {
        // nginx forwards every copy of a header, those that
        // ngx_wasm_module removed or replaced included: the
        // filter's own header cannot be made true there.
        let status = Status::new(
            Code::InvalidArgument,
            format!("{ORIGINAL_PATH_HEADER} is set by the filter, not by clients"),
        );
        return answer(stream, &Reply::error(&stream.config, &status));
    }
    if let Err(reply) = messages::check_request_line(&stream.config, &route) {
        return answer(stream, &reply);
    }
    if rewrite_request_headers(headers, path, route.method.path()).is_err() {
        log(
            LogLevel::Warn,
            "grpc-wasm: the host refused a request header change",
        );
    }
    stream.route = Some(Rc::new(route));
    // Pausing headers would hold the body back from this filter
    // too (hosts map it to "stop all"); the body callback holds
    // the request instead.
    CONTINUE
}

/// A bodiless request for a binding, where the host lets a filter give a
/// request a body from its headers callback (ngx_wasm_module): the gRPC
/// request is built from the path and query alone and becomes the body.
fn body_from_the_request_line(
    stream: &mut Stream,
    route: Route,
    headers: &HeaderMap,
    path: &str,
) -> u32 {
    let frame = match transcode::encode_request(&stream.config, &route, b"") {
        Ok(frame) => frame,
        Err(reply) => return answer(stream, &reply),
    };
    if let Err(s) = set_buffer(BufferType::HttpRequestBody, 0, &frame) {
        let reply = internal(
            &stream.config,
            &format!("cannot give the request a body (host status {})", s.0),
        );
        return answer(stream, &reply);
    }
    let rewritten = rewrite_request_headers(headers, path, route.method.path()).and_then(|()| {
        set_header(
            MapType::HttpRequestHeaders,
            "content-length",
            &frame.len().to_string(),
        )
    });
    if rewritten.is_err() {
        log(
            LogLevel::Warn,
            "grpc-wasm: the host refused a request header change",
        );
    }
    stream.route = Some(Rc::new(route));
    stream.request_written = true;
    stream.meter.sent(frames_in(&frame), frame.len());
    CONTINUE
}

/// The JSON request body, held to its end, then one gRPC frame.
pub(super) fn request_body(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    // Answered already: a host that calls again must not get a second
    // reply, nor the body a gRPC frame.
    if stream.phase.is_decided() {
        return PAUSE;
    }
    // The gRPC request the headers callback wrote, which the host may
    // show again as the body.
    if stream.request_written {
        return CONTINUE;
    }
    let Some(route) = stream.route.clone() else {
        return CONTINUE;
    };
    if size > stream.config.max_request_bytes {
        let reply = reply::too_large(
            &stream.config,
            "request",
            size,
            stream.config.max_request_bytes,
        );
        return refuse(stream, &reply);
    }
    if !end_of_stream {
        return PAUSE;
    }
    let body = match host::buffer(BufferType::HttpRequestBody, 0, size) {
        Ok(body) if body.is_empty() && size > 0 => {
            // The host announced a body it cannot show: nginx wrote it
            // to a file.
            let reply = reply::host_buffer_full(&stream.config, reply::NGINX_REQUEST_BUFFER);
            return refuse(stream, &reply);
        }
        Ok(body) => body,
        Err(s) => {
            let reply = internal(
                &stream.config,
                &format!("cannot read the request body (host status {})", s.0),
            );
            return refuse(stream, &reply);
        }
    };
    match transcode::encode_request(&stream.config, &route, &body) {
        // Some hosts cut the new body to `size`: pass the larger length.
        Ok(frame) => match set_buffer(BufferType::HttpRequestBody, size.max(frame.len()), &frame) {
            Ok(()) => {
                stream.meter.sent(frames_in(&frame), frame.len());
                if host_kind().keeps_old_content_length() {
                    set_content_length(frame.len());
                }
                CONTINUE
            }
            Err(s) => {
                let reply = internal(
                    &stream.config,
                    &format!("cannot replace the request body (host status {})", s.0),
                );
                refuse(stream, &reply)
            }
        },
        Err(reply) => refuse(stream, &reply),
    }
}

fn set_content_length(length: usize) {
    let length = length.to_string();
    if set_header(MapType::HttpRequestHeaders, "content-length", &length).is_err() {
        log(
            LogLevel::Warn,
            "grpc-wasm: the host refused the new content-length",
        );
    }
}

/// Answers a request whose headers were already rewritten for gRPC with
/// `reply`, and holds its body either way: when the host refuses the
/// reply, letting the body on would send the client's own bytes (unread,
/// unchecked, over the limit) upstream as the gRPC request. The host's
/// own timeouts then end the exchange.
fn refuse(stream: &mut Stream, reply: &Reply) -> u32 {
    answer(stream, reply);
    PAUSE
}

pub(super) fn response_headers(stream: &mut Stream, end_of_stream: bool) -> u32 {
    let Some(route) = stream.route.clone() else {
        return CONTINUE;
    };
    if stream.phase.is_decided() {
        return CONTINUE;
    }
    let headers = HeaderMap::read(MapType::HttpResponseHeaders);
    let http_status = headers
        .get(":status")
        .and_then(|s| s.parse::<u16>().ok())
        .unwrap_or(0);
    let is_grpc = headers
        .get("content-type")
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    stream.encoding = headers
        .get("grpc-encoding")
        .and_then(Compression::from_header)
        .unwrap_or(Compression::Identity);
    if !is_grpc && http_status == 413 && headers.get("grpc-status").is_none() {
        let reply = reply::host_buffer_full(&stream.config, reply::ENVOY_REQUEST_BUFFER);
        return answer_response(stream, &reply, &headers, Origin::Filter);
    }
    if headers.get("grpc-status").is_some() || !is_grpc || end_of_stream {
        // Trailers-only (the status is in these headers), or not gRPC at all.
        let status = status_in(&headers).unwrap_or_else(|| non_grpc_status(http_status));
        let reply =
            transcode::decode_response(&stream.config, &route, &[], Compression::Identity, &status);
        return answer_response(stream, &reply, &headers, Origin::Upstream);
    }
    let streams = messages::streams_response(&stream.config, &route);
    if streams {
        stream.phase = Phase::Streaming(FrameDecoder::new(
            stream.config.max_response_bytes,
            stream.encoding,
        ));
    }
    let headers = if host_kind().holds_response_headers() {
        // One answer's headers wait for it, as Envoy's own transcoder holds
        // them, and a stream's for its first message: what the body or the
        // trailers decide before then (a message over the limit, an error
        // after the upstream's headers) is the HTTP status, never a 200
        // carrying an error. After a stream's first message, an error can
        // only end its body. A stream whose headers the VM's budget has no
        // room for fails alone, as one refused room for its body does.
        match stream.hold_headers(headers) {
            Ok(()) => return PAUSE,
            Err((headers, over)) => {
                let status = reply::over_budget_status(over.others, over.budget);
                let reply = Reply::error(&stream.config, &status);
                return answer_response(stream, &reply, &headers, Origin::Filter);
            }
        }
    } else {
        headers
    };
    if streams {
        let content_type = messages::stream_content_type(&stream.config);
        let _ = headers.edit(
            MapType::HttpResponseHeaders,
            &[("content-type", content_type)],
            &["content-length"],
        );
        return CONTINUE;
    }
    // ngx_wasm_module sends the headers on whatever the filter answers.
    let _ = headers.edit(
        MapType::HttpResponseHeaders,
        &[("content-type", "application/json")],
        &["content-length"],
    );
    CONTINUE
}

/// Says once per VM that a stream ended with its response headers held and
/// nothing after them: what Envoy does without
/// `allow_on_headers_stop_iteration`, which the filter cannot read.
pub(super) fn ended_with_headers_held(stream: &Stream) {
    thread_local! {
        static SAID: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    // A stream's client may leave before its first message: one answer's
    // only says it.
    if stream.held_headers.is_none()
        || stream.response_went_on
        || matches!(stream.phase, Phase::Streaming(_))
        || SAID.with(|s| s.replace(true))
    {
        return;
    }
    log(
        LogLevel::Warn,
        "grpc-wasm: a response ended with its headers held and no body or trailers passed to the filter; \
         if every transcoded response stalls, Envoy lacks allow_on_headers_stop_iteration: true in the \
         filter's configuration (docs/envoy.md)",
    );
}

/// Lets held response headers go, made `reply`'s: an answer keeps its
/// status and takes the reply's content type; an error takes the reply's
/// status and gRPC status too.
fn release_headers(stream: &mut Stream, reply: &Reply) {
    let Some(headers) = stream.held_headers.take() else {
        return;
    };
    if reply.code != Code::Ok {
        make_headers_the_replys(&headers, reply);
        return;
    }
    let (content_type, _) = reply.content();
    answer_headers(&headers, content_type);
}

/// Lets held response headers of a stream go: its messages follow.
fn release_stream_headers(stream: &mut Stream) {
    if let Some(headers) = stream.held_headers.take() {
        answer_headers(&headers, messages::stream_content_type(&stream.config));
    }
}

/// The upstream's headers for the filter's answer of `content_type`.
fn answer_headers(headers: &HeaderMap, content_type: &str) {
    let _ = headers.edit(
        MapType::HttpResponseHeaders,
        &[("content-type", content_type)],
        &["content-length"],
    );
}

pub(super) fn response_body(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    if stream.route.is_none() {
        return CONTINUE;
    }
    stream.response_went_on = true;
    let action = response_chunk(stream, size, end_of_stream);
    stream.settle_held();
    action
}

fn response_chunk(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    match &mut stream.phase {
        Phase::ReplyInFirstChunk(body) => {
            let body = std::mem::take(body);
            stream.phase = Phase::Dropping;
            let _ = replace_response_chunk(size, &body, end_of_stream);
            CONTINUE
        }
        Phase::Dropping | Phase::Failed(_) => {
            let _ = replace_response_chunk(size, b"", end_of_stream);
            CONTINUE
        }
        Phase::Answered => CONTINUE,
        Phase::Sent => data_after_the_message(stream, size, end_of_stream),
        Phase::Streaming(_) => stream_chunk(stream, size, end_of_stream),
        Phase::Open | Phase::Holding(_) | Phase::Carrying(_) => {
            one_reply_chunk(stream, size, end_of_stream)
        }
    }
}

/// A chunk of a response that becomes one JSON reply at its end.
fn one_reply_chunk(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    // ngx_wasm_module holds a body once, in buffers of fixed size: a
    // second chunk before the end means they are full (and a second
    // pause would be ignored, letting gRPC bytes through).
    let fixed_buffers = host_kind().holds_body_in_fixed_buffers();
    let host_gave_up = fixed_buffers && !end_of_stream && matches!(stream.phase, Phase::Holding(_));
    let carried = match &stream.phase {
        Phase::Carrying(held) => held.len(),
        _ => 0,
    };
    let total = carried + size;
    if host_gave_up {
        let status = reply::host_response_buffer_full(&stream.config);
        fail_in_body(stream, size, status, end_of_stream);
        return CONTINUE;
    }
    if total > stream.config.max_response_bytes {
        let limit = stream.config.max_response_bytes;
        let status = reply::too_large_status("response", total, limit);
        fail_too_large(stream, size, status, end_of_stream);
        return CONTINUE;
    }
    if !end_of_stream {
        if matches!(stream.phase, Phase::Carrying(_)) {
            return carry_large_response(stream, size);
        }
        let mut seen = None;
        if !fixed_buffers && stream.route.as_deref().is_some_and(answers_one_message) {
            let first_chunk = matches!(stream.phase, Phase::Open);
            let head = read_head(size, first_chunk);
            if first_frame_len(&head).is_some_and(|len| len > LARGE_MESSAGE_BYTES) {
                return carry_large_response(stream, size);
            }
            seen = (first_chunk && head.len() == size).then_some(head);
            // A copy, kept only when the VM's budget has room for it: the
            // host holds the body anyway, and trailers can read it again.
            if let Some(copy) = &seen {
                if stream.hold(copy.capacity()).is_err() {
                    seen = None;
                }
            }
        }
        stream.phase = Phase::Holding(seen);
        return PAUSE;
    }
    // A gRPC body that ends without trailers: the status is missing, or,
    // on a host that never shows trailers, unknowable: the messages
    // stand (an error sent in trailers after data is lost there).
    let body = held_response(stream, size);
    finish(stream, body, status_at_end_without_trailers())
}

/// The status of a response whose body ended without trailers: on a host
/// that calls no trailers callback, the upstream's trailers as the host
/// keeps them elsewhere, if it does.
fn status_at_end_without_trailers() -> Status {
    if host_kind().calls_trailers() {
        return Status::missing_grpc_status("the upstream's response");
    }
    if !host_kind().keeps_upstream_trailers_in_variables() {
        return Status::ok();
    }
    let trailer = |name| host::property(&["ngx", name]);
    let status = trailer("upstream_trailer_grpc_status");
    let message = trailer("upstream_trailer_grpc_message");
    let details = trailer("upstream_trailer_grpc_status_details_bin");
    Status::from_header_values(status.as_deref(), message.as_deref(), details.as_deref())
        // No trailers at all: the messages stand.
        .unwrap_or_else(Status::ok)
}

pub(super) fn response_trailers(stream: &mut Stream) -> u32 {
    if stream.route.is_none() {
        return CONTINUE;
    }
    stream.response_went_on = true;
    let action = trailers_of_response(stream);
    stream.settle_held();
    action
}

fn trailers_of_response(stream: &mut Stream) -> u32 {
    if let Phase::Failed(status) = &stream.phase {
        let trailers = HeaderMap::read(MapType::HttpResponseTrailers);
        set_status_trailers(&trailers, status);
        stream.phase = Phase::Answered;
        return CONTINUE;
    }
    if stream.phase.is_decided() {
        return CONTINUE;
    }
    let trailers = HeaderMap::read(MapType::HttpResponseTrailers);
    let status = status_in(&trailers)
        .unwrap_or_else(|| Status::missing_grpc_status("the upstream's trailers"));
    // Headers held and no message (none at all, or not one of a stream's):
    // the host has no body to write the answer into (Envoy), so the status
    // is the whole answer, a local reply as for a trailers-only status.
    if matches!(stream.phase, Phase::Open | Phase::Streaming(_)) {
        if let Some(held) = stream.held_headers.take() {
            let reply = match stream.route.clone() {
                Some(route) => transcode::decode_response(
                    &stream.config,
                    &route,
                    &[],
                    Compression::Identity,
                    &status,
                ),
                None => Reply::error(&stream.config, &status),
            };
            return answer_held(stream, &held, &reply);
        }
    }
    match &stream.phase {
        Phase::Streaming(_) => end_stream(stream, &trailers, &status),
        Phase::Carrying(held) if !held.is_empty() => cut_large_response(stream, &trailers),
        // The whole buffered body: the host stops at its end. The trailers
        // stay as the upstream sent them, as with Envoy's own transcoder
        // (HTTP/1.1 clients never see them); changing them would cost a
        // host call per request.
        _ => {
            let body = match stream.phase.take_seen() {
                Some(seen) => Ok(seen),
                None => held_response(stream, u32::MAX as usize),
            };
            finish(stream, body, status)
        }
    }
}

/// Answers with `reply` while the upstream's headers are held: a local
/// reply, whose headers are still the first to leave. A host that refuses
/// it sends the held headers, made the reply's, so that its status shows.
fn answer_held(stream: &mut Stream, held: &HeaderMap, reply: &Reply) -> u32 {
    let action = answer_from(stream, reply, Origin::Upstream);
    if action != PAUSE {
        make_headers_the_replys(held, reply);
        stream.phase = Phase::Answered;
        stream.end(reply.code, Origin::Upstream);
    }
    action
}

/// ngx_wasm_module always says that a body follows the request headers,
/// and then never calls the body callback when there is none: the headers
/// must tell. In HTTP/1.x a request without Content-Length or
/// Transfer-Encoding has no body; in HTTP/2 one without Content-Length may
/// still have one, unless its method is one that carries none by custom.
fn has_no_body(headers: &HeaderMap) -> bool {
    if !host_kind().announces_absent_bodies() {
        return false;
    }
    match headers.get("content-length") {
        Some(length) => length.trim() == "0",
        None if headers.get("transfer-encoding").is_some() => false,
        None => {
            let method = headers.get(":method").unwrap_or_default();
            matches!(method, "GET" | "HEAD" | "DELETE" | "OPTIONS")
                || host::property(&["request", "protocol"])
                    .is_some_and(|p| p.starts_with(b"HTTP/1"))
        }
    }
}

/// Turns the JSON request's headers into a gRPC request's. A header that
/// already has its value is left alone: each change is a host call, and
/// on Envoy also a cleared route cache.
fn rewrite_request_headers(
    headers: &HeaderMap,
    original_path: &str,
    grpc_path: &str,
) -> Result<(), HostStatus> {
    // nginx's grpc_pass would send a kept query string on.
    let cleared;
    let grpc_path = if host_kind().keeps_query_of_new_path() && original_path.contains('?') {
        cleared = format!("{grpc_path}?");
        cleared.as_str()
    } else {
        grpc_path
    };
    let set = [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        // The filter inflates what it transcodes, within its limits.
        ("grpc-accept-encoding", framing::ACCEPT_ENCODING),
        (":method", "POST"),
        (":path", grpc_path),
        // Only when it says something that `:path` no longer does.
        (ORIGINAL_PATH_HEADER, original_path),
    ];
    // Only the filter says what the original path was: a client's own
    // header would pass for the filter's word.
    let mut remove = Vec::with_capacity(2);
    // ngx_wasm_module takes a removed Content-Length out of the header list
    // but nginx still sends its value: there the body callback sets the new
    // length instead.
    if !host_kind().keeps_old_content_length() {
        remove.push("content-length");
    }
    let set = if original_path == grpc_path {
        remove.push(ORIGINAL_PATH_HEADER);
        &set[..5]
    } else {
        &set[..]
    };
    headers.edit(MapType::HttpRequestHeaders, set, &remove)
}

/// A streamed response: each chunk leaves as the messages it completes.
fn stream_chunk(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    let (Some(route), Phase::Streaming(decoder)) = (stream.route.clone(), &mut stream.phase) else {
        return CONTINUE;
    };
    let chunk = host::buffer(BufferType::HttpResponseBody, 0, size).unwrap_or_default();
    let before = decoder.returned();
    // The incomplete frames a stream holds count against the VM's budget
    // before they are taken (the frame limit bounds one stream only), with
    // the headers the stream may still hold (fields apart: `decoder`
    // borrows the phase).
    let held_headers = stream
        .held_headers
        .as_ref()
        .map_or(0, HeaderMap::held_bytes);
    let holding = decoder
        .buffered()
        .saturating_add(chunk.len())
        .saturating_add(held_headers);
    let (mut piece, error) = match stream
        .held
        .set(holding, stream.config.max_held_response_bytes)
    {
        Ok(()) => messages::stream_piece(&stream.config, &route, decoder, &chunk),
        Err(over) => (
            String::new(),
            Some(reply::over_budget_status(over.others, over.budget)),
        ),
    };
    let messages = decoder.returned() - before;
    let none_yet = decoder.returned() == 0;
    stream.meter.received(messages, chunk.len());
    if stream.held_headers.is_some() {
        let end = error
            .clone()
            .or_else(|| end_of_stream.then(status_at_end_without_trailers));
        match end {
            // Nothing has left: the failure is the whole answer.
            Some(status) if none_yet && !status.is_ok() => {
                fail_in_body(stream, size, status, end_of_stream);
                return CONTINUE;
            }
            // Still no message: the headers wait on.
            None if none_yet => {
                let _ = replace_response_chunk(size, b"", false);
                return PAUSE;
            }
            _ => release_stream_headers(stream),
        }
    }
    if let Some(status) = error {
        // What follows cannot be read: the error ends the stream, and the
        // upstream's own status (in trailers) gives way to it.
        piece.push_str(&messages::stream_end(&stream.config, &status));
        stream.end(status.code, Origin::Filter);
        stream.phase = Phase::Failed(status);
    } else if end_of_stream {
        let status = status_at_end_without_trailers();
        piece.push_str(&messages::stream_end(&stream.config, &status));
        stream.end(status.code, Origin::Upstream);
        stream.phase = Phase::Answered;
    }
    let _ = replace_response_chunk(size, piece.as_bytes(), end_of_stream);
    CONTINUE
}

/// Replaces a response chunk with what the filter made of it.
/// ngx_wasm_module drops a chunk replaced by nothing, together with its
/// end-of-body mark, and the response never ends: an empty chunk is left
/// alone, and a last one that must lose its bytes keeps a blank line,
/// which every body format the filter writes allows.
fn replace_response_chunk(size: usize, text: &[u8], end_of_stream: bool) -> Result<(), HostStatus> {
    let text = match text {
        [] if size == 0 => return Ok(()),
        [] if end_of_stream && host_kind().drops_emptied_last_chunk() => b"\n",
        text => text,
    };
    // Some hosts cut the new body to the size argument: pass the larger.
    set_buffer(BufferType::HttpResponseBody, size.max(text.len()), text)
}

/// The gRPC status trailers are the filter's business, not the client's.
fn remove_status(trailers: &HeaderMap) {
    let _ = trailers.edit(
        MapType::HttpResponseTrailers,
        &[],
        &["grpc-status", "grpc-message", "grpc-status-details-bin"],
    );
}

/// The length of the first gRPC frame in `body`, once its header is there.
fn first_frame_len(body: &[u8]) -> Option<u64> {
    match body.get(1..5) {
        Some(&[a, b, c, d]) => Some(5 + u64::from(u32::from_be_bytes([a, b, c, d]))),
        _ => None,
    }
}

/// The start of the response body, enough for its first frame's header.
/// A first chunk that may hold a whole small message is read whole, in the
/// one host call the header costs anyway (a host call is some thousands of
/// Envoy's instructions): trailers that follow it then find it read.
fn read_head(size: usize, first_chunk: bool) -> Vec<u8> {
    let len = if first_chunk && size as u64 <= LARGE_MESSAGE_BYTES {
        size
    } else {
        size.min(5)
    };
    host::buffer(BufferType::HttpResponseBody, 0, len).unwrap_or_default()
}

/// Whether the response is one message (whose JSON is the whole body);
/// an array of streamed messages is held whole by the host.
fn answers_one_message(route: &Route) -> bool {
    matches!(
        route.method.streaming(),
        crate::StreamingKind::Unary | crate::StreamingKind::ClientStreaming
    )
}

/// Envoy holds a paused body in its connection buffer (1 MiB by default),
/// and a body written there at the end that outgrows it resets the stream
/// after its 200: a large unary message is taken out of each chunk into
/// the module instead (bounded by max_response_bytes, and with the other
/// streams by max_held_response_bytes), nothing is paused, and its JSON
/// leaves in the chunk that completes it. A status sent after it reaches
/// HTTP/2 clients as trailers only.
fn carry_large_response(stream: &mut Stream, size: usize) -> u32 {
    let chunk = match host::buffer(BufferType::HttpResponseBody, 0, size) {
        Ok(chunk) => chunk,
        Err(s) => return cannot(stream, size, "read", s),
    };
    let mut held = stream.phase.take_carried();
    // The first chunk carried has the frame's header (that is how it was
    // found large), and every later one follows it.
    let head = if held.is_empty() { &chunk } else { &held };
    let declared = first_frame_len(head).unwrap_or(0);
    let limit = stream.config.max_response_bytes;
    if declared.saturating_sub(5) > limit as u64 {
        // Refused by its header, before its bytes are held.
        let message = usize::try_from(declared.saturating_sub(5)).unwrap_or(usize::MAX);
        let status = Status::from(FrameError::MessageTooLarge {
            size: message,
            limit,
        });
        fail_too_large(stream, size, status, false);
        return CONTINUE;
    }
    if let Err(status) = make_room(stream, &mut held, chunk.len(), declared) {
        fail_in_body(stream, size, status, false);
        return CONTINUE;
    }
    if let Err(s) = set_buffer(BufferType::HttpResponseBody, size, b"") {
        return cannot(stream, size, "take", s);
    }
    // Its header says it fits: the headers leave now. Held until its JSON,
    // they would make Envoy buffer that JSON whole behind them, and past
    // the connection's buffer limit Envoy answers 500 itself.
    if stream.held_headers.is_some() {
        release_headers(stream, &Reply::ok(String::new()));
    }
    held.extend_from_slice(&chunk);
    if (held.len() as u64) < declared {
        stream.phase = Phase::Carrying(held);
        return CONTINUE;
    }
    // Bytes after the message in this chunk are decoded with it, and
    // answered as the held path answers them (INTERNAL).
    let action = finish(stream, Ok(held), Status::ok());
    if matches!(stream.phase, Phase::Answered) {
        stream.phase = Phase::Sent;
    }
    action
}

/// Grows `held` for `more` bytes of a message `declared` long, within the
/// VM's budget: doubling (so that a message of many chunks is copied a few
/// times, not once per chunk) but never past the frame, and never reserved
/// ahead on the peer's word alone: a header declaring 4 MiB costs what has
/// arrived, not 4 MiB.
fn make_room(
    stream: &mut Stream,
    held: &mut Vec<u8>,
    more: usize,
    declared: u64,
) -> Result<(), Status> {
    let wanted = held.len().saturating_add(more);
    if wanted <= held.capacity() {
        return Ok(());
    }
    let frame = usize::try_from(declared).unwrap_or(usize::MAX);
    let capacity = wanted.max(held.capacity().saturating_mul(2).min(frame));
    stream
        .hold(capacity)
        .map_err(|over| reply::over_budget_status(over.others, over.budget))?;
    held.reserve_exact(capacity - held.len());
    Ok(())
}

/// A host call on the response body failed after the headers had left:
/// the chunk becomes the INTERNAL error, as any failure there does (a
/// local reply now would be refused, and the chunk's gRPC bytes would go
/// to the client).
fn cannot(stream: &mut Stream, size: usize, what: &str, s: HostStatus) -> u32 {
    let status = Status::new(
        Code::Internal,
        format!("cannot {what} the response body (host status {})", s.0),
    );
    fail_in_body(stream, size, status, false);
    CONTINUE
}

/// Data after the one message whose JSON has left: the small path answers
/// a body of two messages with this, and so does the carried one, in the
/// trailers (the body has ended its JSON).
fn data_after_the_message(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    if size == 0 {
        return CONTINUE;
    }
    let status = Status::new(Code::Internal, "expected one response message, got 2");
    log(
        LogLevel::Warn,
        &format!("grpc-wasm: {} bytes after the response message", size),
    );
    let _ = replace_response_chunk(size, b"", end_of_stream);
    stream.end(status.code, Origin::Filter);
    stream.phase = Phase::Failed(status);
    CONTINUE
}

/// Trailers came before the carried message was complete. Its chunks were
/// passed on, so the host has no body left to write the error in: the
/// trailers carry it (HTTP/2 clients see it; others see a short body).
fn cut_large_response(stream: &mut Stream, trailers: &HeaderMap) -> u32 {
    let held = stream.phase.take_carried();
    let declared = first_frame_len(&held).unwrap_or(0);
    let message = format!(
        "the upstream ended the response within a message ({} of {declared} bytes)",
        held.len()
    );
    stream.phase = Phase::Answered;
    stream.end(Code::Internal, Origin::Filter);
    log(LogLevel::Warn, &format!("grpc-wasm: {message}"));
    let status = Status::new(Code::Internal, message);
    if stream.held_headers.is_some() {
        // Nothing has left: the error is the whole answer.
        let reply = Reply::error(&stream.config, &status);
        release_headers(stream, &reply);
        let _ = set_buffer(BufferType::HttpResponseBody, 0, reply.body.as_bytes());
    }
    set_status_trailers(trailers, &status);
    CONTINUE
}

/// The error replaces the chunk, what follows is dropped, and trailers
/// that come later say the same; held headers leave with its status.
fn fail_in_body(stream: &mut Stream, size: usize, status: Status, end_of_stream: bool) {
    let reply = Reply::error(&stream.config, &status);
    fail_with(stream, size, &reply, status, end_of_stream);
}

/// [`fail_in_body`] for a response over its limit: 413, where the headers
/// can still say it.
fn fail_too_large(stream: &mut Stream, size: usize, status: Status, end_of_stream: bool) {
    let reply = reply::response_too_large(&stream.config, &status);
    fail_with(stream, size, &reply, status, end_of_stream);
}

fn fail_with(stream: &mut Stream, size: usize, reply: &Reply, status: Status, end_of_stream: bool) {
    release_headers(stream, reply);
    let _ = replace_response_chunk(size, reply.body.as_bytes(), end_of_stream);
    stream.end(status.code, Origin::Filter);
    stream.phase = Phase::Failed(status);
}

/// Makes the response's trailers carry the filter's status rather than the
/// upstream's: HTTP/2 clients read it there.
fn set_status_trailers(trailers: &HeaderMap, status: &Status) {
    let code = status.code.as_i32().to_string();
    let encoded = status.encoded_message();
    let set = [
        ("grpc-status", code.as_str()),
        ("grpc-message", encoded.as_str()),
    ];
    if trailers
        .edit(
            MapType::HttpResponseTrailers,
            &set,
            &["grpc-status-details-bin"],
        )
        .is_err()
    {
        log(
            LogLevel::Warn,
            "grpc-wasm: the host refused a trailer change",
        );
    }
}

/// The whole response body: what the module carries, then what the host holds.
fn held_response(stream: &mut Stream, size: usize) -> Result<Vec<u8>, HostStatus> {
    let rest = host::buffer(BufferType::HttpResponseBody, 0, size)?;
    let mut body = stream.phase.take_carried();
    if body.is_empty() {
        return Ok(rest);
    }
    body.extend_from_slice(&rest);
    Ok(body)
}

/// The status of a streamed response. Hosts that let a filter add body at
/// the trailers get the error as the last line; elsewhere (Envoy) the
/// status stays in the HTTP trailers (`grpc-status`, `grpc-message`).
fn end_stream(stream: &mut Stream, trailers: &HeaderMap, status: &Status) -> u32 {
    stream.phase = Phase::Answered;
    stream.end(status.code, Origin::Upstream);
    let end = messages::stream_end(&stream.config, status);
    let written =
        end.is_empty() || set_buffer(BufferType::HttpResponseBody, 0, end.as_bytes()).is_ok();
    if written && status.is_ok() {
        remove_status(trailers);
    }
    CONTINUE
}

/// Replaces the buffered gRPC body with the JSON reply and fixes the headers.
fn finish(stream: &mut Stream, body: Result<Vec<u8>, HostStatus>, status: Status) -> u32 {
    let Some(route) = stream.route.clone() else {
        return CONTINUE;
    };
    stream.phase = Phase::Answered;
    let body = match body {
        Ok(body) => body,
        Err(s) => {
            let reply = internal(
                &stream.config,
                &format!("cannot read the response body (host status {})", s.0),
            );
            let action = answer(stream, &reply);
            if action != PAUSE {
                release_headers(stream, &reply);
            }
            return action;
        }
    };
    let reply = transcode::decode_response(&stream.config, &route, &body, stream.encoding, &status);
    stream.meter.received(frames_in(&body), body.len());
    // An OK call whose answer the filter could not transcode.
    let origin = if status.is_ok() && reply.code != Code::Ok {
        Origin::Filter
    } else {
        Origin::Upstream
    };
    stream.end(reply.code, origin);
    release_headers(stream, &reply);
    let (_, text) = reply.content();
    match set_buffer(
        BufferType::HttpResponseBody,
        body.len().max(text.len()),
        text,
    ) {
        Ok(()) => CONTINUE,
        Err(s) => {
            log(
                LogLevel::Error,
                &format!(
                    "grpc-wasm: cannot replace the response body (host status {})",
                    s.0
                ),
            );
            CONTINUE
        }
    }
}

/// The status of a response that is not gRPC, with the proxy's cause when
/// it made the response itself (Envoy: `upstream_reset_before_response_started{remote_connection_failure,...}`
/// for a refused connection): a client then learns why, not only "503".
fn non_grpc_status(http_status: u16) -> Status {
    let mut status = Status::from_http_status(http_status);
    if !host_kind().names_response_cause() {
        return status;
    }
    let details = host::property(&["response", "code_details"])
        .and_then(|d| String::from_utf8(d).ok())
        .filter(|d| !d.is_empty() && d != "via_upstream");
    if let Some(details) = details {
        status.message = format!("{}: {details}", status.message);
    }
    status
}

fn status_in(headers: &HeaderMap) -> Option<Status> {
    let grpc_status = headers.bytes("grpc-status")?;
    Status::from_header_values(
        Some(grpc_status),
        headers.bytes("grpc-message"),
        headers.bytes("grpc-status-details-bin"),
    )
}
