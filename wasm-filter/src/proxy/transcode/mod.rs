//! Transcoding mode, free of any host: decide what a request is (which
//! method, which binding, or not ours), turn its JSON into gRPC frames (a
//! client stream's body into one frame per message), and turn the gRPC
//! response (frames + status) into JSON with an HTTP status.

use crate::code::Code;
use crate::error::Error;
use crate::framing::{encode_frame_into, Compression, FrameDecoder, FrameError, HEADER_LEN};
use crate::status::Status;

use super::config::FilterConfig;
use super::json_values::{check_whole, each_value, ValueError};
use super::messages::{
    check_request_size, decode_message, encode_message, reply_from_messages, streams_requests,
    Route,
};
use super::reply::{bad_request, response_too_large, Reply};
use crate::http_rule::{body_message, line_parts, path_verb, Binding, PathVars, RequestPath};
use std::cmp::Ordering;

/// What to do with a request.
// One per request, moved once: boxing the route would cost an allocation
// per request to save bytes on the stack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Plan {
    /// Not ours (already gRPC, or a path that names no method): leave it alone.
    PassThrough,
    /// JSON for this method: transcode both ways.
    Transcode(Route),
    /// Answer at once.
    Reply(Reply),
}

/// Whether a request is gRPC already (`application/grpc`, `+proto`,
/// `+json`): it passes through untouched.
pub fn is_native_grpc(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// Decides from the request line and content type: `POST` at the path of
/// a method without bindings, else a `google.api.http` binding, else
/// `POST /pkg.Service/Method` of any method.
pub fn plan(
    config: &FilterConfig,
    http_method: &str,
    full_path: &str,
    content_type: Option<&str>,
) -> Plan {
    if is_native_grpc(content_type) {
        return Plan::PassThrough;
    }
    let (path, query) = full_path.split_once('?').unwrap_or((full_path, ""));
    if let Some(openapi) = &config.openapi {
        if path == openapi.path && matches!(http_method, "GET" | "HEAD") {
            return Plan::Reply(Reply::ok(openapi.document.clone()));
        }
    }
    // Trailing slashes aside, as Envoy's path matcher sets them aside.
    let at_its_path = if http_method == "POST" {
        config.methods.get(path.trim_end_matches('/'))
    } else {
        None
    };
    // Envoy's auto_mapping binds a method without bindings to POST at its
    // path: a literal path, which no template outranks.
    let auto_mapped = at_its_path.is_some_and(|m| {
        !config.bound_paths.contains(m.path()) && config.exposes(m.service_name())
    });
    let chosen = if auto_mapped {
        None
    } else {
        chosen_binding(config, http_method, path)
    };
    if let Some((binding, vars)) = chosen {
        let vars = match vars {
            Ok(vars) => vars,
            Err(message) => return Plan::Reply(bad_request(config, message)),
        };
        let mut route = Route::new(
            binding.method.clone(),
            Some((binding.clone(), vars, query_text(config, query))),
        );
        if binding.request_http_body.is_some() {
            route.content_type = content_type.map(str::to_string);
        }
        return Plan::Transcode(route);
    }
    if http_method != "POST" {
        return unbound(config, http_method, path);
    }
    let found = match at_its_path {
        Some(method) => Ok(method.clone()),
        None => config.registry.method(path),
    };
    match found {
        Ok(method) if !config.exposes(method.service_name()) => not_found(config, path),
        // A client stream's messages are a JSON array, or JSON values one
        // after another (see `encode_request`).
        Ok(method) => Plan::Transcode(Route::new(method, None)),
        Err(Error::UnknownService(_) | Error::UnknownMethod(_))
            if config.reject_unknown_methods =>
        {
            not_found(config, path)
        }
        // A trusted embedder (the OpenResty shim) has no route to pass to.
        Err(_)
            if config
                .callout
                .as_ref()
                .is_some_and(|c| c.upstream_header.is_some()) =>
        {
            Plan::Reply(Reply::error_with_http(
                config,
                &Status::new(
                    Code::Unimplemented,
                    "the module does not handle this path (it is not /package.Service/Method)",
                ),
                404,
            ))
        }
        Err(_) => unbound(config, http_method, path),
    }
}

/// The binding Envoy's transcoder would choose for this request, and the
/// variables of its path: of those that take the HTTP method and match
/// the path, the first by [`Binding::precedence`], never by the order they
/// were declared in (`/v1/users/me` beside `/v1/users/{id}` is `me`'s
/// whichever comes first). A path bound twice alike is bound to nothing.
fn chosen_binding<'a>(
    config: &'a FilterConfig,
    http_method: &str,
    path: &str,
) -> Option<(&'a Binding, Result<PathVars, String>)> {
    let verb = path_verb(path)
        .is_some_and(|v| config.bindings.iter().any(|b| b.template.verb() == Some(v)));
    let request = RequestPath::parse(path, verb)?;
    let mut chosen: Option<(&Binding, Vec<(usize, usize)>)> = None;
    let mut tied = false;
    for binding in config.bindings.iter().filter(|b| b.takes(http_method)) {
        let Some(spans) = binding.spans(&request) else {
            continue;
        };
        let order = chosen
            .as_ref()
            .map_or(Ordering::Less, |(best, _)| binding.precedence(best));
        match order {
            Ordering::Less => {
                chosen = Some((binding, spans));
                tied = false;
            }
            Ordering::Equal => tied = true,
            Ordering::Greater => {}
        }
    }
    let (binding, spans) = chosen.filter(|_| !tied)?;
    let vars = binding
        .template
        .bind(&request, &spans, config.url_unescape_spec);
    Some((binding, vars))
}

/// The query string as the bindings read it (percent-decoding, RFC 3986):
/// a `+` stays a `+` unless `query_param_unescape_plus` makes it a space.
fn query_text(config: &FilterConfig, query: &str) -> String {
    if config.query_param_unescape_plus {
        query.replace('+', "%20")
    } else {
        query.to_string()
    }
}

/// A request that names neither a binding nor a method: the filter's 404
/// under `reject_unknown_methods` (as Envoy's `reject_unknown_method`),
/// else the route's upstream gets it as it came.
fn unbound(config: &FilterConfig, http_method: &str, path: &str) -> Plan {
    if !config.reject_unknown_methods {
        return Plan::PassThrough;
    }
    Plan::Reply(Reply::error_with_http(
        config,
        &Status::new(
            Code::NotFound,
            format!("no method is bound to {http_method} {path}"),
        ),
        404,
    ))
}

/// A gRPC path the protos lack: gRPC's own code for an unknown method,
/// UNIMPLEMENTED, as every gRPC server and the other hosts answer it; over
/// HTTP a 404, as for any path with nothing behind it.
fn not_found(config: &FilterConfig, path: &str) -> Plan {
    Plan::Reply(Reply::error_with_http(
        config,
        &Status::new(Code::Unimplemented, format!("unknown method '{path}'")),
        404,
    ))
}

/// The request body (JSON; empty means `{}`), with path variables and query
/// parameters of an HTTP binding, as gRPC frames: one, or for a client
/// stream one per message of the body (see [`each_message`]).
pub fn encode_request(config: &FilterConfig, route: &Route, body: &[u8]) -> Result<Vec<u8>, Reply> {
    let mut frames = Vec::new();
    if !streams_requests(route) {
        let message = encode_message(config, route, body)?;
        frame_into(config, &message, &mut frames)?;
        return Ok(frames);
    }
    check_request_size(config, body)?;
    let options = route.json(config);
    // The request line's fields, read once, go with every message.
    let (before, after) = match &route.binding {
        Some((binding, vars, query)) => line_parts(binding, vars.clone(), query, options)
            .map_err(|message| bad_request(config, message))?,
        None => (Vec::new(), Vec::new()),
    };
    let mut frame = |value: &[u8]| {
        let body = match &route.binding {
            Some((binding, _, _)) => body_message(binding, (value, None), options),
            None => route
                .method
                .input_type()
                .json_to_protobuf(value, options)
                .map_err(|e| e.to_string()),
        }
        .map_err(|message| bad_request(config, message))?;
        let mut message = Vec::with_capacity(before.len() + body.len() + after.len());
        message.extend_from_slice(&before);
        message.extend_from_slice(&body);
        message.extend_from_slice(&after);
        // The messages together stay within the body's limit: tiny JSON
        // values (`{}`), each given the request line's fields, would
        // otherwise grow without bound.
        let size = frames.len().saturating_add(HEADER_LEN + message.len());
        if size > config.max_request_bytes {
            let status = Status::new(
                Code::ResourceExhausted,
                format!(
                    "a client stream's messages come to more than max_request_bytes ({} bytes) of protobuf",
                    config.max_request_bytes
                ),
            );
            return Err(Reply::error_with_http(config, &status, 413));
        }
        frame_into(config, &message, &mut frames)
    };
    each_message(body, &mut frame).map_err(|e| e.reply(config))?;
    Ok(frames)
}

/// Appends `message` as one uncompressed gRPC frame: the filter never
/// compresses, which also keeps the deflate encoder out of the module.
fn frame_into(config: &FilterConfig, message: &[u8], frames: &mut Vec<u8>) -> Result<(), Reply> {
    encode_frame_into(message, frames).map_err(|e| {
        Reply::error_with_http(config, &Status::new(Code::Internal, e.to_string()), 500)
    })
}

/// Why a client stream's body was refused.
enum StreamBodyError {
    /// Its JSON, as the client must fix it.
    Json(String),
    /// What a message's transcoding answered.
    Message(Reply),
}

impl StreamBodyError {
    fn reply(self, config: &FilterConfig) -> Reply {
        match self {
            StreamBodyError::Json(message) => bad_request(config, message),
            StreamBodyError::Message(reply) => reply,
        }
    }
}

/// Calls `each` with every message of a client stream's whole body: the
/// elements of one JSON array (Envoy's framing), or JSON values one after
/// another (newline-delimited JSON, as a callout streams them). Elements
/// are handed on as they are read, never gathered first.
fn each_message(
    body: &[u8],
    each: &mut dyn FnMut(&[u8]) -> Result<(), Reply>,
) -> Result<(), StreamBodyError> {
    let first = body.iter().position(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|at| body[at] == b'[') {
        return array_elements(body, each);
    }
    let used = each_value(body, each).map_err(|e| match e {
        ValueError::Json(message) => StreamBodyError::Json(message),
        ValueError::Each(reply) => StreamBodyError::Message(reply),
    })?;
    check_whole(&body[used..]).map_err(StreamBodyError::Json)
}

/// The elements of the JSON array `body`, each as its own text (serde_json
/// reads the array; each element is a `RawValue`, borrowed, not parsed).
fn array_elements(
    body: &[u8],
    each: &mut dyn FnMut(&[u8]) -> Result<(), Reply>,
) -> Result<(), StreamBodyError> {
    use serde::de::{Deserializer as _, SeqAccess, Visitor};

    struct Elements<'f> {
        each: &'f mut dyn FnMut(&[u8]) -> Result<(), Reply>,
        failed: Option<Reply>,
    }
    impl<'de> Visitor<'de> for &mut Elements<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of messages")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(element) = seq.next_element::<&serde_json::value::RawValue>()? {
                if let Err(reply) = (self.each)(element.get().as_bytes()) {
                    self.failed = Some(reply);
                    return Err(serde::de::Error::custom("a message was refused"));
                }
            }
            Ok(())
        }
    }
    let mut elements = Elements { each, failed: None };
    let body = without_trailing_comma(body);
    let mut reader = serde_json::Deserializer::from_slice(&body);
    let read = (&mut reader)
        .deserialize_seq(&mut elements)
        .and_then(|()| reader.end());
    match (read, elements.failed) {
        (_, Some(reply)) => Err(StreamBodyError::Message(reply)),
        (Ok(()), None) => Ok(()),
        (Err(e), None) => Err(StreamBodyError::Json(format!("invalid JSON: {e}"))),
    }
}

/// The array `body` without one comma right before its closing bracket
/// (`[{..},\n{..},\n]`): Envoy's transcoder reads a message stream so,
/// and clients that write one message a line send it. Nothing else
/// changes: a comma there cannot be inside a string.
fn without_trailing_comma(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let trimmed = body.trim_ascii_end();
    let Some(inner) = trimmed.strip_suffix(b"]") else {
        return body.into();
    };
    let inner = inner.trim_ascii_end();
    match inner.strip_suffix(b",") {
        // An element must come before it: `[,]` stays an error.
        Some(before) if !before.trim_ascii_end().ends_with(b"[") => {
            let mut fixed = before.to_vec();
            fixed.push(b']');
            fixed.into()
        }
        _ => body.into(),
    }
}

/// The whole gRPC response body and its final status as the JSON reply:
/// the message for a unary method, an array of messages for a streaming one.
/// A streaming error after messages keeps them and ends the array with
/// `{"error": {code, message, details}}`.
pub fn decode_response(
    config: &FilterConfig,
    route: &Route,
    body: &[u8],
    encoding: Compression,
    status: &Status,
) -> Reply {
    match decode_messages(config, route, body, encoding) {
        Ok(messages) => reply_from_messages(config, route, messages, status),
        // Undecodable messages before a failure: the failure is the news.
        Err(_) if !status.is_ok() => Reply::error(config, status),
        Err(Undecodable::TooLarge(error)) => response_too_large(config, &error),
        Err(Undecodable::Other(error)) => Reply::error(config, &error),
    }
}

/// Why a response body did not decode: over a limit (413, as every
/// response over its limit), or anything else.
enum Undecodable {
    TooLarge(Status),
    Other(Status),
}

impl From<FrameError> for Undecodable {
    fn from(e: FrameError) -> Undecodable {
        let too_large = matches!(
            e,
            FrameError::MessageTooLarge { .. } | FrameError::TotalTooLarge { .. }
        );
        let status = Status::from(e);
        if too_large {
            Undecodable::TooLarge(status)
        } else {
            Undecodable::Other(status)
        }
    }
}

fn decode_messages(
    config: &FilterConfig,
    route: &Route,
    body: &[u8],
    encoding: Compression,
) -> Result<Vec<String>, Undecodable> {
    let mut decoder = FrameDecoder::new(config.max_response_bytes, encoding);
    decoder.limit_total(config.max_response_bytes);
    decoder.push(body);
    let mut out = Vec::new();
    while let Some(message) = decoder.next_message()? {
        out.push(decode_message(config, route, &message).map_err(Undecodable::Other)?);
    }
    decoder.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::protobuf_to_json;
    use crate::json::JsonOptions;
    use crate::proxy::messages::*;
    use crate::proxy::reply::*;

    fn config() -> FilterConfig {
        let cfg = serde_json::json!({"protos": {
            "helloworld.proto": include_str!("../../../../protos/helloworld.proto"),
            "route_guide.proto": include_str!("../../../../protos/route_guide.proto"),
        }, "max_request_bytes": 64, "stream_format": "array"});
        FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()
    }

    fn transcode(plan: Plan) -> Route {
        match plan {
            Plan::Transcode(r) => r,
            other => panic!("expected transcoding, got {other:?}"),
        }
    }

    /// A configuration of one service whose bindings overlap, the broader
    /// ones declared first.
    fn overlapping() -> FilterConfig {
        let proto = r#"syntax = "proto3";
package o;
import "google/api/annotations.proto";
message Id { string id = 1; string path = 2; }
service S {
  rpc GetUser(Id) returns (Id) { option (google.api.http) = { get: "/v1/users/{id}" }; }
  rpc GetMe(Id) returns (Id) { option (google.api.http) = { get: "/v1/users/me" }; }
  rpc Files(Id) returns (Id) { option (google.api.http) = { get: "/v1/files/{path=**}" }; }
  rpc Latest(Id) returns (Id) { option (google.api.http) = { get: "/v1/files/{id}/latest" }; }
  rpc Move(Id) returns (Id) { option (google.api.http) = { post: "/v1/users/{id}:move" }; }
  rpc Update(Id) returns (Id) { option (google.api.http) = { post: "/v1/{path=users/*}" }; }
  rpc Archive(Id) returns (Id) { option (google.api.http) = { post: "/v1/users/archive" }; }
  rpc Any(Id) returns (Id) { option (google.api.http) = { custom { kind: "*" path: "/v1/any/{id}" } }; }
  rpc GetAny(Id) returns (Id) { option (google.api.http) = { get: "/v1/any/{id}" }; }
  rpc AnyRun(Id) returns (Id) { option (google.api.http) = { custom { kind: "*" path: "/v1/any/{id}:run" } }; }
  rpc TwinA(Id) returns (Id) { option (google.api.http) = { get: "/v1/twins/{id}" }; }
  rpc TwinB(Id) returns (Id) { option (google.api.http) = { get: "/v1/twins/{path}" }; }
  rpc Ping(Id) returns (Id);
  rpc Catch(Id) returns (Id) { option (google.api.http) = { post: "/{path=**}" body: "*" }; }
  rpc NoPattern(Id) returns (Id) { option (google.api.http) = { body: "*" }; }
}"#;
        let cfg = serde_json::json!({"protos": {"o.proto": proto}});
        FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap()
    }

    /// The method a request reaches and its path variables, or None.
    fn reached(c: &FilterConfig, http_method: &str, path: &str) -> Option<(String, PathVars)> {
        match plan(c, http_method, path, None) {
            Plan::Transcode(route) => {
                let vars = route.binding.map(|(_, vars, _)| vars).unwrap_or_default();
                Some((route.method.name().to_string(), vars))
            }
            _ => None,
        }
    }

    #[test]
    fn a_method_without_bindings_outranks_every_template_at_its_path() {
        let c = overlapping();
        let path = |p: &str| vec![(vec!["path".to_string()], p.to_string())];
        // Envoy's auto_mapping: a literal path. Before, the catch-all took it.
        assert_eq!(
            reached(&c, "POST", "/o.S/Ping"),
            Some(("Ping".into(), vec![]))
        );
        // Trailing slashes aside, as Envoy's matcher sets them aside.
        assert_eq!(
            reached(&c, "POST", "/o.S/Ping//"),
            Some(("Ping".into(), vec![]))
        );
        // The option declared, though with no pattern: not auto-mapped.
        assert_eq!(
            reached(&c, "POST", "/o.S/NoPattern"),
            Some(("Catch".into(), path("o.S/NoPattern")))
        );
        // A method with bindings has none at its path: the template takes it.
        assert_eq!(
            reached(&c, "POST", "/o.S/GetMe"),
            Some(("Catch".into(), path("o.S/GetMe")))
        );
        assert_eq!(
            reached(&c, "POST", "/o.S/Pong"),
            Some(("Catch".into(), path("o.S/Pong")))
        );
    }

    #[test]
    fn bindings_are_chosen_as_envoys_path_matcher_chooses_them() {
        let c = overlapping();
        let var = |name: &str, value: &str| (vec![name.to_string()], value.to_string());
        let cases = [
            // A literal segment before a variable, whatever came first.
            ("GET", "/v1/users/me", "GetMe", vec![]),
            ("GET", "/v1/users/ann", "GetUser", vec![var("id", "ann")]),
            // `*` before `**`; `**` takes what `*` cannot.
            ("GET", "/v1/files/a/latest", "Latest", vec![var("id", "a")]),
            (
                "GET",
                "/v1/files/a/b/latest",
                "Files",
                vec![var("path", "a/b/latest")],
            ),
            // `*` takes the empty segment of `//`; trailing `/`s are dropped.
            ("GET", "/v1/files//latest", "Latest", vec![var("id", "")]),
            ("GET", "/v1/users/ann//", "GetUser", vec![var("id", "ann")]),
            // A registered verb is split off; then literals still come first.
            ("POST", "/v1/users/ann:move", "Move", vec![var("id", "ann")]),
            ("POST", "/v1/users/archive", "Archive", vec![]),
            (
                "POST",
                "/v1/users/bob",
                "Update",
                vec![var("path", "users/bob")],
            ),
            // An exact HTTP method before `*`; `*` takes the others.
            ("GET", "/v1/any/1", "GetAny", vec![var("id", "1")]),
            ("DELETE", "/v1/any/1", "Any", vec![var("id", "1")]),
            // Envoy keys a binding by method and verb, and falls back to a
            // bare `*`: a `*` binding takes any verb, one with a verb none.
            ("POST", "/v1/any/1:run", "Any", vec![var("id", "1")]),
        ];
        for (http_method, path, method, vars) in cases {
            assert_eq!(
                reached(&c, http_method, path),
                Some((method.to_string(), vars)),
                "{http_method} {path}"
            );
        }
        // A path and HTTP method bound twice alike is bound to neither, as
        // in Envoy: the filter's 404, never the first declared.
        assert_eq!(reached(&c, "GET", "/v1/twins/1"), None);
        let Plan::Reply(r) = plan(&c, "GET", "/v1/twins/1", None) else {
            panic!()
        };
        assert_eq!((r.http_status, r.code), (404, Code::NotFound));
        // The operator is told when the configuration loads.
        assert_eq!(
            c.left_out,
            [
                "/o.S/NoPattern: a google.api.http rule without a pattern (get, put, post, delete, patch or custom)",
                "/o.S/TwinB (GET /v1/twins/*): /o.S/TwinA binds the same paths, and Envoy binds such a path to neither"
            ]
        );
    }

    #[test]
    fn plans() {
        let c = config();
        assert_eq!(
            transcode(plan(
                &c,
                "POST",
                "/helloworld.Greeter/SayHello",
                Some("application/json")
            ))
            .method
            .name(),
            "SayHello"
        );
        assert!(matches!(
            plan(
                &c,
                "POST",
                "/helloworld.Greeter/SayHello",
                Some("application/grpc+proto")
            ),
            Plan::PassThrough
        ));
        // A request that names no method nor binding is the filter's 404,
        // whatever its HTTP method (reject_unknown_methods, the default) ...
        for (method, path) in [("GET", "/healthz"), ("POST", "/upload"), ("DELETE", "/x/y")] {
            let Plan::Reply(r) = plan(&c, method, path, None) else {
                panic!("{method} {path}")
            };
            assert_eq!((r.http_status, r.code), (404, Code::NotFound));
            assert_eq!(
                r.body,
                format!(
                    r#"{{"code":5,"message":"no method is bound to {method} {path}","details":[]}}"#
                )
            );
        }
        // ... or goes to the route's upstream as it came.
        let cfg = serde_json::json!({"protos": {"h.proto": include_str!("../../../../protos/helloworld.proto")},
                                     "reject_unknown_methods": false});
        let open = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        for (method, path) in [("GET", "/healthz"), ("POST", "/upload")] {
            assert!(matches!(plan(&open, method, path, None), Plan::PassThrough));
        }
        let Plan::Reply(r) = plan(&c, "POST", "/helloworld.Greeter/SayBye", None) else {
            panic!()
        };
        assert_eq!(r.http_status, 404);
        assert_eq!(
            r.body,
            r#"{"code":12,"message":"unknown method '/helloworld.Greeter/SayBye'","details":[]}"#
        );
        // A client stream's messages: a JSON array (Envoy's framing) or
        // JSON values one after another, a frame each.
        let Plan::Transcode(stream) = plan(&c, "POST", "/routeguide.RouteGuide/RecordRoute", None)
        else {
            panic!()
        };
        let two = b"\0\0\0\0\x02\x08\x01\0\0\0\0\x02\x10\x02".to_vec();
        for body in [
            &br#" [{"latitude":1}, {"longitude":2}] "#[..],
            br#"{"latitude":1}
{"longitude":2}"#,
            // One comma after the last message, as Envoy takes it.
            b"[ {\"latitude\":1},\n {\"longitude\":2},\n] \n",
        ] {
            assert_eq!(encode_request(&c, &stream, body).unwrap(), two);
        }
        for empty in [&b""[..], b"[]", b" \n"] {
            assert_eq!(encode_request(&c, &stream, empty).unwrap(), b"");
        }
        for (body, message) in [
            (
                &br#"[{"latitude":1},"#[..],
                "invalid JSON: EOF while parsing a value at line 1 column 16",
            ),
            (
                br#"[{"latitude":1}] {}"#,
                "invalid JSON: trailing characters at line 1 column 18",
            ),
            (
                &b"[ , ]"[..],
                "invalid JSON: expected value at line 1 column 3",
            ),
            (
                b"[{\"latitude\":1},,]",
                "invalid JSON: trailing comma at line 1 column 17",
            ),
            (
                br#"[{"nope":1}]"#,
                "unknown field 'nope' in routeguide.Point",
            ),
            (
                br#"{"latitude":1} {"#,
                "invalid JSON: the request body ends inside a message",
            ),
        ] {
            let r = encode_request(&c, &stream, body).unwrap_err();
            assert_eq!(r.http_status, 400, "{}", r.body);
            let error: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(error["message"], message, "{}", r.body);
        }
        // Together the frames stay within max_request_bytes (64 here): 21
        // empty messages take 64 bytes of JSON and would take 105 of frames.
        let small = config();
        let stream = transcode(plan(
            &small,
            "POST",
            "/routeguide.RouteGuide/RecordRoute",
            None,
        ));
        let tiny = format!("[{}{{}}]", "{},".repeat(11));
        assert_eq!(
            encode_request(&small, &stream, tiny.as_bytes())
                .unwrap()
                .len(),
            12 * 5
        );
        let many = format!("[{}{{}}]", "{},".repeat(20));
        let r = encode_request(&small, &stream, many.as_bytes()).unwrap_err();
        assert_eq!(
            (r.http_status, r.body.as_str()),
            (
                413,
                r#"{"code":8,"message":"a client stream's messages come to more than max_request_bytes (64 bytes) of protobuf","details":[]}"#
            )
        );
    }

    #[test]
    fn requests() {
        let c = config();
        let m = transcode(plan(&c, "POST", "/helloworld.Greeter/SayHello", None));
        assert_eq!(
            encode_request(&c, &m, br#"{"name":"x"}"#).unwrap(),
            b"\0\0\0\0\x03\x0a\x01x"
        );
        assert_eq!(encode_request(&c, &m, b"").unwrap(), b"\0\0\0\0\0");
        let r = encode_request(&c, &m, br#"{"name":1}"#).unwrap_err();
        assert_eq!(
            (r.http_status, r.body.as_str()),
            (
                400,
                r#"{"code":3,"message":"name: expected string, got number","details":[]}"#
            )
        );
        let r = encode_request(&c, &m, &[b' '; 65]).unwrap_err();
        assert_eq!(r.http_status, 413);
        assert!(
            r.body
                .contains("request body of 65 bytes exceeds the limit of 64 bytes"),
            "{}",
            r.body
        );
    }

    #[test]
    fn responses() {
        let c = config();
        let m = transcode(plan(&c, "POST", "/helloworld.Greeter/SayHello", None));
        let ok = decode_response(
            &c,
            &m,
            b"\0\0\0\0\x03\x0a\x01y",
            Compression::Identity,
            &Status::ok(),
        );
        assert_eq!(
            ok,
            Reply {
                http_status: 200,
                body: r#"{"message":"y"}"#.into(),
                code: Code::Ok,
                raw: None,
            }
        );
        let err = decode_response(
            &c,
            &m,
            b"",
            Compression::Identity,
            &Status::new(Code::NotFound, "gone"),
        );
        assert_eq!(
            err,
            Reply {
                http_status: 404,
                body: r#"{"code":5,"message":"gone","details":[]}"#.into(),
                code: Code::NotFound,
                raw: None,
            }
        );
        let truncated = decode_response(
            &c,
            &m,
            b"\0\0\0\0\x09\x0a",
            Compression::Identity,
            &Status::ok(),
        );
        assert_eq!(truncated.http_status, 500);
        let s = transcode(plan(
            &c,
            "POST",
            "/routeguide.RouteGuide/ListFeatures",
            None,
        ));
        let two = [&b"\0\0\0\0\x03\x0a\x01a"[..], b"\0\0\0\0\x03\x0a\x01b"].concat();
        assert_eq!(
            decode_response(&c, &s, &two, Compression::Identity, &Status::ok()).body,
            r#"[{"name":"a"},{"name":"b"}]"#
        );
        let failed = decode_response(
            &c,
            &s,
            &two,
            Compression::Identity,
            &Status::new(Code::Aborted, "late"),
        );
        assert_eq!(
            failed.body,
            r#"[{"name":"a"},{"name":"b"},{"error":{"code":10,"message":"late","details":[]}}]"#
        );
    }

    #[test]
    fn embedders_get_an_answer_for_any_path() {
        let cfg = serde_json::json!({"protos": {"h.proto": include_str!("../../../../protos/helloworld.proto")},
                                     "callout": {"upstream_header": "x-up"}});
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let Plan::Reply(r) = plan(&c, "POST", "not a path", None) else {
            panic!()
        };
        assert_eq!((r.http_status, r.code), (404, Code::Unimplemented));
        let Plan::Reply(r) = plan(&config(), "POST", "not a path", None) else {
            panic!()
        };
        assert_eq!((r.http_status, r.code), (404, Code::NotFound));
    }

    #[test]
    fn per_request_json_options() {
        let o = json_options_from("emit_defaults, proto_field_names").unwrap();
        assert!(o.emit_defaults && o.proto_field_names && !o.int64_as_number);
        assert_eq!(json_options_from("").unwrap(), JsonOptions::default());
        assert_eq!(
            json_options_from("pretty").unwrap_err(),
            "unknown JSON option 'pretty'"
        );
    }

    #[test]
    fn streamed_responses() {
        let cfg = serde_json::json!({"protos": {"route_guide.proto": include_str!("../../../../protos/route_guide.proto")}});
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let s = transcode(plan(
            &c,
            "POST",
            "/routeguide.RouteGuide/ListFeatures",
            None,
        ));
        assert!(streams_response(&c, &s));
        let mut decoder = FrameDecoder::new(1024, Compression::Identity);
        // A message split across chunks, then two in one chunk.
        assert_eq!(
            stream_piece(&c, &s, &mut decoder, b"\0\0\0\0\x03\x0a"),
            (String::new(), None)
        );
        assert_eq!(
            stream_piece(
                &c,
                &s,
                &mut decoder,
                b"\x01a\0\0\0\0\x03\x0a\x01b\0\0\0\0\0"
            ),
            ("{\"name\":\"a\"}\n{\"name\":\"b\"}\n{}\n".to_string(), None)
        );
        // A message that cannot be read ends the stream; those before it leave.
        let (piece, error) = stream_piece(
            &c,
            &s,
            &mut decoder,
            b"\0\0\0\0\x03\x0a\x01c\0\0\0\0\x01\x0a",
        );
        assert_eq!(piece, "{\"name\":\"c\"}\n");
        assert_eq!(error.map(|e| e.code), Some(Code::Internal));
        assert_eq!(stream_end(&c, &Status::ok()), "");
        assert_eq!(
            stream_end(&c, &Status::new(Code::Aborted, "late")),
            "{\"error\":{\"code\":10,\"message\":\"late\",\"details\":[]}}\n"
        );
        let sse = serde_json::json!({"protos": {"route_guide.proto": include_str!("../../../../protos/route_guide.proto")}, "stream_format": "sse"});
        let c = FilterConfig::from_json(sse.to_string().as_bytes()).unwrap();
        let mut decoder = FrameDecoder::new(1024, Compression::Identity);
        assert_eq!(
            stream_piece(&c, &s, &mut decoder, b"\0\0\0\0\x03\x0a\x01a"),
            ("data: {\"name\":\"a\"}\n\n".to_string(), None)
        );
        assert_eq!(
            stream_end(&c, &Status::new(Code::Aborted, "x")),
            "event: error\ndata: {\"error\":{\"code\":10,\"message\":\"x\",\"details\":[]}}\n\n"
        );
        assert_eq!(stream_content_type(&c), "text/event-stream");
    }

    #[test]
    fn a_trailing_slash_and_an_unregistered_verb_route_as_envoy_routes_them() {
        let cfg = serde_json::json!({"protos": {"library.proto": include_str!("../../../../protos/library.proto")}});
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let request = |method: &str, path: &str| {
            let r = transcode(plan(&c, method, path, None));
            let frame = encode_request(&c, &r, b"").unwrap();
            let json = protobuf_to_json(&r.method.input(), &frame[5..], &Default::default());
            (r.method.name().to_string(), json.unwrap())
        };
        assert_eq!(
            request("GET", "/v1/shelves/1/"),
            ("GetShelf".into(), r#"{"shelf":"1"}"#.into())
        );
        // No binding registers ':frob': it is part of the last segment.
        assert_eq!(
            request("GET", "/v1/shelves/1/books/2:frob"),
            (
                "GetBook".into(),
                r#"{"name":"shelves/1/books/2:frob"}"#.into()
            )
        );
        // A '+' in the query is a '+', unless the option says space.
        assert_eq!(
            request("GET", "/v1/books?author=a+b%2Bc").1,
            r#"{"author":"a+b+c"}"#
        );
        let cfg = serde_json::json!({"protos": {"library.proto": include_str!("../../../../protos/library.proto")},
                                     "query_param_unescape_plus": true});
        let forms = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let r = transcode(plan(&forms, "GET", "/v1/books?author=a+b%2Bc", None));
        let frame = encode_request(&forms, &r, b"").unwrap();
        assert_eq!(
            protobuf_to_json(&r.method.input(), &frame[5..], &Default::default()).unwrap(),
            r#"{"author":"a b+c"}"#
        );
        // ':move' is registered: it selects its binding, and no other.
        assert_eq!(request("POST", "/v1/shelves/1/books/2:move").0, "MoveBook");
        assert!(matches!(
            plan(&c, "GET", "/v1/shelves/1/books/2:move", None),
            Plan::Reply(Reply {
                http_status: 404,
                ..
            })
        ));
    }

    #[test]
    fn http_bindings_route_and_assemble_the_request() {
        let cfg = serde_json::json!({"protos": {"library.proto": include_str!("../../../../protos/library.proto")}});
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let r = transcode(plan(
            &c,
            "PATCH",
            "/v1/shelves/1/books/2?updateMask=title",
            Some("application/json"),
        ));
        assert_eq!(r.method.name(), "UpdateBook");
        let frame = encode_request(&c, &r, br#"{"title":"New"}"#).unwrap();
        let input = r.method.input();
        let json = protobuf_to_json(&input, &frame[5..], &Default::default()).unwrap();
        assert_eq!(
            json,
            r#"{"book":{"name":"shelves/1/books/2","title":"New"},"updateMask":"title"}"#
        );
        assert_eq!(
            transcode(plan(&c, "GET", "/v1/books?author=x", None))
                .method
                .name(),
            "ListBooks"
        );
        assert_eq!(
            transcode(plan(&c, "POST", "/v1/shelves/1/books/2:move", None))
                .method
                .name(),
            "MoveBook"
        );
        assert_eq!(
            transcode(plan(&c, "HEAD", "/v1/shelves/9", None))
                .method
                .name(),
            "HeadShelf"
        );
        assert!(matches!(
            plan(&c, "GET", "/v2/other", None),
            Plan::Reply(Reply {
                http_status: 404,
                ..
            })
        ));
        let bad = transcode(plan(&c, "GET", "/v1/shelves/x/books?page.size=big", None));
        let reply = encode_request(&c, &bad, b"").unwrap_err();
        assert_eq!(reply.http_status, 400);
        assert!(
            reply.body.contains("page.size: expected an integer"),
            "{}",
            reply.body
        );
    }
}
