//! A call's messages between the client's JSON and the method's protobuf,
//! in either mode: the [`Route`] a request takes (its method, its HTTP
//! binding, its JSON options), a request body as one message, a response
//! message as JSON cut to `response_body`, and the reply or stream
//! pieces that carry them.

use crate::code::Code;
use crate::descriptors::{Method, StreamingKind};
use crate::details::status_to_json;
use crate::framing::FrameDecoder;
use crate::json::JsonOptions;
use crate::status::Status;

use super::config::{FilterConfig, StreamFormat};
use super::reply::{bad_request, too_large, Reply, NDJSON};
use crate::http_body::{At, RawBody};
use crate::http_rule::{
    check_request_line as check_line, request_message, response_part, Binding, PathVars,
};

/// A request the filter transcodes: the method, and the HTTP binding when
/// the request came through a `google.api.http` rule.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: Method,
    pub binding: Option<(Binding, PathVars, String)>,
    /// This request's own JSON options (trusted embedders), else the configuration's.
    pub json: Option<JsonOptions>,
    /// The request's Content-Type, kept where a binding's body is an
    /// HttpBody (see `http_body`).
    pub content_type: Option<String>,
}

impl Route {
    pub(crate) fn new(method: Method, binding: Option<(Binding, PathVars, String)>) -> Route {
        Route {
            method,
            binding,
            json: None,
            content_type: None,
        }
    }

    /// Where the response holds the HttpBody that is the HTTP body, when
    /// it does.
    pub fn response_http_body(&self) -> Option<At> {
        self.binding.as_ref()?.0.response_http_body
    }

    pub fn json<'a>(&'a self, config: &'a FilterConfig) -> &'a JsonOptions {
        self.json.as_ref().unwrap_or(&config.json)
    }
}

/// Per-request JSON options from a comma-separated list of their names
/// (`emit_defaults,int64_as_number,...`); unknown names are an error.
pub fn json_options_from(list: &str) -> Result<JsonOptions, String> {
    let mut options = JsonOptions::default();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let flag = match name {
            "emit_defaults" => &mut options.emit_defaults,
            "int64_as_number" => &mut options.int64_as_number,
            "enums_as_numbers" => &mut options.enums_as_numbers,
            "proto_field_names" => &mut options.proto_field_names,
            "ignore_unknown_fields" => &mut options.ignore_unknown_fields,
            other => return Err(format!("unknown JSON option '{other}'")),
        };
        *flag = true;
    }
    Ok(options)
}

/// Does the request body carry a stream of messages (client or bidi streaming)?
pub fn streams_requests(route: &Route) -> bool {
    matches!(
        route.method.streaming(),
        StreamingKind::ClientStreaming | StreamingKind::Bidirectional
    )
}

/// 413 for a request body over `max_request_bytes`.
pub(crate) fn check_request_size(config: &FilterConfig, body: &[u8]) -> Result<(), Reply> {
    if body.len() > config.max_request_bytes {
        return Err(too_large(
            config,
            "request",
            body.len(),
            config.max_request_bytes,
        ));
    }
    Ok(())
}

/// The request body as the bare protobuf message (callouts: the host frames it).
pub fn encode_message(config: &FilterConfig, route: &Route, body: &[u8]) -> Result<Vec<u8>, Reply> {
    check_request_size(config, body)?;
    let input = route.method.input_type();
    let options = route.json(config);
    let message = match &route.binding {
        Some((binding, vars, query)) => {
            let body = (body, route.content_type.as_deref());
            request_message(binding, vars.clone(), query, body, options)
        }
        None if body.iter().all(u8::is_ascii_whitespace) => Ok(Vec::new()),
        None => input
            .json_to_protobuf(body, options)
            .map_err(|e| e.to_string()),
    };
    message.map_err(|message| bad_request(config, message))
}

/// The request line's part of the request (path variables, query), checked
/// at the request headers: 400 for what `encode_message` would refuse
/// there anyway.
pub fn check_request_line(config: &FilterConfig, route: &Route) -> Result<(), Reply> {
    let Some((binding, vars, query)) = &route.binding else {
        return Ok(());
    };
    check_line(binding, vars.clone(), query).map_err(|message| bad_request(config, message))
}

/// One response message (bare protobuf) as JSON, cut to `response_body`.
pub fn decode_message(
    config: &FilterConfig,
    route: &Route,
    message: &[u8],
) -> Result<String, Status> {
    let printed = route
        .method
        .output_type()
        .protobuf_to_json(message, route.json(config))
        .map_err(|e| Status::new(e.response_code(), e.to_string()))?;
    Ok(match &route.binding {
        Some((binding, _, _)) => response_part(binding, &printed),
        None => printed,
    })
}

/// The reply for a finished call whose messages were printed one by one:
/// like [`decode_response`](super::transcode::decode_response), from already decoded messages.
pub fn reply_from_messages(
    config: &FilterConfig,
    route: &Route,
    mut messages: Vec<String>,
    status: &Status,
) -> Reply {
    let streaming = matches!(
        route.method.streaming(),
        StreamingKind::ServerStreaming | StreamingKind::Bidirectional
    );
    // The filter's own call in transcoding mode (Envoy, a bodiless
    // binding) answers with the lines or events a stream would have sent;
    // a callout answers one array, as its README says.
    if streaming
        && config.callout.is_none()
        && config.stream_format != StreamFormat::Array
        && (status.is_ok() || !messages.is_empty())
    {
        let mut text = String::new();
        for message in &messages {
            push_event(config, &mut text, None, message);
        }
        text.push_str(&stream_end(config, status));
        return Reply {
            http_status: status.code.to_http_status(),
            code: status.code,
            ..Reply::raw(RawBody {
                content_type: stream_content_type(config).to_string(),
                data: text.into_bytes(),
            })
        };
    }
    if !status.is_ok() {
        if streaming && !messages.is_empty() {
            messages.push(format!(
                "{{\"error\":{}}}",
                status_to_json(&config.registry, status, &config.json)
            ));
            return Reply {
                http_status: status.code.to_http_status(),
                body: format!("[{}]", messages.join(",")),
                code: status.code,
                raw: None,
            };
        }
        return Reply::error(config, status);
    }
    if streaming {
        return Reply::ok(format!("[{}]", messages.join(",")));
    }
    if messages.len() == 1 {
        return Reply::ok(messages.remove(0));
    }
    Reply::error(
        config,
        &Status::new(
            Code::Internal,
            format!("expected one response message, got {}", messages.len()),
        ),
    )
}

/// Whether this route's response goes out message by message (server and
/// bidi streams).
pub fn streams_response(config: &FilterConfig, route: &Route) -> bool {
    matches!(
        route.method.streaming(),
        StreamingKind::ServerStreaming | StreamingKind::Bidirectional
    ) && config.stream_format != StreamFormat::Array
}

/// The content type of a streamed response.
pub fn stream_content_type(config: &FilterConfig) -> &'static str {
    match config.stream_format {
        StreamFormat::Sse => "text/event-stream",
        _ => NDJSON,
    }
}

/// The messages complete in `decoder` after `chunk`, formatted for the
/// client, and the error that ends the stream when one cannot be read:
/// the messages before it still leave.
pub fn stream_piece(
    config: &FilterConfig,
    route: &Route,
    decoder: &mut FrameDecoder,
    chunk: &[u8],
) -> (String, Option<Status>) {
    decoder.push(chunk);
    // What one chunk releases is held in memory until the host takes the
    // piece: however many frames it holds, they inflate to one budget.
    decoder.limit_total(config.max_response_bytes);
    let mut out = String::new();
    loop {
        let json = match decoder.next_message() {
            Ok(Some(message)) => decode_message(config, route, &message),
            Ok(None) => return (out, None),
            Err(e) => Err(Status::from(e)),
        };
        match json {
            Ok(json) => push_event(config, &mut out, None, &json),
            Err(status) => return (out, Some(status)),
        }
    }
}

/// The last piece of a streamed response: nothing after success, else the
/// error as one more line or event (`{"error": {code, message, details}}`).
pub fn stream_end(config: &FilterConfig, status: &Status) -> String {
    let mut out = String::new();
    if !status.is_ok() {
        let error = format!(
            "{{\"error\":{}}}",
            status_to_json(&config.registry, status, &config.json)
        );
        push_event(config, &mut out, Some("error"), &error);
    }
    out
}

pub(crate) fn push_event(config: &FilterConfig, out: &mut String, event: Option<&str>, json: &str) {
    if config.stream_format == StreamFormat::Sse {
        if let Some(name) = event {
            out.push_str("event: ");
            out.push_str(name);
            out.push('\n');
        }
        out.push_str("data: ");
        out.push_str(json);
        out.push_str("\n\n");
    } else {
        out.push_str(json);
        out.push('\n');
    }
}
