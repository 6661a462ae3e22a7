//! Callout mode against the host: the filter answers a transcoded request
//! by calling the method itself with `proxy_grpc_call` (unary) or
//! `proxy_grpc_stream` (everything else), then replies with a local response.
//!
//! The host's gRPC callbacks arrive on the root context with a token; a
//! token table leads back to the HTTP stream. Streamed response messages go
//! to the host function `grpc_wasm.deliver` when the host has one (the
//! OpenResty shim: it hands each message to Lua as it comes); elsewhere
//! they are gathered into one JSON array.

use std::cell::RefCell;

use crate::code::Code;
use crate::descriptors::StreamingKind;
use crate::status::Status;
use crate::timeout::encode_timeout;

use super::super::config::{Callout, FilterConfig};
use super::super::held::Held;
use super::super::host::{self, *};
use super::super::id_map::IdMap;
use super::super::json_values::{check_whole, split_messages, ValueScanner};
use super::super::messages::{self, Route};
use super::super::metrics::Meter;
use super::super::reply::{self, Reply};
use super::{add_user_agent, call_metadata, closed_status, deadline_ms};
use crate::contract::pairs;
use crate::contract::{
    BufferType, ContextId, MapType, Token, DELIVER_FUNCTION, JSON_OPTIONS_HEADER, METADATA_PREFIX,
    TRAILER_PREFIX,
};
use crate::http_body::{self, At, RawBody};

/// One call in flight for an HTTP stream.
#[derive(Debug, Default)]
pub struct Call {
    /// This request's own JSON options, for its route.
    pub json: Option<crate::JsonOptions>,
    upstream: Vec<u8>,
    metadata: Vec<(String, String)>,
    deadline_ms: u64,
    started_ns: u64,
    /// 0 until the host accepted the call.
    token: Token,
    /// Messages gathered for the final reply (hosts without delivery).
    messages: Vec<String>,
    /// The response messages' protobuf bytes so far, which
    /// `max_response_bytes` bounds (as Envoy's max_response_body_size
    /// bounds the gRPC body it buffers).
    message_bytes: usize,
    /// What the call holds of them for the reply (their JSON, or data).
    held_bytes: usize,
    /// The gathered messages' share of what the VM holds of responses.
    held: Held,
    initial: HeaderMap,
    trailing: HeaderMap,
    delivering: bool,
    /// Where the streamed request body's whole messages end.
    scanner: ValueScanner,
    /// A unary call made as a stream (see [`unary_as_stream`]): its answer
    /// waits for the call's end.
    unary_stream: bool,
    /// An HttpBody response gathered for the final reply.
    raw: Option<RawBody>,
    /// The call ended in an error of the filter's own (a limit, a message
    /// it could not transcode), not the upstream's.
    failed_here: bool,
}

impl Call {
    /// Whether the call ended in an error of the filter's own.
    pub fn failed_here(&self) -> bool {
        self.failed_here
    }
}

thread_local! {
    static TOKENS: RefCell<IdMap<Token, ContextId>> = RefCell::new(IdMap::default());
}

/// The context that owns a call's token.
pub fn context_of(token: Token) -> Option<ContextId> {
    TOKENS.with(|t| t.borrow().get(&token).copied())
}

fn forget(token: Token) {
    TOKENS.with(|t| t.borrow_mut().remove(&token));
}

/// Prepares the call from the request headers: deadline, metadata, upstream.
pub fn prepare(config: &FilterConfig, headers: &HeaderMap) -> Result<Call, Status> {
    match &config.callout {
        Some(callout) => prepare_with(callout, headers),
        None => Err(Status::new(Code::Internal, "callout mode is off")),
    }
}

/// [`prepare`] for the calls of `callout`.
pub fn prepare_with(callout: &Callout, headers: &HeaderMap) -> Result<Call, Status> {
    // One pass over the headers for the three this needs.
    let (mut timeout, mut chosen, mut options) = (None, None, None);
    let upstream_header = callout.upstream_header.as_deref().map(str::as_bytes);
    for (name, value) in headers.pairs() {
        if timeout.is_none() && name.eq_ignore_ascii_case(b"grpc-timeout") {
            timeout = Some(value);
        } else if chosen.is_none() && upstream_header.is_some_and(|h| name.eq_ignore_ascii_case(h))
        {
            chosen = Some(value);
        } else if options.is_none() && name.eq_ignore_ascii_case(JSON_OPTIONS_HEADER.as_bytes()) {
            options = Some(value);
        }
    }
    let timeout = timeout.map(String::from_utf8_lossy);
    let deadline_ms = deadline_ms(callout, timeout.as_deref())?;
    let mut metadata = call_metadata(callout, headers.pairs())?;
    add_user_agent(&mut metadata);
    let upstream = match chosen {
        Some(chosen) => chosen.to_vec(),
        None => callout.upstream.clone(),
    };
    if upstream.is_empty() {
        return Err(Status::new(
            Code::InvalidArgument,
            "no upstream: the request names none and the configuration has none",
        ));
    }
    // Like the upstream, per-request JSON options are for trusted embedders.
    let json = match options.filter(|_| upstream_header.is_some()) {
        Some(list) => Some(
            messages::json_options_from(&String::from_utf8_lossy(list)).map_err(|e| {
                Status::new(Code::InvalidArgument, format!("{JSON_OPTIONS_HEADER}: {e}"))
            })?,
        ),
        None => None,
    };
    Ok(Call {
        json,
        upstream,
        metadata,
        deadline_ms,
        started_ns: now_nanos(),
        ..Call::default()
    })
}

/// Whether a unary call goes as a stream (`proxy_grpc_stream`, one message
/// each way). Envoy hands a failed `proxy_grpc_call` to the filter without
/// its trailers, so `grpc-status-details-bin` would be lost in callout
/// mode; a stream's trailers come to
/// `proxy_on_grpc_receive_trailing_metadata`. The shim gives a call its
/// trailers and keeps its faster unary path.
pub fn unary_as_stream() -> bool {
    !host::is_shim()
}

/// Starts the call with the whole request body (unary and server streaming).
pub fn start_with_body(
    config: &FilterConfig,
    route: &Route,
    call: &mut Call,
    context_id: ContextId,
    body: &[u8],
    meter: &mut Meter,
) -> Result<(), Reply> {
    let message = messages::encode_message(config, route, body)?;
    let unary = route.method.streaming() == StreamingKind::Unary;
    call.unary_stream = unary && unary_as_stream();
    let target = target(route, call);
    let token = if unary && !call.unary_stream {
        grpc_call(&target, &message, call.deadline_ms)
    } else {
        grpc_stream(&target).and_then(|token| {
            grpc_send(token, &message)
                .and_then(|()| grpc_close(token))
                .map(|()| token)
                .inspect_err(|_| {
                    let _ = grpc_cancel(token);
                })
        })
    }
    .map_err(|s| host_refused(config, s))?;
    own(call, token, context_id);
    meter.sent(1, message.len() + 5);
    Ok(())
}

/// Opens a stream whose messages follow in the request body.
pub fn open_stream(
    config: &FilterConfig,
    route: &Route,
    call: &mut Call,
    context_id: ContextId,
) -> Result<(), Reply> {
    let token = grpc_stream(&target(route, call)).map_err(|s| host_refused(config, s))?;
    own(call, token, context_id);
    Ok(())
}

/// Sends the complete JSON messages at the start of the buffered request
/// body and returns how many bytes they took (the caller drains them); at
/// the body's end, half-closes the stream.
pub fn send_streamed(
    config: &FilterConfig,
    route: &Route,
    call: &mut Call,
    body: &[u8],
    end: bool,
    meter: &mut Meter,
) -> Result<usize, Reply> {
    let bad_request =
        |message: String| Reply::error(config, &Status::new(Code::InvalidArgument, message));
    // Only the whole messages are parsed; at the end, everything is.
    let ready = if end {
        body.len()
    } else {
        call.scanner.scan(body)
    };
    let (values, used) = split_messages(&body[..ready]).map_err(bad_request)?;
    call.scanner.consumed(used);
    let plain = Route {
        binding: None,
        ..route.clone()
    };
    for value in values {
        let message = messages::encode_message(config, &plain, value)?;
        grpc_send(call.token, &message).map_err(|s| host_refused(config, s))?;
        meter.sent(1, message.len() + 5);
    }
    if end {
        check_whole(&body[used..]).map_err(bad_request)?;
        grpc_close(call.token).map_err(|s| host_refused(config, s))?;
    }
    Ok(used)
}

fn target<'a>(route: &'a Route, call: &'a Call) -> GrpcTarget<'a> {
    GrpcTarget {
        upstream: &call.upstream,
        service: route.method.service_name(),
        method: route.method.name(),
        metadata: &call.metadata,
    }
}

fn own(call: &mut Call, token: Token, context_id: ContextId) {
    call.token = token;
    TOKENS.with(|t| t.borrow_mut().insert(token, context_id));
}

fn host_refused(config: &FilterConfig, status: HostStatus) -> Reply {
    Reply::error(
        config,
        &Status::new(
            Code::Unavailable,
            format!("the host refused the gRPC call (host status {})", status.0),
        ),
    )
}

/// Streams get the deadline as metadata too: the host enforces none for them.
pub fn add_stream_deadline(call: &mut Call) {
    let timeout = std::time::Duration::from_millis(call.deadline_ms);
    call.metadata
        .push(("grpc-timeout".to_string(), encode_timeout(timeout)));
}

pub fn on_initial_metadata(call: &mut Call) {
    call.initial = HeaderMap::read(MapType::GrpcReceiveInitialMetadata);
}

pub fn on_trailing_metadata(call: &mut Call) {
    call.trailing = HeaderMap::read(MapType::GrpcReceiveTrailingMetadata);
}

/// A response message. Returns the final reply when the call is over
/// (unary success, or a stream that broke a limit).
pub fn on_message(
    config: &FilterConfig,
    route: &Route,
    call: &mut Call,
    context_id: ContextId,
    size: usize,
) -> Option<Reply> {
    // The host hands over whatever the server sent; the limit holds for
    // every kind of call, a unary answer included.
    if size > config.max_response_bytes {
        return Some(over_limit(config, call, size));
    }
    let bytes = match host::buffer(BufferType::GrpcReceiveBuffer, 0, size) {
        Ok(bytes) => bytes,
        Err(s) => {
            return Some(fail(
                config,
                call,
                Status::new(
                    Code::Internal,
                    format!("cannot read the response message (host status {})", s.0),
                ),
            ))
        }
    };
    if let Some(at) = raw_response(route) {
        return on_raw_message(config, route, call, at, &bytes);
    }
    let json = match messages::decode_message(config, route, &bytes) {
        Ok(json) => json,
        Err(status) => return Some(fail(config, call, status)),
    };
    if route.method.streaming() == StreamingKind::Unary && !call.unary_stream {
        forget(call.token);
        return Some(messages::reply_from_messages(
            config,
            route,
            vec![json],
            &Status::ok(),
        ));
    }
    if !call.unary_stream && deliver(call, context_id, &json) {
        return None;
    }
    if let Some(reply) = gather(config, call, size, json.len()) {
        return Some(reply);
    }
    call.messages.push(json);
    None
}

/// A message of a route whose response is an HttpBody: its data is the
/// HTTP body (a stream's, one message's after another), and the first
/// message's content type is the body's.
fn on_raw_message(
    config: &FilterConfig,
    route: &Route,
    call: &mut Call,
    at: At,
    bytes: &[u8],
) -> Option<Reply> {
    let body = match http_body::decode(at, bytes) {
        Ok(body) => body,
        Err(reason) => {
            let output = route.method.output();
            let reason = format!("cannot transcode {}: {reason}", output.full_name());
            return Some(fail(config, call, Status::new(Code::Internal, reason)));
        }
    };
    let unary = route.method.streaming() == StreamingKind::Unary;
    if unary && !call.unary_stream {
        forget(call.token);
        return Some(Reply::raw(body));
    }
    if unary && call.raw.is_some() {
        // As the JSON path answers a unary call that sends more.
        let status = Status::new(Code::Internal, "expected one response message, got 2");
        return Some(fail(config, call, status));
    }
    // The type is held too (the first message's, at most 1 KiB).
    let added = body.data.len() + call.raw.as_ref().map_or(body.content_type.len(), |_| 0);
    if let Some(reply) = gather(config, call, bytes.len(), added) {
        return Some(reply);
    }
    match &mut call.raw {
        Some(raw) => {
            if raw.data.try_reserve_exact(body.data.len()).is_err() {
                let status = Status::new(Code::ResourceExhausted, "cannot hold the response");
                return Some(fail(config, call, status));
            }
            raw.data.extend_from_slice(&body.data);
        }
        None => call.raw = Some(body),
    }
    None
}

/// Where the response an HttpBody route answers raw lies: not for the
/// OpenResty shim, whose Lua API reads JSON.
fn raw_response(route: &Route) -> Option<At> {
    route.response_http_body().filter(|_| !host::is_shim())
}

/// Counts a message of `wire` protobuf bytes against the response limit
/// and the `added` bytes gathered of it for the final reply against the
/// VM's budget; the reply that ends the call when either is passed.
fn gather(config: &FilterConfig, call: &mut Call, wire: usize, added: usize) -> Option<Reply> {
    call.message_bytes = call.message_bytes.saturating_add(wire);
    call.held_bytes = call.held_bytes.saturating_add(added);
    if call.message_bytes > config.max_response_bytes {
        return Some(over_limit(config, call, call.message_bytes));
    }
    if let Err(over) = call
        .held
        .set(call.held_bytes, config.max_held_response_bytes)
    {
        let status = reply::over_budget_status(over.others, over.budget);
        return Some(fail(config, call, status));
    }
    None
}

/// Ends a call whose response passed `max_response_bytes`.
fn over_limit(config: &FilterConfig, call: &mut Call, size: usize) -> Reply {
    let reply = reply::too_large(config, "response", size, config.max_response_bytes);
    call.failed_here = true;
    let _ = grpc_cancel(call.token);
    forget(call.token);
    let _ = drop_messages(call);
    reply
}

/// The messages gathered for the final reply, taken out, and the VM's
/// budget given their share back: the call's context may live on long
/// after its reply (a slow client), and its share with it.
fn drop_messages(call: &mut Call) -> Vec<String> {
    call.held.release();
    call.message_bytes = 0;
    call.held_bytes = 0;
    call.raw = None;
    std::mem::take(&mut call.messages)
}

/// Hands a message to the host's delivery function; false when the host has
/// none (then the message waits for the final reply).
fn deliver(call: &mut Call, context_id: ContextId, json: &str) -> bool {
    if !call.delivering && !call.messages.is_empty() {
        return false;
    }
    let mut args = Vec::with_capacity(4 + json.len());
    args.extend_from_slice(&context_id.0.to_le_bytes());
    args.extend_from_slice(json.as_bytes());
    call.delivering = call_foreign(DELIVER_FUNCTION, &args).is_ok();
    call.delivering
}

/// The call ended (stream end, or a failure): the final reply.
pub fn on_close(config: &FilterConfig, route: &Route, call: &mut Call, code: u32) -> Reply {
    forget(call.token);
    let (reported, message) = grpc_status();
    let code = if code == 0 { reported } else { code };
    // A unary answer through a stream ends here, its one message gathered.
    let answered = route.method.streaming() != StreamingKind::Unary
        || (call.unary_stream && (!call.messages.is_empty() || call.raw.is_some()));
    let status = if code == 0 && answered {
        Status::ok()
    } else {
        // Only Envoy adds its details to the message; the shim passes the
        // server's as they came.
        let host_details = !host::is_shim();
        let mut status = closed_status(
            code,
            &message,
            elapsed_ms(call),
            call.deadline_ms,
            host_details,
        );
        status.details = trailing_details(call);
        status
    };
    if call.delivering {
        // The messages are with the host already; the reply only ends the call.
        return if status.is_ok() {
            Reply::delivered()
        } else {
            Reply::error(config, &status)
        };
    }
    if let (Some(_), true) = (raw_response(route), status.is_ok()) {
        // An HttpBody stream: its data gathered, or none.
        let raw = call.raw.take().unwrap_or_default();
        let _ = drop_messages(call);
        return Reply::raw(raw);
    }
    messages::reply_from_messages(config, route, drop_messages(call), &status)
}

fn trailing_details(call: &Call) -> Option<Vec<u8>> {
    let value = call.trailing.bytes("grpc-status-details-bin")?;
    crate::metadata::decode_binary("grpc-status-details-bin", value).ok()
}

fn fail(config: &FilterConfig, call: &mut Call, status: Status) -> Reply {
    call.failed_here = true;
    if call.token != Token(0) {
        let _ = grpc_cancel(call.token);
        forget(call.token);
    }
    let _ = drop_messages(call);
    Reply::error(config, &status)
}

fn elapsed_ms(call: &Call) -> u64 {
    now_nanos().saturating_sub(call.started_ns) / 1_000_000
}

/// A call past its deadline: cancelled, and answered DEADLINE_EXCEEDED.
/// The deadline runs from the request's headers, so a call still waiting
/// for the end of its request body (a caller that never half-closes a
/// server-streaming call) expires too, rather than waiting on forever.
pub fn expire(config: &FilterConfig, call: &mut Call) -> Option<Reply> {
    let ended = call.token != Token(0) && context_of(call.token).is_none();
    if ended || elapsed_ms(call) < call.deadline_ms {
        return None;
    }
    let reply = fail(config, call, Status::deadline_exceeded(call.deadline_ms));
    // The call's own end, as the host's deadline would have made it.
    call.failed_here = false;
    Some(reply)
}

/// The HTTP stream ended first: the host would let the call run on.
pub fn cancel(call: &Call) {
    if call.token != Token(0) && context_of(call.token).is_some() {
        let _ = grpc_cancel(call.token);
        forget(call.token);
    }
}

/// The response headers of a callout reply, serialized for the host: the
/// status, and the call's response metadata (`grpc-metadata-*` from
/// headers, `grpc-trailer-*`).
pub fn reply_headers(call: &Call, reply: &Reply) -> Vec<u8> {
    let mut map = pairs::Builder::with_capacity(8, 192);
    let (content_type, _) = reply.content();
    map.push(b"", b"content-type", content_type.as_bytes());
    let mut code = itoa::Buffer::new();
    map.push(
        b"",
        b"grpc-status",
        code.format(reply.code.as_i32()).as_bytes(),
    );
    // Clients print it; they need no table of codes of their own.
    map.push(b"", b"grpc-status-name", reply.code.name().as_bytes());
    let reserved =
        |k: &[u8]| k.starts_with(b":") || k.starts_with(b"grpc-") || k == b"content-type";
    for (k, v) in call.initial.pairs().filter(|(k, _)| !reserved(k)) {
        map.push(METADATA_PREFIX.as_bytes(), k, v);
    }
    for (k, v) in call.trailing.pairs().filter(|(k, _)| !reserved(k)) {
        map.push(TRAILER_PREFIX.as_bytes(), k, v);
    }
    map.finish()
}
