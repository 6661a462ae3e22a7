//! The exported proxy-wasm callbacks: one root context per plugin
//! configuration, one stream context per HTTP exchange.
//!
//! Request: JSON for a known method is held until its end, then replaced by
//! one gRPC frame (headers: `content-type: application/grpc`, `te:
//! trailers`, no `content-length`; a path that the filter rewrites is kept
//! in `x-grpc-wasm-original-path`). Response: a trailers-only status (the
//! usual form of a gRPC error) becomes a JSON error with the HTTP status
//! mapped from `grpc-status`; otherwise the gRPC body is held until the
//! trailers and replaced by JSON. Hosts send response headers before the
//! body can be held, so a status that only arrives in trailers after data
//! changes the body (a `google.rpc.Status` object) but not the HTTP status.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::code::Code;
use crate::framing::{Compression, FrameDecoder};
use crate::status::Status;

use super::callout_host::{self, Call};
use super::config::{FilterConfig, Loaded};
use super::contract::{Action, BufferType, LogLevel, MapType, HOST_PROPERTY, SHIM_HOST};
use super::fetch;
use super::host::{self, *};
use super::id_map::IdMap;
use super::transcoder::{self, Plan, Reply, Route};

const CONTINUE: u32 = Action::Continue as u32;
const PAUSE: u32 = Action::Pause as u32;

struct Stream {
    config: Rc<FilterConfig>,
    /// Shared, so that callbacks take it without copying the binding.
    route: Option<Rc<Route>>,
    /// The reply was already decided (a trailers-only error); drop the rest.
    answered: bool,
    /// The response outgrew max_response_bytes after its headers had left.
    overflowed: bool,
    /// The filter has asked the host to hold the response body.
    holding_response: bool,
    /// ngx_wasm_module: the reply decided at the response headers, whose
    /// body replaces the first body chunk.
    pending_body: Option<String>,
    /// A unary response body taken out of the host's buffer so far.
    held: Vec<u8>,
    /// Callout mode: the call that answers this request.
    call: Option<Call>,
    /// A response streamed message by message: the frames still incomplete.
    decoder: Option<FrameDecoder>,
    /// The response's `grpc-encoding`.
    encoding: Compression,
}

thread_local! {
    static ROOTS: RefCell<IdMap<Rc<FilterConfig>>> = RefCell::new(IdMap::default());
    /// Shared cells: a callback borrows its stream in place, and a re-entrant
    /// callback for the same stream finds it borrowed and does nothing.
    static STREAMS: RefCell<IdMap<Rc<RefCell<Stream>>>> = RefCell::new(IdMap::default());
}

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
    if parent_id == 0 {
        return;
    }
    let Some(config) = ROOTS.with(|r| r.borrow().get(&parent_id).cloned()) else {
        fetch::adopt(context_id, parent_id);
        return;
    };
    STREAMS.with(|s| {
        s.borrow_mut().insert(
            context_id,
            Rc::new(RefCell::new(Stream {
                config,
                route: None,
                answered: false,
                overflowed: false,
                holding_response: false,
                pending_body: None,
                held: Vec::new(),
                call: None,
                decoder: None,
                encoding: Compression::Identity,
            })),
        )
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
fn install(root_id: u32, config: FilterConfig) -> u32 {
    match check_host(config) {
        Ok(config) => {
            // Streams have no host deadline: ticks enforce them. Without
            // callouts nothing needs ticks (a fetch may have started them).
            let _ = host::ticks(root_id, config.callout.is_some());
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

/// The fetched configuration document (see [`fetch`]).
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_http_call_response(
    root_id: u32,
    token: u32,
    _headers: u32,
    body_size: u32,
    _trailers: u32,
) {
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
    if let Some(reply) = fetch::not_ready(context_id) {
        return send_error(&reply);
    }
    with_stream(context_id, CONTINUE, |stream| {
        let headers = HeaderMap::read(MapType::HttpRequestHeaders);
        let http_method = headers.get(":method").unwrap_or_default();
        let path = headers.get(":path").unwrap_or_default();
        match transcoder::plan(
            &stream.config,
            http_method,
            path,
            headers.get("content-type"),
        ) {
            Plan::PassThrough => CONTINUE,
            Plan::Reply(reply) => answer(stream, &reply),
            Plan::Transcode(_)
                if stream.config.callout.is_some() && !host_kind().has_grpc_calls() =>
            {
                answer(
                    stream,
                    &Reply::error(
                        &stream.config,
                        &Status::new(Code::Unimplemented, NO_GRPC_CALLS),
                    ),
                )
            }
            Plan::Transcode(route) if stream.config.callout.is_some() => {
                start_callout(stream, context_id, route, &headers, end_of_stream != 0)
            }
            Plan::Transcode(route) => {
                if end_of_stream != 0 || has_no_body(&headers) {
                    // Proxy-wasm gives a filter no way to add a body to a
                    // request that has none; such requests need a callout.
                    let status = if route.binding.is_some() {
                        Status::new(Code::Unimplemented, format!("{http_method} {path} has no body and proxy-wasm cannot add one: bodiless bindings need the filter's callout mode (\"callout\" in the configuration)"))
                    } else {
                        Status::new(
                            Code::InvalidArgument,
                            "a JSON request body is required (use {} for an empty message)",
                        )
                    };
                    return answer(stream, &Reply::error(&stream.config, &status));
                }
                if host_kind() == HostKind::NgxWasmModule
                    && headers.get(ORIGINAL_PATH_HEADER).is_some()
                {
                    // nginx forwards every copy of a header, those that
                    // ngx_wasm_module removed or replaced included: the
                    // filter's own header cannot be made true there.
                    let status = Status::new(
                        Code::InvalidArgument,
                        format!("{ORIGINAL_PATH_HEADER} is set by the filter, not by clients"),
                    );
                    return answer(stream, &Reply::error(&stream.config, &status));
                }
                if let Err(reply) = transcoder::check_request_line(&stream.config, &route) {
                    return answer(stream, &reply);
                }
                if rewrite_request_headers(&headers, path, route.method.path()).is_err() {
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
        }
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_request_body(
    context_id: u32,
    body_size: u32,
    end_of_stream: u32,
) -> u32 {
    with_stream(context_id, CONTINUE, |stream| {
        // Answered already: a host that calls again must not get a second
        // reply, nor the body a gRPC frame.
        if stream.answered && stream.call.is_none() {
            return PAUSE;
        }
        if stream.call.is_some() {
            return callout_body(stream, context_id, body_size as usize, end_of_stream != 0);
        }
        let Some(route) = stream.route.clone() else {
            return CONTINUE;
        };
        let size = body_size as usize;
        if size > stream.config.max_request_bytes {
            let reply = transcoder::too_large(
                &stream.config,
                "request",
                size,
                stream.config.max_request_bytes,
            );
            return answer(stream, &reply);
        }
        if end_of_stream == 0 {
            return PAUSE;
        }
        let body = match host::buffer(BufferType::HttpRequestBody, 0, size) {
            Ok(body) if body.is_empty() && size > 0 => {
                // The host announced a body it cannot show: nginx wrote it
                // to a file.
                let reply =
                    transcoder::host_buffer_full(&stream.config, transcoder::NGINX_REQUEST_BUFFER);
                return answer(stream, &reply);
            }
            Ok(body) => body,
            Err(s) => {
                let reply = internal(
                    &stream.config,
                    &format!("cannot read the request body (host status {})", s.0),
                );
                return answer(stream, &reply);
            }
        };
        match transcoder::encode_request(&stream.config, &route, &body) {
            // Some hosts cut the new body to `size`: pass the larger length.
            Ok(frame) => {
                match set_buffer(BufferType::HttpRequestBody, size.max(frame.len()), &frame) {
                    Ok(()) if host_kind() == HostKind::NgxWasmModule => {
                        let length = frame.len().to_string();
                        if set_header(MapType::HttpRequestHeaders, "content-length", &length)
                            .is_err()
                        {
                            log(
                                LogLevel::Warn,
                                "grpc-wasm: the host refused the new content-length",
                            );
                        }
                        CONTINUE
                    }
                    Ok(()) => CONTINUE,
                    Err(s) => {
                        let reply = internal(
                            &stream.config,
                            &format!("cannot replace the request body (host status {})", s.0),
                        );
                        answer(stream, &reply)
                    }
                }
            }
            Err(reply) => answer(stream, &reply),
        }
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_headers(
    context_id: u32,
    _headers: u32,
    end_of_stream: u32,
) -> u32 {
    with_stream(context_id, CONTINUE, |stream| {
        let Some(route) = stream.route.clone() else {
            return CONTINUE;
        };
        if stream.answered {
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
            let reply =
                transcoder::host_buffer_full(&stream.config, transcoder::ENVOY_REQUEST_BUFFER);
            return answer_response(stream, &reply, &headers);
        }
        if headers.get("grpc-status").is_some() || !is_grpc || end_of_stream != 0 {
            // Trailers-only (the status is in these headers), or not gRPC at all.
            let status =
                status_in(&headers).unwrap_or_else(|| Status::from_http_status(http_status));
            let reply = transcoder::decode_response(
                &stream.config,
                &route,
                &[],
                Compression::Identity,
                &status,
            );
            return answer_response(stream, &reply, &headers);
        }
        // The headers leave now (a paused header block would also hold the
        // body back from this filter): a status that arrives in trailers
        // after data can change the body, not the HTTP status.
        let content_type = if transcoder::streams_response(&stream.config, &route) {
            stream.decoder = Some(FrameDecoder::new(
                stream.config.max_response_bytes,
                stream.encoding,
            ));
            transcoder::stream_content_type(&stream.config)
        } else {
            "application/json"
        };
        let _ = headers.edit(
            MapType::HttpResponseHeaders,
            &[("content-type", content_type)],
            &["content-length"],
        );
        CONTINUE
    })
}

/// ngx_wasm_module always says that a body follows the request headers,
/// and then never calls the body callback when there is none: the headers
/// must tell. In HTTP/1.x a request without Content-Length or
/// Transfer-Encoding has no body; in HTTP/2 one without Content-Length may
/// still have one, unless its method is one that carries none by custom.
fn has_no_body(headers: &HeaderMap) -> bool {
    if host_kind() != HostKind::NgxWasmModule {
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
    let ngx = host_kind() == HostKind::NgxWasmModule;
    // ngx_wasm_module keeps the query string of a `:path` set without one
    // (and nginx's grpc_pass would send it on); an empty query clears it.
    let cleared;
    let grpc_path = if ngx && original_path.contains('?') {
        cleared = format!("{grpc_path}?");
        cleared.as_str()
    } else {
        grpc_path
    };
    let set = [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
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
    if !ngx {
        remove.push("content-length");
    }
    let set = if original_path == grpc_path {
        remove.push(ORIGINAL_PATH_HEADER);
        &set[..4]
    } else {
        &set[..]
    };
    headers.edit(MapType::HttpRequestHeaders, set, &remove)
}

const ORIGINAL_PATH_HEADER: &str = "x-grpc-wasm-original-path";

/// A streamed response: each chunk leaves as the messages it completes.
fn stream_chunk(stream: &mut Stream, size: usize, end_of_stream: bool) -> u32 {
    let (Some(route), Some(decoder)) = (stream.route.clone(), stream.decoder.as_mut()) else {
        return CONTINUE;
    };
    let chunk = host::buffer(BufferType::HttpResponseBody, 0, size).unwrap_or_default();
    let mut piece = match transcoder::stream_piece(&stream.config, &route, decoder, &chunk) {
        Ok(piece) => piece,
        Err(status) => {
            // What follows cannot be read: the error ends the stream.
            stream.overflowed = true;
            transcoder::stream_end(&stream.config, &status)
        }
    };
    if end_of_stream && !stream.overflowed {
        let missing = Status::new(
            Code::Internal,
            "the upstream ended the response without grpc-status",
        );
        let status = if host_kind().calls_trailers() {
            missing
        } else {
            Status::ok()
        };
        piece.push_str(&transcoder::stream_end(&stream.config, &status));
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
        [] if end_of_stream && host_kind() == HostKind::NgxWasmModule => b"\n",
        text => text,
    };
    // Some hosts cut the new body to the size argument: pass the larger.
    set_buffer(BufferType::HttpResponseBody, size.max(text.len()), text)
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_body(
    context_id: u32,
    body_size: u32,
    end_of_stream: u32,
) -> u32 {
    with_stream(context_id, CONTINUE, |stream| {
        if stream.route.is_none() {
            return CONTINUE;
        }
        let size = body_size as usize;
        if let Some(body) = stream.pending_body.take() {
            // What follows is dropped.
            stream.overflowed = true;
            let _ = replace_response_chunk(size, body.as_bytes(), end_of_stream != 0);
            return CONTINUE;
        }
        if stream.overflowed {
            // The error is already written; what follows is dropped.
            let _ = replace_response_chunk(size, b"", end_of_stream != 0);
            return CONTINUE;
        }
        if stream.answered {
            return CONTINUE;
        }
        if stream.decoder.is_some() {
            return stream_chunk(stream, size, end_of_stream != 0);
        }
        // ngx_wasm_module holds a body once, in buffers of fixed size: a
        // second chunk before the end means they are full (and a second
        // pause would be ignored, letting gRPC bytes through).
        let ngx = host_kind() == HostKind::NgxWasmModule;
        let host_gave_up = ngx && end_of_stream == 0 && stream.holding_response;
        let total = stream.held.len() + size;
        if total > stream.config.max_response_bytes || host_gave_up {
            // The headers have left, so a local reply is no longer possible:
            // the held body becomes the error.
            let reply = if host_gave_up {
                transcoder::host_response_buffer_full(&stream.config)
            } else {
                transcoder::too_large(
                    &stream.config,
                    "response",
                    total,
                    stream.config.max_response_bytes,
                )
            };
            stream.answered = true;
            stream.overflowed = true;
            stream.held = Vec::new();
            let _ = replace_response_chunk(size, reply.body.as_bytes(), end_of_stream != 0);
            return CONTINUE;
        }
        if end_of_stream == 0 {
            let carried = !stream.held.is_empty()
                || (!ngx
                    && stream.route.as_deref().is_some_and(answers_one_message)
                    && first_message_is_large(size));
            if carried {
                return carry_large_response(stream, size);
            }
            stream.holding_response = true;
            return PAUSE;
        }
        // A gRPC body that ends without trailers: the status is missing, or,
        // on a host that never shows trailers, unknowable: the messages
        // stand (an error sent in trailers after data is lost there).
        let body = held_response(stream, size);
        let missing = if host_kind().calls_trailers() {
            Status::new(
                Code::Internal,
                "the upstream ended the response without grpc-status",
            )
        } else {
            Status::ok()
        };
        finish(stream, body, missing)
    })
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _trailers: u32) -> u32 {
    with_stream(context_id, CONTINUE, |stream| {
        if stream.route.is_none() || stream.answered {
            return CONTINUE;
        }
        let trailers = HeaderMap::read(MapType::HttpResponseTrailers);
        let status = status_in(&trailers).unwrap_or_else(|| {
            Status::new(
                Code::Internal,
                "the upstream sent trailers without grpc-status",
            )
        });
        if stream.decoder.is_some() {
            return end_stream(stream, &trailers, &status);
        }
        // The whole buffered body: the host stops at its end. The trailers
        // stay as the upstream sent them, as with Envoy's own transcoder
        // (HTTP/1.1 clients never see them); changing them would cost a
        // host call per request.
        if !stream.held.is_empty() {
            return cut_large_response(stream, &trailers);
        }
        let body = held_response(stream, u32::MAX as usize);
        finish(stream, body, status)
    })
}

/// The gRPC status trailers are the filter's business, not the client's.
fn remove_status(trailers: &HeaderMap) {
    let _ = trailers.edit(
        MapType::HttpResponseTrailers,
        &[],
        &["grpc-status", "grpc-message", "grpc-status-details-bin"],
    );
}
/// A unary message larger than this is carried by the module rather than
/// held in the host's buffer (see `carry_large_response`).
const LARGE_MESSAGE_BYTES: u64 = 64 * 1024;

/// The length of the first gRPC frame in `body`, once its header is there.
fn first_frame_len(body: &[u8]) -> Option<u64> {
    match body.get(1..5) {
        Some(&[a, b, c, d]) => Some(5 + u64::from(u32::from_be_bytes([a, b, c, d]))),
        _ => None,
    }
}

fn first_message_is_large(size: usize) -> bool {
    let head = host::buffer(BufferType::HttpResponseBody, 0, size.min(5)).unwrap_or_default();
    first_frame_len(&head).is_some_and(|len| len > LARGE_MESSAGE_BYTES)
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
/// the module instead (bounded by max_response_bytes), nothing is paused,
/// and its JSON leaves in the chunk that completes it. A status sent after
/// it reaches HTTP/2 clients as trailers only.
fn carry_large_response(stream: &mut Stream, size: usize) -> u32 {
    if let Err(reply) = hold_response_chunk(stream, size) {
        return answer(stream, &reply);
    }
    let declared = first_frame_len(&stream.held).unwrap_or(0);
    if declared > stream.config.max_response_bytes as u64 {
        // Refused by its header, before its bytes are held.
        let limit = stream.config.max_response_bytes;
        let reply = transcoder::too_large(&stream.config, "response", declared as usize, limit);
        stream.answered = true;
        stream.overflowed = true;
        stream.held = Vec::new();
        let _ = replace_response_chunk(0, reply.body.as_bytes(), false);
        return CONTINUE;
    }
    if (stream.held.len() as u64) < declared {
        // One allocation for the whole message, not a doubling one.
        stream
            .held
            .reserve_exact(declared as usize - stream.held.len());
        return CONTINUE;
    }
    // What follows the message is dropped.
    stream.overflowed = true;
    let body = std::mem::take(&mut stream.held);
    finish(stream, Ok(body), Status::ok())
}

/// Trailers came before the carried message was complete. Its chunks were
/// passed on, so the host has no body left to write the error in: the
/// trailers carry it (HTTP/2 clients see it; others see a short body).
fn cut_large_response(stream: &mut Stream, trailers: &HeaderMap) -> u32 {
    let declared = first_frame_len(&stream.held).unwrap_or(0);
    let message = format!(
        "the upstream ended the response within a message ({} of {declared} bytes)",
        stream.held.len()
    );
    stream.answered = true;
    stream.held = Vec::new();
    log(LogLevel::Warn, &format!("grpc-wasm: {message}"));
    let status = Status::new(Code::Internal, message);
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
    CONTINUE
}

/// Moves a response chunk from the host's buffer into the module.
fn hold_response_chunk(stream: &mut Stream, size: usize) -> Result<(), Reply> {
    let failed = |what: &str, s: HostStatus| {
        internal(
            &stream.config,
            &format!("cannot {what} the response body (host status {})", s.0),
        )
    };
    let chunk =
        host::buffer(BufferType::HttpResponseBody, 0, size).map_err(|s| failed("read", s))?;
    set_buffer(BufferType::HttpResponseBody, size, b"").map_err(|s| failed("take", s))?;
    stream.held.extend_from_slice(&chunk);
    Ok(())
}

/// The whole response body: what the module holds, then what the host does.
fn held_response(stream: &mut Stream, size: usize) -> Result<Vec<u8>, HostStatus> {
    let rest = host::buffer(BufferType::HttpResponseBody, 0, size)?;
    let mut body = std::mem::take(&mut stream.held);
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
    stream.answered = true;
    let end = transcoder::stream_end(&stream.config, status);
    let written =
        end.is_empty() || set_buffer(BufferType::HttpResponseBody, 0, end.as_bytes()).is_ok();
    if written && status.is_ok() {
        remove_status(trailers);
    }
    CONTINUE
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
    let removed = STREAMS.with(|s| s.borrow_mut().remove(&context_id));
    if let Some(call) = removed.and_then(|st| st.try_borrow_mut().ok()?.call.take()) {
        callout_host::cancel(&call);
    }
    ROOTS.with(|r| r.borrow_mut().remove(&context_id));
    fetch::forget(context_id);
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_receive_initial_metadata(_root_id: u32, token: u32, _headers: u32) {
    with_call(token, |_, call, _| {
        callout_host::on_initial_metadata(call);
        None
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_receive(_root_id: u32, token: u32, size: u32) {
    with_call(token, |stream, call, context_id| {
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
    with_call(token, |_, call, _| {
        callout_host::on_trailing_metadata(call);
        None
    });
}

#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn proxy_on_grpc_close(_root_id: u32, token: u32, status_code: u32) {
    with_call(token, |stream, call, _| {
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
    fetch::on_tick(root_id);
    let contexts: Vec<u32> = STREAMS.with(|s| {
        s.borrow()
            .iter()
            .filter(|(_, st)| st.try_borrow().is_ok_and(|st| st.call.is_some()))
            .map(|(id, _)| *id)
            .collect()
    });
    for context_id in contexts {
        with_stream(context_id, 0, |stream| {
            if stream.answered {
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

/// What the filter must know about its host, learnt once per VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostKind {
    /// The OpenResty shim: its callers are trusted, and it has a delivery
    /// function for streamed messages.
    Shim,
    /// Kong's ngx_wasm_module: no gRPC calls (they do nothing), no trailers
    /// callback, and a local reply from the response-headers callback keeps
    /// the upstream's headers.
    NgxWasmModule,
    /// Envoy and other proxy-wasm hosts.
    Other,
}

impl HostKind {
    fn has_grpc_calls(self) -> bool {
        self != HostKind::NgxWasmModule
    }

    fn calls_trailers(self) -> bool {
        self != HostKind::NgxWasmModule
    }
}

thread_local! {
    static HOST_KIND: Cell<Option<HostKind>> = const { Cell::new(None) };
}

/// The shim names itself through a property that other hosts do not have.
/// (Not a probing foreign-function call: ngx_wasm_module traps on names it
/// does not know.)
fn host_is_shim() -> bool {
    let shim = host::property(&[HOST_PROPERTY]).as_deref() == Some(SHIM_HOST);
    if shim {
        HOST_KIND.with(|k| k.set(Some(HostKind::Shim)));
    }
    shim
}

/// The host, from inside a request: ngx_wasm_module answers its `ngx.*`
/// properties (nginx variables) only there, so it cannot be recognised
/// while configuring.
fn host_kind() -> HostKind {
    if let Some(kind) = HOST_KIND.with(Cell::get) {
        return kind;
    }
    let kind = if host::property(&["ngx", "hostname"]).is_some() {
        HostKind::NgxWasmModule
    } else {
        HostKind::Other
    };
    HOST_KIND.with(|k| k.set(Some(kind)));
    kind
}

const NO_GRPC_CALLS: &str = "callout: this host (ngx_wasm_module) has no gRPC calls (proxy_grpc_call); remove \"callout\" from the filter's configuration and put the filter in front of grpc_pass to transcode";

/// `upstream_header` lets the caller pick the upstream: only the shim's
/// callers (Lua code) are trusted with that.
fn check_host(config: FilterConfig) -> Result<FilterConfig, String> {
    let picks_upstream = config
        .callout
        .as_ref()
        .is_some_and(|c| c.upstream_header.is_some());
    if picks_upstream && !host_is_shim() {
        return Err("callout.upstream_header: only for the OpenResty shim, whose callers are trusted; in this host any HTTP client could pick the upstream cluster".into());
    }
    Ok(config)
}

/// Runs `f` on the call of the stream that owns `token`; a reply it returns
/// ends the HTTP exchange.
fn with_call(token: u32, f: impl FnOnce(&mut Stream, &mut Call, u32) -> Option<Reply>) {
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
fn reply_to_call(stream: &mut Stream, context_id: u32, call: &Call, reply: &Reply) {
    if stream.answered {
        return;
    }
    stream.answered = true;
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
    if let Err(s) = send_reply_map(reply.http_status, reply_details(), &reply.body, &headers) {
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
fn start_callout(
    stream: &mut Stream,
    context_id: u32,
    mut route: Route,
    headers: &HeaderMap,
    end_of_stream: bool,
) -> u32 {
    let mut call = match callout_host::prepare(&stream.config, headers) {
        Ok(call) => call,
        Err(status) => return answer(stream, &Reply::error(&stream.config, &status)),
    };
    route.json = call.json.take();
    if route.method.streaming() != crate::StreamingKind::Unary {
        callout_host::add_stream_deadline(&mut call);
    }
    let started = if callout_host::streams_requests(&route) {
        callout_host::open_stream(&stream.config, &route, &mut call, context_id).and_then(|()| {
            if end_of_stream {
                callout_host::send_streamed(&stream.config, &route, &mut call, b"", true)
                    .map(|_| ())
            } else {
                Ok(())
            }
        })
    } else if end_of_stream {
        callout_host::start_with_body(&stream.config, &route, &mut call, context_id, b"")
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
fn callout_body(stream: &mut Stream, context_id: u32, size: usize, end_of_stream: bool) -> u32 {
    // Answered already (the deadline passed while the body came): a call
    // started now would run for nobody.
    if stream.answered {
        return PAUSE;
    }
    let (Some(route), Some(mut call)) = (stream.route.clone(), stream.call.take()) else {
        return PAUSE;
    };
    let result = if size > stream.config.max_request_bytes {
        Err(transcoder::too_large(
            &stream.config,
            "request",
            size,
            stream.config.max_request_bytes,
        ))
    } else if callout_host::streams_requests(&route) {
        read_body(&stream.config, size).and_then(|body| {
            let used = callout_host::send_streamed(
                &stream.config,
                &route,
                &mut call,
                &body,
                end_of_stream,
            )?;
            // Sent messages leave the host's buffer (Envoy drains `used` bytes).
            let _ = set_buffer(BufferType::HttpRequestBody, used, b"");
            Ok(())
        })
    } else if end_of_stream {
        read_body(&stream.config, size).and_then(|body| {
            callout_host::start_with_body(&stream.config, &route, &mut call, context_id, &body)
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
fn fail_call(stream: &mut Stream, reply: &Reply) -> u32 {
    if let Some(call) = &stream.call {
        callout_host::cancel(call);
    }
    answer(stream, reply)
}

/// Replaces the buffered gRPC body with the JSON reply and fixes the headers.
fn finish(stream: &mut Stream, body: Result<Vec<u8>, HostStatus>, status: Status) -> u32 {
    let Some(route) = stream.route.clone() else {
        return CONTINUE;
    };
    stream.answered = true;
    let body = match body {
        Ok(body) => body,
        Err(s) => {
            let reply = internal(
                &stream.config,
                &format!("cannot read the response body (host status {})", s.0),
            );
            return answer(stream, &reply);
        }
    };
    let reply =
        transcoder::decode_response(&stream.config, &route, &body, stream.encoding, &status);
    match set_buffer(
        BufferType::HttpResponseBody,
        body.len().max(reply.body.len()),
        reply.body.as_bytes(),
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

fn status_in(headers: &HeaderMap) -> Option<Status> {
    let grpc_status = headers.bytes("grpc-status")?;
    Status::from_header_values(
        Some(grpc_status),
        headers.bytes("grpc-message"),
        headers.bytes("grpc-status-details-bin"),
    )
}

fn internal(config: &FilterConfig, message: &str) -> Reply {
    Reply::error(config, &Status::new(Code::Internal, message))
}

/// Sends `reply` as the response; the stream stops here, and the filter
/// leaves its own reply alone when it passes the response callbacks.
/// Answers the stream with `reply`. Only a reply the host took answers
/// it: when the host refuses one, the request goes on (CONTINUE) and the
/// later callbacks must treat it as any other.
fn answer(stream: &mut Stream, reply: &Reply) -> u32 {
    let action = send_error(reply);
    stream.answered = action == PAUSE;
    action
}

/// Sends `reply` (an error) as the response; PAUSE when the host took it.
fn send_error(reply: &Reply) -> u32 {
    let code = reply.code.as_i32().to_string();
    let headers: [(&str, &[u8]); 3] = [
        ("content-type", b"application/json"),
        ("grpc-status", code.as_bytes()),
        ("grpc-status-name", reply.code.name().as_bytes()),
    ];
    if let Err(s) = send_reply(reply.http_status, reply_details(), &reply.body, &headers) {
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
fn reply_details() -> &'static str {
    if host_kind() == HostKind::NgxWasmModule {
        ""
    } else {
        "grpc_wasm"
    }
}

/// A reply from the response-headers callback.
fn answer_response(stream: &mut Stream, reply: &Reply, headers: &HeaderMap) -> u32 {
    if host_kind() != HostKind::NgxWasmModule {
        return answer(stream, reply);
    }
    // ngx_wasm_module's local reply from this callback keeps the upstream's
    // headers, and from nginx's own error pages (502, 504) it sends
    // nothing: the headers become the reply's here, and the body callback
    // writes its body over the first chunk.
    let http_status = reply.http_status.to_string();
    let code = reply.code.as_i32().to_string();
    let set = [
        (":status", http_status.as_str()),
        ("content-type", "application/json"),
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
    stream.answered = true;
    stream.pending_body = Some(reply.body.clone());
    CONTINUE
}

fn with_stream(context_id: u32, default: u32, f: impl FnOnce(&mut Stream) -> u32) -> u32 {
    let Some(cell) = STREAMS.with(|s| s.borrow().get(&context_id).cloned()) else {
        return default;
    };
    // Borrowed already: a host call made from this stream's own callback
    // (a local reply) re-entered the module.
    let Ok(mut stream) = cell.try_borrow_mut() else {
        return default;
    };
    f(&mut stream)
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
