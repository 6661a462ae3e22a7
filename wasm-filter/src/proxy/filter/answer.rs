//! What each callback answers the host, and the local replies it sends.

use crate::code::Code;
use crate::status::Status;

use super::super::config::FilterConfig;
use super::super::host::*;
use super::super::reply::Reply;
use super::host_kind::host_kind;
use super::stream::{Origin, Phase, Stream};
use crate::contract::{Action, LogLevel, MapType};

pub(super) const CONTINUE: u32 = Action::Continue as u32;
pub(super) const PAUSE: u32 = Action::Pause as u32;

pub(super) fn internal(config: &FilterConfig, message: &str) -> Reply {
    Reply::error(config, &Status::new(Code::Internal, message))
}

/// Sends `reply` as the response; the stream stops here, and the filter
/// leaves its own reply alone when it passes the response callbacks.
/// Answers the stream with `reply`. Only a reply the host took answers
/// it: when the host refuses one, the request goes on (CONTINUE) and the
/// later callbacks must treat it as any other.
/// `reply` is the filter's own answer.
pub(super) fn answer(stream: &mut Stream, reply: &Reply) -> u32 {
    answer_from(stream, reply, Origin::Filter)
}

/// [`answer`] with a reply that says what `origin` decided.
pub(super) fn answer_from(stream: &mut Stream, reply: &Reply, origin: Origin) -> u32 {
    let action = send_local(reply);
    if action == PAUSE {
        stream.phase = Phase::Answered;
        stream.end(reply.code, origin);
    }
    action
}

/// Sends `reply` as the response, under the content type of what it
/// carries (JSON, an NDJSON or SSE stream, an HttpBody); PAUSE when the
/// host took it.
pub(super) fn send_local(reply: &Reply) -> u32 {
    let code = reply.code.as_i32().to_string();
    let (content_type, body) = reply.content();
    let headers: [(&str, &[u8]); 3] = [
        ("content-type", content_type.as_bytes()),
        ("grpc-status", code.as_bytes()),
        ("grpc-status-name", reply.code.name().as_bytes()),
    ];
    if let Err(s) = send_reply(reply.http_status, reply_details(), body, &headers) {
        log(
            LogLevel::Error,
            &format!("grpc-wasm: the host refused a local reply (status {})", s.0),
        );
        return CONTINUE;
    }
    PAUSE
}

/// The local reply's details: Envoy logs them as the response code details;
/// ngx_wasm_module makes them the status line's reason phrase (and, from the
/// response-headers callback, the whole status line), so it gets none and
/// nginx writes the standard phrase.
pub(super) fn reply_details() -> &'static str {
    if host_kind().details_are_reason_phrase() {
        ""
    } else {
        "grpc_wasm"
    }
}

/// A reply from the response-headers callback.
pub(super) fn answer_response(
    stream: &mut Stream,
    reply: &Reply,
    headers: &HeaderMap,
    origin: Origin,
) -> u32 {
    if !host_kind().replies_keep_response_headers() {
        return answer_from(stream, reply, origin);
    }
    // ngx_wasm_module's local reply from this callback keeps the upstream's
    // headers, and from nginx's own error pages (502, 504) it sends
    // nothing: the headers become the reply's here, and the body callback
    // writes its body over the first chunk.
    make_headers_the_replys(headers, reply);
    stream.phase = Phase::ReplyInFirstChunk(reply.content().1.to_vec());
    stream.end(reply.code, origin);
    CONTINUE
}

/// Makes the response headers `reply`'s own: its HTTP status, content type
/// and gRPC status, none of the upstream's that would contradict them.
pub(super) fn make_headers_the_replys(headers: &HeaderMap, reply: &Reply) {
    let http_status = reply.http_status.to_string();
    let code = reply.code.as_i32().to_string();
    let (content_type, _) = reply.content();
    let set = [
        (":status", http_status.as_str()),
        ("content-type", content_type),
        ("grpc-status", code.as_str()),
        ("grpc-status-name", reply.code.name()),
    ];
    let remove = [
        "content-length",
        "content-encoding",
        "content-range",
        "etag",
        "grpc-message",
        "grpc-status-details-bin",
        "grpc-encoding",
    ];
    if headers
        .edit(MapType::HttpResponseHeaders, &set, &remove)
        .is_err()
    {
        log(
            LogLevel::Warn,
            "grpc-wasm: the host refused a response header change",
        );
    }
}
