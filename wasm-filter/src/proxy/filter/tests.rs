//! The filter driven natively through a mock proxy, in the callback orders
//! Envoy and ngx_wasm_module use.

use std::rc::Rc;

use serde_json::{json, Value};

use super::answer::PAUSE;
use super::*;
use crate::code::Code;
use crate::proxy::host::install;
use crate::proxy::host::mock::MockHost;
use crate::status::Status;

const ROOT: u32 = 1;
const HTTP: u32 = 2;
const HELLOWORLD: &str = include_str!("../../../../protos/helloworld.proto");
/// HelloRequest { name: "ann" } and HelloReply { message: "hi ann" }.
const REQUEST: &[u8] = b"\x0a\x03ann";
const REPLY: &[u8] = b"\x0a\x06hi ann";

/// A configured filter with one HTTP stream, on Envoy or ngx_wasm_module.
fn filter(config: Value, ngx: bool) -> Rc<MockHost> {
    let host = Rc::new(MockHost::default());
    if ngx {
        let mut state = host.state.borrow_mut();
        state
            .properties
            .insert(b"ngx\0hostname".to_vec(), b"test".to_vec());
    }
    let config = config.to_string();
    host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    install(host.clone());
    proxy_on_context_create(ROOT, 0);
    let configured = proxy_on_configure(ROOT, config.len() as u32);
    assert_eq!(configured, 1, "{:?}", host.state.borrow().logs);
    proxy_on_context_create(HTTP, ROOT);
    host
}

fn transcoding(ngx: bool) -> Rc<MockHost> {
    filter(json!({"protos": {"helloworld.proto": HELLOWORLD}}), ngx)
}

fn callout(extra: Value, ngx: bool) -> Rc<MockHost> {
    let mut callout = json!({"upstream": "greeter"});
    if let (Some(c), Some(extra)) = (callout.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    filter(
        json!({"protos": {"helloworld.proto": HELLOWORLD}, "callout": callout}),
        ngx,
    )
}

fn frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    frame
}

/// The request headers arrive; returns the filter's action.
fn request_headers(host: &MockHost, extra: &[(&str, &str)], end_of_stream: bool) -> u32 {
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/helloworld.Greeter/SayHello"),
        (":authority", "test"),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    host.set_map(MapType::HttpRequestHeaders, &headers);
    proxy_on_request_headers(HTTP, headers.len() as u32, u32::from(end_of_stream))
}

/// The request body so far (hosts buffer it) arrives.
fn request_body(host: &MockHost, body: &[u8], end_of_stream: bool) -> u32 {
    host.set_buffer_bytes(BufferType::HttpRequestBody, body);
    proxy_on_request_body(HTTP, body.len() as u32, u32::from(end_of_stream))
}

fn response_headers(host: &MockHost, headers: &[(&str, &str)], end_of_stream: bool) -> u32 {
    host.set_map(MapType::HttpResponseHeaders, headers);
    proxy_on_response_headers(HTTP, headers.len() as u32, u32::from(end_of_stream))
}

fn response_body(host: &MockHost, body: &[u8], end_of_stream: bool) -> u32 {
    host.set_buffer_bytes(BufferType::HttpResponseBody, body);
    proxy_on_response_body(HTTP, body.len() as u32, u32::from(end_of_stream))
}

const GRPC_OK: [(&str, &str); 2] = [(":status", "200"), ("content-type", "application/grpc")];

fn response_text(host: &MockHost) -> String {
    let body = host
        .buffer_bytes(BufferType::HttpResponseBody)
        .unwrap_or_default();
    String::from_utf8_lossy(&body).into_owned()
}

/// The one local reply sent: its HTTP status and JSON body.
fn the_reply(host: &MockHost) -> (u32, Value) {
    let state = host.state.borrow();
    let [reply] = state.replies.as_slice() else {
        panic!("expected one reply, got {:?}", state.replies);
    };
    let body = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    (reply.http_status, body)
}

#[test]
fn envoy_a_body_in_chunks_and_a_status_in_trailers() {
    let host = transcoding(false);
    assert_eq!(request_headers(&host, &[], false), CONTINUE);
    let header = |k| host.map_value(MapType::HttpRequestHeaders, k);
    assert_eq!(
        header("content-type").as_deref(),
        Some(&b"application/grpc"[..])
    );
    assert_eq!(header("te").as_deref(), Some(&b"trailers"[..]));
    // The filter inflates gzip answers, so it offers them.
    assert_eq!(
        header("grpc-accept-encoding").as_deref(),
        Some(&b"gzip"[..])
    );
    // The body is held until its end, then replaced by one gRPC frame.
    assert_eq!(request_body(&host, br#"{"name":"#, false), PAUSE);
    assert_eq!(request_body(&host, br#"{"name":"ann"}"#, true), CONTINUE);
    assert_eq!(
        host.buffer_bytes(BufferType::HttpRequestBody),
        Some(frame(REQUEST))
    );

    // The headers wait for the answer, as Envoy's own transcoder holds
    // them: its status is decided at its end.
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    let content_type = || host.map_value(MapType::HttpResponseHeaders, "content-type");
    assert_eq!(content_type().as_deref(), Some(&b"application/grpc"[..]));
    // Envoy buffers what a paused body callback saw; trailers end it.
    let reply = frame(REPLY);
    assert_eq!(response_body(&host, &reply[..4], false), PAUSE);
    assert_eq!(response_body(&host, &reply, false), PAUSE);
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    assert_eq!(proxy_on_response_trailers(HTTP, 1), CONTINUE);
    assert_eq!(response_text(&host), r#"{"message":"hi ann"}"#);
    assert_eq!(content_type().as_deref(), Some(&b"application/json"[..]));
    assert!(host.state.borrow().replies.is_empty());
}

#[test]
fn envoy_a_reply_in_one_chunk_is_read_from_the_host_once() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    let reads = || host.state.borrow().buffer_reads;
    let before = reads();
    assert_eq!(response_body(&host, &frame(REPLY), false), PAUSE);
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    assert_eq!(proxy_on_response_trailers(HTTP, 1), CONTINUE);
    assert_eq!(response_text(&host), r#"{"message":"hi ann"}"#);
    // The chunk's frame header is needed at its callback (is it a large
    // message?): the chunk is read whole there, and not again.
    assert_eq!(reads() - before, 1);
}

#[test]
fn envoy_a_trailers_only_error_is_a_json_error_with_its_http_status() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    let trailers_only = [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "5"),
        ("grpc-message", "no%20such%20greeter"),
    ];
    response_headers(&host, &trailers_only, true);
    let (status, body) = the_reply(&host);
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"code": 5, "message": "no such greeter", "details": []})
    );
}

#[test]
fn envoy_a_body_that_ends_without_trailers_is_internal() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    assert_eq!(response_body(&host, &frame(REPLY), true), CONTINUE);
    let body: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(
        (body["code"].clone(), body["message"].clone()),
        (
            json!(13),
            json!("no grpc-status in the upstream's response")
        )
    );
}

#[test]
fn envoy_an_upstream_that_answers_503_without_grpc_is_unavailable() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &[(":status", "503")], true);
    let (status, body) = the_reply(&host);
    assert_eq!((status, body["code"].clone()), (503, json!(14)));
}

#[test]
fn ngx_wasm_module_sets_the_length_and_a_body_without_trailers_stands() {
    let host = transcoding(true);
    let body = br#"{"name":"ann"}"#;
    let length = body.len().to_string();
    assert_eq!(
        request_headers(&host, &[("content-length", &length)], false),
        CONTINUE
    );
    assert_eq!(request_body(&host, body, true), CONTINUE);
    // nginx sends the length it has: the filter sets the frame's.
    let length = host.map_value(MapType::HttpRequestHeaders, "content-length");
    assert_eq!(length, Some(frame(REQUEST).len().to_string().into_bytes()));
    response_headers(&host, &GRPC_OK, false);
    // No trailers callback there: the end of the body ends the response.
    assert_eq!(response_body(&host, &frame(REPLY), true), CONTINUE);
    assert_eq!(response_text(&host), r#"{"message":"hi ann"}"#);
}

#[test]
fn ngx_wasm_module_an_http1_request_without_a_body_is_refused_at_once() {
    let host = transcoding(true);
    host.state
        .borrow_mut()
        .properties
        .insert(b"request\0protocol".to_vec(), b"HTTP/1.1".to_vec());
    // ngx_wasm_module says a body follows, and never calls the body
    // callback: HTTP/1.1 without a length or chunks has none.
    request_headers(&host, &[], false);
    let (status, body) = the_reply(&host);
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (
            400,
            json!(3),
            json!("a JSON request body is required (use {} for an empty message)")
        )
    );
}

#[test]
fn a_callout_is_answered_from_the_grpc_callbacks() {
    let host = callout(json!({}), false);
    assert_eq!(request_headers(&host, &[], false), PAUSE);
    assert!(host.state.borrow().opened.is_empty());
    assert_eq!(request_body(&host, br#"{"name":"ann"}"#, true), PAUSE);
    let token = {
        let state = host.state.borrow();
        let [call] = state.opened.as_slice() else {
            panic!("expected one call, got {:?}", state.opened);
        };
        assert_eq!(
            (
                call.upstream.as_slice(),
                call.service.as_str(),
                call.method.as_str()
            ),
            (&b"greeter"[..], "helloworld.Greeter", "SayHello")
        );
        // A unary call goes as a stream, for its trailers: one message,
        // then the half-close. The host frames the message itself.
        assert_eq!(call.message, None);
        assert_eq!(state.sent, [(call.token, REQUEST.to_vec())]);
        assert_eq!(state.half_closed, [call.token]);
        call.token
    };
    host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, REPLY);
    proxy_on_grpc_receive(ROOT, token, REPLY.len() as u32);
    // The answer waits for the call's status.
    assert!(host.state.borrow().replies.is_empty());
    host.state.borrow_mut().status = Some((0, Vec::new()));
    proxy_on_grpc_close(ROOT, token, 0);
    assert_eq!(host.state.borrow().effective_context, HTTP);
    assert_eq!(the_reply(&host), (200, json!({"message": "hi ann"})));
}

#[test]
fn a_callout_whose_request_body_never_ends_is_answered_at_its_deadline() {
    let host = callout(json!({"timeout_ms": 500}), false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"#, false);
    host.state.borrow_mut().now_nanos = 400_000_000;
    proxy_on_tick(ROOT);
    assert!(host.state.borrow().replies.is_empty());
    host.state.borrow_mut().now_nanos = 600_000_000;
    proxy_on_tick(ROOT);
    let (status, body) = the_reply(&host);
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (504, json!(4), json!("deadline of 500 ms exceeded"))
    );
    // The end of the body comes too late: no call starts for nobody.
    assert_eq!(request_body(&host, br#"{"name":"ann"}"#, true), PAUSE);
    assert!(host.state.borrow().opened.is_empty());
    assert_eq!(host.state.borrow().replies.len(), 1);
}

#[test]
fn ngx_wasm_module_callouts_are_refused_with_unimplemented() {
    let host = callout(json!({}), true);
    request_headers(&host, &[], false);
    let (status, body) = the_reply(&host);
    assert_eq!((status, body["code"].clone()), (501, json!(12)));
    assert!(host.state.borrow().opened.is_empty());
}

/// A transcoding root that lets requests for no method through.
fn passing_unknown_paths() -> Rc<MockHost> {
    filter(
        json!({"protos": {"helloworld.proto": HELLOWORLD}, "reject_unknown_methods": false}),
        false,
    )
}

#[test]
fn a_request_for_no_method_is_the_filters_404_by_default() {
    let host = transcoding(false);
    host.set_map(
        MapType::HttpRequestHeaders,
        &[(":method", "GET"), (":path", "/healthz")],
    );
    assert_eq!(proxy_on_request_headers(HTTP, 2, 1), PAUSE);
    let (status, body) = the_reply(&host);
    assert_eq!(
        (status, body),
        (
            404,
            json!({"code": 5, "message": "no method is bound to GET /healthz", "details": []})
        )
    );
}

#[test]
fn a_request_for_another_path_passes_through_untouched() {
    let host = passing_unknown_paths();
    host.set_map(
        MapType::HttpRequestHeaders,
        &[(":method", "GET"), (":path", "/healthz")],
    );
    assert_eq!(proxy_on_request_headers(HTTP, 2, 1), CONTINUE);
    assert_eq!(
        host.map_value(MapType::HttpRequestHeaders, ":path")
            .as_deref(),
        Some(&b"/healthz"[..])
    );
    assert!(host.state.borrow().replies.is_empty());
}

#[test]
fn a_stream_answered_from_its_request_body_is_answered_once() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    assert_eq!(request_body(&host, b"{not json", true), PAUSE);
    // Found by the filter fuzz target: a second body callback got a second
    // reply (and the body was transcoded again).
    assert_eq!(request_body(&host, b"{not json", true), PAUSE);
    let (status, body) = the_reply(&host);
    assert_eq!((status, body["code"].clone()), (400, json!(3)));
    assert_eq!(
        host.buffer_bytes(BufferType::HttpRequestBody).as_deref(),
        Some(&b"{not json"[..])
    );
}

#[test]
fn a_query_refused_at_the_request_headers_never_reaches_the_upstream() {
    let host = filter(
        json!({"protos": {"library.proto": include_str!("../../../../protos/library.proto")}}),
        false,
    );
    let deep = vec!["book"; 200].join(".");
    let path = format!("/v1/shelves/1/books?{deep}=1");
    host.set_map(
        MapType::HttpRequestHeaders,
        &[
            (":method", "POST"),
            (":path", &path),
            ("content-type", "application/json"),
        ],
    );
    // Envoy sends the headers upstream as soon as they pass: the refusal
    // must come here, not at the body (where it raced the upstream's own
    // answer to the rewritten request).
    assert_eq!(proxy_on_request_headers(HTTP, 3, 0), PAUSE);
    let (status, body) = the_reply(&host);
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (
            400,
            json!(3),
            json!("query parameter 'book.book.book.book.book.book.book.book....': field path deeper than 100 fields")
        )
    );
    let path_now = host.map_value(MapType::HttpRequestHeaders, ":path");
    assert_eq!(path_now, Some(path.into_bytes()));
}

#[test]
fn a_body_whose_reply_the_host_refuses_is_held_not_forwarded() {
    let host = transcoding(false);
    host.state.borrow_mut().refuse_replies = true;
    request_headers(&host, &[], false);
    // The headers say gRPC already: letting the body on would send the
    // client's own bytes upstream as the gRPC request (issue 26).
    assert_eq!(request_body(&host, b"{not json", true), PAUSE);
    assert_eq!(
        host.buffer_bytes(BufferType::HttpRequestBody).as_deref(),
        Some(&b"{not json"[..]),
        "the body is held as it came, not framed"
    );
    assert_eq!(request_body(&host, b"{not json", true), PAUSE);
    let logs = &host.state.borrow().logs;
    assert!(
        logs.iter()
            .any(|(_, l)| l.contains("the host refused a local reply")),
        "{logs:?}"
    );
}

const TESTING: &str = include_str!("../../../../protos/testing.proto");
const STREAM_THEN_FAIL: &str = "/grpcwasm.testing.Testing/StreamThenFail";
const LARGE: &str = "/grpcwasm.testing.Testing/Large";

fn testing_filter(extra: Value, ngx: bool) -> Rc<MockHost> {
    let mut config = json!({"protos": {"testing.proto": TESTING}});
    if let (Some(c), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    filter(config, ngx)
}

/// A JSON request for `path`, whole in one body callback.
fn json_request(host: &MockHost, path: &str, body: &[u8]) {
    let length = body.len().to_string();
    let headers = [
        (":method", "POST"),
        (":path", path),
        (":authority", "test"),
        ("content-type", "application/json"),
        ("content-length", length.as_str()),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    assert_eq!(proxy_on_request_headers(HTTP, 5, 0), CONTINUE);
    assert_eq!(request_body(host, body, true), CONTINUE);
}

/// The trailers arrive; like Envoy, the host shows a fresh body buffer
/// there, which the filter may write the stream's last line into.
fn response_trailers(host: &MockHost, trailers: &[(&str, &str)]) -> u32 {
    host.set_buffer_bytes(BufferType::HttpResponseBody, b"");
    host.set_map(MapType::HttpResponseTrailers, trailers);
    proxy_on_response_trailers(HTTP, trailers.len() as u32)
}

fn response_header(host: &MockHost, name: &str) -> Option<String> {
    host.map_value(MapType::HttpResponseHeaders, name)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

fn trailer(host: &MockHost, name: &str) -> Option<String> {
    host.map_value(MapType::HttpResponseTrailers, name)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// Item { index: n }.
fn item(n: u8) -> Vec<u8> {
    frame(&[0x08, n])
}

#[test]
fn envoy_a_streamed_response_leaves_message_by_message_and_its_error_last() {
    let host = testing_filter(json!({}), false);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":2}"#);
    // The headers wait for the first message.
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    let content_type = || host.map_value(MapType::HttpResponseHeaders, "content-type");
    assert_eq!(content_type().as_deref(), Some(&b"application/grpc"[..]));
    // A message split across chunks leaves with the chunk that ends it.
    let body = [item(1), item(2)].concat();
    assert_eq!(response_body(&host, &body[..3], false), PAUSE);
    assert_eq!(response_text(&host), "");
    assert_eq!(response_body(&host, &body[3..9], false), CONTINUE);
    assert_eq!(response_text(&host), "{\"index\":1}\n");
    assert_eq!(
        content_type().as_deref(),
        Some(&b"application/x-ndjson"[..])
    );
    assert_eq!(response_body(&host, &body[9..], false), CONTINUE);
    assert_eq!(response_text(&host), "{\"index\":2}\n");
    let failed = [("grpc-status", "5"), ("grpc-message", "gone")];
    assert_eq!(response_trailers(&host, &failed), CONTINUE);
    assert_eq!(
        response_text(&host),
        "{\"error\":{\"code\":5,\"message\":\"gone\",\"details\":[]}}\n"
    );
    // An error stays in the trailers too, for HTTP/2 clients.
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("5"));
}

#[test]
fn envoy_a_stream_that_fails_before_its_first_message_is_its_http_status() {
    let host = testing_filter(json!({}), false);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":0}"#);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    let failed = [("grpc-status", "5"), ("grpc-message", "gone")];
    assert_eq!(response_trailers(&host, &failed), PAUSE);
    let replies = host.state.borrow().replies.clone();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].http_status, 404);
    assert_eq!(
        String::from_utf8_lossy(&replies[0].body),
        r#"{"code":5,"message":"gone","details":[]}"#
    );
}

#[test]
fn envoy_a_streamed_response_that_ends_well_loses_its_status_trailers() {
    let host = testing_filter(json!({}), false);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":1}"#);
    response_headers(&host, &GRPC_OK, false);
    response_body(&host, &item(1), false);
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(trailer(&host, "grpc-status"), None);
}

#[test]
fn envoy_a_streamed_message_that_cannot_be_read_ends_the_stream_with_one_error() {
    let host = testing_filter(json!({}), false);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":3}"#);
    response_headers(&host, &GRPC_OK, false);
    // A varint cut short: the message is not an Item.
    let body = [item(1), frame(&[0x08, 0xff])].concat();
    assert_eq!(response_body(&host, &body, false), CONTINUE);
    let text = response_text(&host);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0], "{\"index\":1}");
    let error: Value = serde_json::from_str(lines[1]).unwrap_or(Value::Null);
    assert_eq!(error["error"]["code"], json!(13), "{text}");
    // What follows is dropped, and the upstream's own error in the
    // trailers does not add a second error line.
    assert_eq!(response_body(&host, &item(3), false), CONTINUE);
    assert_eq!(response_text(&host), "");
    let failed = [("grpc-status", "5"), ("grpc-message", "gone")];
    assert_eq!(response_trailers(&host, &failed), CONTINUE);
    assert_eq!(response_text(&host), "");
}

#[test]
fn envoy_a_response_larger_than_allowed_becomes_the_error_and_the_rest_is_dropped() {
    let host = transcoding_with(json!({"max_response_bytes": 10}));
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    assert_eq!(response_body(&host, &frame(REPLY), false), CONTINUE);
    let error: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(
        (error["code"].clone(), error["message"].clone()),
        (
            json!(8),
            json!("response body of 13 bytes exceeds the limit of 10 bytes")
        )
    );
    assert_eq!(response_body(&host, b"more", false), CONTINUE);
    assert_eq!(response_text(&host), "");
    // The upstream's OK would contradict the body for HTTP/2 clients.
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("8"));
    assert_eq!(
        trailer(&host, "grpc-message").as_deref(),
        Some("response body of 13 bytes exceeds the limit of 10 bytes")
    );
}

#[test]
fn envoy_a_streamed_message_that_cannot_be_read_leaves_no_ok_trailers() {
    let host = testing_filter(json!({}), false);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":2}"#);
    response_headers(&host, &GRPC_OK, false);
    let body = [item(1), frame(&[0x08, 0xff])].concat();
    assert_eq!(response_body(&host, &body, false), CONTINUE);
    let text = response_text(&host);
    let error: Value = serde_json::from_str(text.lines().nth(1).unwrap_or("")).unwrap_or_default();
    let message = error["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!message.is_empty(), "{text}");
    let ok = [("grpc-status", "0"), ("grpc-status-details-bin", "AAAA")];
    assert_eq!(response_trailers(&host, &ok), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("13"));
    let encoded = Status::new(Code::Internal, message).encoded_message();
    assert_eq!(trailer(&host, "grpc-message"), Some(encoded));
    assert_eq!(trailer(&host, "grpc-status-details-bin"), None);
}

#[test]
fn envoy_a_large_message_refused_by_its_header_leaves_no_ok_trailers() {
    let host = testing_filter(json!({"max_response_bytes": 100000}), false);
    json_request(&host, LARGE, br#"{"size":200000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(200_000);
    assert_eq!(response_body(&host, &reply[..70_000], false), CONTINUE);
    let error: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(
        error["message"],
        json!("grpc: received message larger than max (200004 vs. 100000)")
    );
    assert_eq!(response_body(&host, &reply[70_000..], false), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("8"));
}

fn transcoding_with(extra: Value) -> Rc<MockHost> {
    let mut config = json!({"protos": {"helloworld.proto": HELLOWORLD}});
    if let (Some(c), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    filter(config, false)
}

/// LargeReply { payload } framed: a message over the 64 KiB the host holds.
fn large_reply(len: usize) -> Vec<u8> {
    let mut message = vec![0x0a];
    let mut n = len;
    while n >= 0x80 {
        message.push((n as u8) | 0x80);
        n >>= 7;
    }
    message.push(n as u8);
    message.extend(std::iter::repeat_n(b'x', len));
    frame(&message)
}

#[test]
fn envoy_a_large_unary_message_is_carried_by_the_module_and_leaves_whole() {
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":70000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(70_000);
    // Taken out of the host's buffer chunk by chunk, nothing paused: its
    // header said it fits, and the headers left with the first chunk.
    assert_eq!(response_body(&host, &reply[..30_000], false), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(
        response_header(&host, "content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(response_body(&host, &reply[30_000..], false), CONTINUE);
    let json: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    let payload = json["payload"].as_str().unwrap_or_default();
    assert_eq!(payload.len(), 93_336, "base64 of 70,000 bytes");
    // The status after it stays in the trailers; the body is done.
    assert_eq!(response_body(&host, b"", false), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(response_text(&host), "");
}

#[test]
fn envoy_an_answer_over_the_limit_is_a_413_not_a_200() {
    // grpcio sends the headers and the first DATA apart: the headers once
    // left as a 200 before the frame header said 5 MB (issue 49).
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":5000000}"#);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    let reply = large_reply(5_000_000);
    assert_eq!(response_body(&host, &reply[..16_384], false), CONTINUE);
    assert_eq!(response_header(&host, ":status").as_deref(), Some("413"));
    assert_eq!(response_header(&host, "grpc-status").as_deref(), Some("8"));
    assert_eq!(
        response_header(&host, "content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        response_text(&host),
        r#"{"code":8,"message":"grpc: received message larger than max (5000005 vs. 4194304)","details":[]}"#
    );
    // The rest is dropped; the trailers say the same.
    assert_eq!(
        response_body(&host, &reply[16_384..32_768], false),
        CONTINUE
    );
    assert_eq!(response_text(&host), "");
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("8"));
}

#[test]
fn envoy_an_error_in_trailers_after_the_headers_is_the_http_status() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    host.set_map(
        MapType::HttpResponseTrailers,
        &[("grpc-status", "5"), ("grpc-message", "gone")],
    );
    // No body came, so Envoy has none to write the answer into: a local
    // reply, as for a trailers-only error.
    assert_eq!(proxy_on_response_trailers(HTTP, 2), PAUSE);
    let replies = host.state.borrow().replies.clone();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].http_status, 404);
    assert_eq!(
        String::from_utf8_lossy(&replies[0].body),
        r#"{"code":5,"message":"gone","details":[]}"#
    );
}

#[test]
fn envoy_an_error_in_trailers_with_the_reply_refused_is_still_the_http_status() {
    let host = transcoding(false);
    host.state.borrow_mut().refuse_replies = true;
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    // The host refuses the local reply: the held headers go, made the
    // reply's (before, as the upstream sent them: a 200).
    assert_eq!(
        response_trailers(&host, &[("grpc-status", "5"), ("grpc-message", "gone")]),
        CONTINUE
    );
    assert_eq!(response_header(&host, ":status").as_deref(), Some("404"));
    assert_eq!(response_header(&host, "grpc-status").as_deref(), Some("5"));
    assert_eq!(
        response_header(&host, "content-type").as_deref(),
        Some("application/json")
    );
}

#[test]
fn envoy_headers_the_vm_budget_cannot_hold_fail_their_stream_alone() {
    // Less room than one header block: before, the headers went on at
    // once, and an error in the trailers was a 200 with an empty body.
    let host = testing_filter(
        json!({"max_response_bytes": 64, "max_held_response_bytes": 64}),
        false,
    );
    json_request(&host, "/grpcwasm.testing.Testing/Sleep", br#"{}"#);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    assert_eq!(
        the_reply(&host),
        (
            429,
            json!({"code": 8, "details": [], "message": "the proxy holds too many responses at once: 0 bytes for other streams, max_held_response_bytes is 64"})
        )
    );
    assert_eq!(vm_held(), 0);
}

#[test]
fn envoy_a_stream_that_ends_with_its_headers_held_says_why_once() {
    let said = |host: &MockHost| {
        let state = host.state.borrow();
        state
            .logs
            .iter()
            .filter(|(_, l)| l.contains("allow_on_headers_stop_iteration: true"))
            .count()
    };
    // A response whose body came says nothing (the warning is once a VM:
    // this case goes first).
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    response_body(&host, &frame(REPLY)[..3], false);
    proxy_on_delete(HTTP);
    assert_eq!(said(&host), 0);
    let host = transcoding(false);
    for _ in 0..2 {
        request_headers(&host, &[], false);
        request_body(&host, br#"{"name":"ann"}"#, true);
        assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
        // Envoy without allow_on_headers_stop_iteration: nothing follows.
        proxy_on_delete(HTTP);
        proxy_on_context_create(HTTP, ROOT);
    }
    assert_eq!(said(&host), 1, "{:?}", host.state.borrow().logs);
}

#[test]
fn envoy_an_error_in_trailers_after_a_message_is_the_http_status() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    assert_eq!(response_headers(&host, &GRPC_OK, false), PAUSE);
    assert_eq!(response_body(&host, &frame(REPLY), false), PAUSE);
    host.set_map(
        MapType::HttpResponseTrailers,
        &[("grpc-status", "9"), ("grpc-message", "not now")],
    );
    assert_eq!(proxy_on_response_trailers(HTTP, 2), CONTINUE);
    assert_eq!(response_header(&host, ":status").as_deref(), Some("400"));
    assert_eq!(response_header(&host, "grpc-status").as_deref(), Some("9"));
    assert_eq!(
        response_text(&host),
        r#"{"code":9,"message":"not now","details":[]}"#
    );
}

#[test]
fn envoy_a_large_message_cut_by_the_trailers_is_an_error_in_the_trailers() {
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":70000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(70_000);
    assert_eq!(response_body(&host, &reply[..30_000], false), CONTINUE);
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    // The headers left with the first chunk: the trailers say it.
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("13"));
    assert_eq!(
        trailer(&host, "grpc-message").as_deref(),
        Some("the upstream ended the response within a message (30000 of 70009 bytes)")
    );
}

#[test]
fn ngx_wasm_module_a_trailers_only_error_rewrites_the_headers_and_fills_the_body() {
    let host = transcoding(true);
    let body = br#"{"name":"ann"}"#;
    let length = body.len().to_string();
    request_headers(&host, &[("content-length", &length)], false);
    request_body(&host, body, true);
    let trailers_only = [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "5"),
        ("grpc-message", "gone"),
    ];
    // There a local reply from this callback would keep the upstream's
    // headers: the filter makes them the reply's instead.
    assert_eq!(response_headers(&host, &trailers_only, false), CONTINUE);
    let header = |k| {
        host.map_value(MapType::HttpResponseHeaders, k)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    };
    assert_eq!(header(":status").as_deref(), Some("404"));
    assert_eq!(header("grpc-message"), None);
    assert!(host.state.borrow().replies.is_empty());
    // The first chunk becomes the reply's body; the rest is dropped, the
    // last one kept as a blank line so that nginx still ends the body.
    assert_eq!(response_body(&host, b"", false), CONTINUE);
    assert_eq!(
        response_text(&host),
        r#"{"code":5,"message":"gone","details":[]}"#
    );
    assert_eq!(response_body(&host, b"", true), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(response_body(&host, b"late", true), CONTINUE);
    assert_eq!(response_text(&host), "\n");
}

#[test]
fn ngx_wasm_module_reads_the_upstream_trailers_from_nginx_variables() {
    // No trailers callback there: an error after the headers (grpcio sends
    // its initial metadata first when asked) was "expected one response
    // message, got 0", and a stream failing before its first message an
    // empty 200. nginx keeps the trailers as $upstream_trailer_*.
    let host = transcoding(true);
    let body = br#"{"name":"ann"}"#;
    let length = body.len().to_string();
    request_headers(&host, &[("content-length", &length)], false);
    request_body(&host, body, true);
    response_headers(&host, &GRPC_OK, false);
    for (name, value) in [("grpc_status", "5"), ("grpc_message", "gone%21")] {
        let key = format!("ngx\0upstream_trailer_{name}");
        let mut state = host.state.borrow_mut();
        state
            .properties
            .insert(key.into_bytes(), value.as_bytes().to_vec());
    }
    assert_eq!(response_body(&host, b"", true), CONTINUE);
    assert_eq!(
        response_text(&host),
        r#"{"code":5,"message":"gone!","details":[]}"#
    );
}

#[test]
fn ngx_wasm_module_a_body_the_host_will_not_hold_whole_becomes_an_error() {
    let host = transcoding(true);
    let body = br#"{"name":"ann"}"#;
    let length = body.len().to_string();
    request_headers(&host, &[("content-length", &length)], false);
    request_body(&host, body, true);
    response_headers(&host, &GRPC_OK, false);
    let reply = frame(REPLY);
    assert_eq!(response_body(&host, &reply[..4], false), PAUSE);
    // A second chunk before the end: nginx's buffers are full, and a
    // second pause would let the gRPC bytes through.
    assert_eq!(response_body(&host, &reply, false), CONTINUE);
    let error: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(error["code"], json!(8), "{}", response_text(&host));
    assert_eq!(response_body(&host, b"", true), CONTINUE);
    assert_eq!(response_text(&host), "");
}

#[test]
fn envoy_an_error_in_trailers_after_data_becomes_the_body() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    assert_eq!(response_body(&host, &frame(REPLY), false), PAUSE);
    let failed = [("grpc-status", "10"), ("grpc-message", "too%20late")];
    host.set_map(MapType::HttpResponseTrailers, &failed);
    assert_eq!(proxy_on_response_trailers(HTTP, 2), CONTINUE);
    // The 200 has left: the status changes the body, not the HTTP status.
    assert_eq!(
        response_text(&host),
        r#"{"code":10,"message":"too late","details":[]}"#
    );
    assert!(host.state.borrow().replies.is_empty());
}

#[test]
fn envoy_a_request_with_headers_only_is_refused_for_want_of_a_body() {
    let host = transcoding(false);
    assert_eq!(request_headers(&host, &[], true), PAUSE);
    let (status, body) = the_reply(&host);
    assert_eq!((status, body["code"].clone()), (400, json!(3)));
    // The callbacks that follow leave the answered exchange alone.
    assert_eq!(response_headers(&host, &GRPC_OK, false), CONTINUE);
    assert_eq!(response_body(&host, &frame(REPLY), true), CONTINUE);
    assert_eq!(response_text(&host), String::from_utf8_lossy(&frame(REPLY)));
}

/// The request trailers arrive; returns the filter's action.
fn request_trailers(host: &MockHost) -> u32 {
    host.set_map(MapType::HttpRequestTrailers, &[("x-any", "1")]);
    proxy_on_request_trailers(HTTP, 1)
}

fn refused_for_its_trailers(host: &MockHost) {
    let (status, body) = the_reply(host);
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (400, json!(3), json!(REQUEST_TRAILERS))
    );
}

#[test]
fn envoy_a_request_that_ends_with_trailers_is_refused_not_forwarded() {
    let host = transcoding(false);
    assert_eq!(request_headers(&host, &[], false), CONTINUE);
    // A body that is already a gRPC frame, ended by trailers: the body
    // callbacks never see its end.
    assert_eq!(request_body(&host, &frame(REQUEST), false), PAUSE);
    assert_eq!(request_trailers(&host), PAUSE);
    refused_for_its_trailers(&host);
    // Answered once: a repeat changes nothing.
    assert_eq!(request_trailers(&host), PAUSE);
    assert_eq!(host.state.borrow().replies.len(), 1);
}

#[test]
fn envoy_a_callout_request_that_ends_with_trailers_is_refused_and_calls_nothing() {
    let host = callout(json!({}), false);
    assert_eq!(request_headers(&host, &[], false), PAUSE);
    assert_eq!(request_body(&host, br#"{"name":"ann"}"#, false), PAUSE);
    assert_eq!(request_trailers(&host), PAUSE);
    refused_for_its_trailers(&host);
    assert!(host.state.borrow().opened.is_empty());
}

#[test]
fn a_request_the_filter_passes_through_keeps_its_trailers() {
    let host = passing_unknown_paths();
    host.set_map(
        MapType::HttpRequestHeaders,
        &[(":method", "POST"), (":path", "/healthz")],
    );
    assert_eq!(proxy_on_request_headers(HTTP, 2, 0), CONTINUE);
    assert_eq!(request_trailers(&host), CONTINUE);
    assert!(host.state.borrow().replies.is_empty());
}

/// What all the streams of the VM hold now.
fn vm_held() -> usize {
    crate::proxy::held::vm_total()
}

/// A second HTTP stream on the same root, past its request: its response
/// headers have arrived.
fn second_stream(host: &MockHost, id: u32, path: &str) {
    proxy_on_context_create(id, ROOT);
    let headers = [
        (":method", "POST"),
        (":path", path),
        (":authority", "test"),
        ("content-type", "application/json"),
        ("content-length", "2"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    assert_eq!(proxy_on_request_headers(id, 5, 0), CONTINUE);
    host.set_buffer_bytes(BufferType::HttpRequestBody, b"{}");
    assert_eq!(proxy_on_request_body(id, 2, 1), CONTINUE);
    host.set_map(MapType::HttpResponseHeaders, &GRPC_OK);
    // PAUSE for one answer (its headers wait), CONTINUE for a stream.
    proxy_on_response_headers(id, 2, 0);
}

#[test]
fn envoy_a_large_message_costs_what_has_arrived_not_what_its_header_declares() {
    // 1,024 streams whose upstream sent only a header declaring ~4 MiB once
    // made the module reserve 4 GiB and trap (issue 26).
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":4000000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(4_000_000);
    assert_eq!(response_body(&host, &reply[..70_000], false), CONTINUE);
    assert_eq!(vm_held(), 70_000);
    assert_eq!(
        response_body(&host, &reply[70_000..100_000], false),
        CONTINUE
    );
    assert_eq!(vm_held(), 140_000, "doubling, not the declared 4,000,009");
    // Whole, it leaves as JSON and the module holds nothing more.
    assert_eq!(response_body(&host, &reply[100_000..], false), CONTINUE);
    assert!(response_text(&host).starts_with("{\"payload\":\""));
    assert_eq!(vm_held(), 0);
}

#[test]
fn envoy_streams_past_the_vm_budget_fail_alone_with_resource_exhausted() {
    let host = testing_filter(
        json!({"max_response_bytes": 100000, "max_held_response_bytes": 150000}),
        false,
    );
    json_request(&host, LARGE, br#"{"size":90000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(90_000);
    assert_eq!(response_body(&host, &reply[..80_000], false), CONTINUE);
    assert_eq!(vm_held(), 80_000);
    // A second stream finds 80,000 bytes held: 80,000 more pass the budget.
    second_stream(&host, 3, LARGE);
    host.set_buffer_bytes(BufferType::HttpResponseBody, &reply[..80_000]);
    assert_eq!(proxy_on_response_body(3, 80_000, 0), CONTINUE);
    let error: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(
        error,
        json!({"code": 8, "details": [], "message": "the proxy holds too many responses at once: 80000 bytes for other streams, max_held_response_bytes is 150000"})
    );
    assert_eq!(response_header(&host, ":status").as_deref(), Some("429"));
    host.set_buffer_bytes(BufferType::HttpResponseBody, b"");
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    assert_eq!(proxy_on_response_trailers(3, 1), CONTINUE);
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("8"));
    assert_eq!(vm_held(), 80_000, "the refused stream holds nothing");
    // The first goes on, whole.
    assert_eq!(response_body(&host, &reply[80_000..], false), CONTINUE);
    let json: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(json["payload"].as_str().map(str::len), Some(120_000));
    assert_eq!(vm_held(), 0);
    proxy_on_delete(3);
}

#[test]
fn envoy_a_stream_deleted_while_carrying_gives_its_share_back() {
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":90000}"#);
    response_headers(&host, &GRPC_OK, false);
    assert_eq!(
        response_body(&host, &large_reply(90_000)[..70_000], false),
        CONTINUE
    );
    assert_eq!(vm_held(), 70_000);
    proxy_on_delete(HTTP);
    assert_eq!(vm_held(), 0);
}

#[test]
fn envoy_data_after_a_carried_message_is_internal_as_on_the_held_path() {
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":70000}"#);
    response_headers(&host, &GRPC_OK, false);
    let reply = large_reply(70_000);
    assert_eq!(response_body(&host, &reply, false), CONTINUE);
    assert!(response_text(&host).starts_with("{\"payload\":"));
    // A second message after the JSON has left: dropped, and the trailers
    // say what the held path answers a body of two messages with.
    assert_eq!(response_body(&host, &large_reply(3), false), CONTINUE);
    assert_eq!(response_text(&host), "");
    assert_eq!(response_trailers(&host, &[("grpc-status", "0")]), CONTINUE);
    assert_eq!(trailer(&host, "grpc-status").as_deref(), Some("13"));
    assert_eq!(
        trailer(&host, "grpc-message").as_deref(),
        Some("expected one response message, got 2")
    );
}

#[test]
fn envoy_a_second_message_in_the_chunk_that_ends_a_carried_one_is_internal() {
    let host = testing_filter(json!({}), false);
    json_request(&host, LARGE, br#"{"size":70000}"#);
    response_headers(&host, &GRPC_OK, false);
    let mut body = large_reply(70_000);
    body.extend(large_reply(3));
    assert_eq!(response_body(&host, &body, false), CONTINUE);
    let error: Value = serde_json::from_str(&response_text(&host)).unwrap_or(Value::Null);
    assert_eq!(
        error,
        json!({"code": 13, "details": [], "message": "expected one response message, got 2"})
    );
}

#[test]
fn envoy_a_streamed_response_s_incomplete_frames_count_against_the_vm_budget() {
    let host = testing_filter(
        json!({"max_response_bytes": 1000, "max_held_response_bytes": 1000}),
        false,
    );
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":2}"#);
    response_headers(&host, &GRPC_OK, false);
    // The headers held until the first message count too.
    let headers = vm_held();
    assert!(headers > 0 && headers < 400, "{headers}");
    // 600 bytes of a frame declaring 900: held until the rest comes.
    let mut partial = vec![0, 0, 0, 0x03, 0x84];
    partial.resize(600, 0);
    assert_eq!(response_body(&host, &partial, false), PAUSE);
    assert_eq!(response_text(&host), "");
    assert_eq!(vm_held(), headers + 600);
    second_stream(&host, 3, STREAM_THEN_FAIL);
    host.set_buffer_bytes(BufferType::HttpResponseBody, &partial);
    // No message has left: the error is the whole answer, and its status.
    assert_eq!(proxy_on_response_body(3, 600, 0), CONTINUE);
    let others = headers + 600;
    assert_eq!(
        response_text(&host),
        format!("{{\"code\":8,\"message\":\"the proxy holds too many responses at once: {others} bytes for other streams, max_held_response_bytes is 1000\",\"details\":[]}}")
    );
    assert_eq!(response_header(&host, ":status").as_deref(), Some("429"));
    proxy_on_delete(3);
    assert_eq!(vm_held(), headers + 600);
    proxy_on_delete(HTTP);
    assert_eq!(vm_held(), 0);
}

/// A GET binding whose fields come from the path and the query.
const SHELVES: &str = include_str!("../../../../protos/shelf_binding.proto");
/// GetShelf { id: 7, view: "full" } and Shelf { id: 7 }.
const GET_SHELF: &[u8] = b"\x08\x07\x12\x04full";
const SHELF: &[u8] = b"\x08\x07";

/// A GET for the binding, without a body.
fn get_shelf(host: &MockHost, end_of_stream: bool) -> u32 {
    let headers = [
        (":method", "GET"),
        (":path", "/v1/shelves/7?view=full"),
        (":authority", "test"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    proxy_on_request_headers(HTTP, headers.len() as u32, u32::from(end_of_stream))
}

#[test]
fn ngx_wasm_module_a_bodiless_binding_gets_its_grpc_request_as_the_body() {
    let host = filter(json!({"protos": {"shelves.proto": SHELVES}}), true);
    // ngx_wasm_module makes a request body when a filter sets one from the
    // headers callback (Envoy has none there: the mock refuses by default).
    host.set_buffer_bytes(BufferType::HttpRequestBody, b"");
    // ngx_wasm_module announces a body after every request's headers.
    assert_eq!(
        get_shelf(&host, false),
        CONTINUE,
        "{:?}",
        host.state.borrow().replies
    );
    let header = |k| host.map_value(MapType::HttpRequestHeaders, k);
    assert_eq!(header(":method").as_deref(), Some(&b"POST"[..]));
    assert_eq!(
        header(":path").as_deref(),
        Some(&b"/shelves.Shelves/Get?"[..])
    );
    assert_eq!(
        header("content-type").as_deref(),
        Some(&b"application/grpc"[..])
    );
    assert_eq!(header("content-length").as_deref(), Some(&b"13"[..]));
    let body = host.buffer_bytes(BufferType::HttpRequestBody);
    assert_eq!(body.as_deref(), Some(&frame(GET_SHELF)[..]));
    // Shown its own request as the body, the filter leaves it be.
    assert_eq!(request_body(&host, &frame(GET_SHELF), true), CONTINUE);
    let body = host.buffer_bytes(BufferType::HttpRequestBody);
    assert_eq!(body.as_deref(), Some(&frame(GET_SHELF)[..]));
    assert!(host.state.borrow().opened.is_empty());
    assert_eq!(response_headers(&host, &GRPC_OK, false), CONTINUE);
    let _ = response_body(&host, &frame(SHELF), true);
    assert_eq!(response_text(&host), r#"{"id":"7"}"#);
}

#[test]
fn envoy_a_bodiless_binding_is_called_back_through_the_loopback_cluster() {
    let config = json!({"protos": {"shelves.proto": SHELVES}, "loopback_cluster": "inner"});
    let host = filter(config, false);
    // The route's cluster is not where the call goes: the chain behind the
    // loopback routes it by its gRPC path, past the filters after this one.
    host.state
        .borrow_mut()
        .properties
        .insert(b"xds\0cluster_name".to_vec(), b"shelves-cluster".to_vec());
    assert_eq!(get_shelf(&host, true), PAUSE);
    let token = {
        let state = host.state.borrow();
        let [call] = state.opened.as_slice() else {
            panic!("expected one call, got {:?}", state.opened);
        };
        assert_eq!(
            (
                call.upstream.as_slice(),
                call.service.as_str(),
                call.method.as_str(),
                state.sent.as_slice()
            ),
            (
                &b"\x0a\x0d\x0a\x05inner\x12\x04test"[..],
                "shelves.Shelves",
                "Get",
                &[(call.token, GET_SHELF.to_vec())][..]
            )
        );
        call.token
    };
    host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, SHELF);
    proxy_on_grpc_receive(ROOT, token, SHELF.len() as u32);
    host.state.borrow_mut().status = Some((0, Vec::new()));
    proxy_on_grpc_close(ROOT, token, 0);
    assert_eq!(the_reply(&host), (200, json!({"id": "7"})));
}

#[test]
fn envoy_a_bodiless_binding_without_a_loopback_cluster_is_refused_never_called() {
    let host = filter(json!({"protos": {"shelves.proto": SHELVES}}), false);
    let warned: Vec<_> = host
        .state
        .borrow()
        .logs
        .iter()
        .filter(|(_, line)| line.contains("no \"loopback_cluster\""))
        .map(|(_, line)| line.clone())
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    host.state
        .borrow_mut()
        .properties
        .insert(b"xds\0cluster_name".to_vec(), b"shelves-cluster".to_vec());
    assert_eq!(get_shelf(&host, true), PAUSE);
    let (status, body) = the_reply(&host);
    assert_eq!((status, body["code"].clone()), (501, json!(12)));
    assert_eq!(
        body["message"],
        json!(super::callout_callbacks::NO_LOOPBACK)
    );
    assert!(host.state.borrow().opened.is_empty());
}

#[test]
fn ngx_wasm_module_says_a_loopback_cluster_is_not_used() {
    let config = json!({"protos": {"shelves.proto": SHELVES}, "loopback_cluster": "inner"});
    let host = filter(config, true);
    let logs = &host.state.borrow().logs;
    assert!(
        logs.iter().any(|(_, l)| l == "grpc-wasm: loopback_cluster \"inner\" is not used: this host lets the filter give a request without a body its message in the stream"),
        "{logs:?}"
    );
}

#[test]
fn envoy_a_failed_unary_callout_keeps_the_details_of_its_trailers() {
    use base64::Engine;
    let host = callout(json!({}), false);
    assert_eq!(request_headers(&host, &[], false), PAUSE);
    assert_eq!(request_body(&host, br#"{"name":"ann"}"#, true), PAUSE);
    let token = host.state.borrow().opened[0].token;
    // google.rpc.Status { code: 5, message: "x", details: [ErrorInfo { reason: "R" }] }
    let url = b"type.googleapis.com/google.rpc.ErrorInfo";
    let mut any = vec![0x0a, url.len() as u8];
    any.extend_from_slice(url);
    any.extend_from_slice(&[0x12, 0x03, 0x0a, 0x01, b'R']);
    let mut status = vec![0x08, 0x05, 0x12, 0x01, b'x', 0x1a, any.len() as u8];
    status.extend_from_slice(&any);
    let details = base64::engine::general_purpose::STANDARD.encode(&status);
    host.set_map(
        MapType::GrpcReceiveTrailingMetadata,
        &[("grpc-status-details-bin", details.as_str())],
    );
    proxy_on_grpc_receive_trailing_metadata(ROOT, token, 1);
    host.state.borrow_mut().status = Some((5, b"x".to_vec()));
    proxy_on_grpc_close(ROOT, token, 5);
    let (status, body) = the_reply(&host);
    assert_eq!(
        (status, body),
        (
            404,
            json!({"code": 5, "message": "x", "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "R"}
            ]})
        )
    );
}

/// The host is learnt once per VM (a thread here): each host its own.
fn in_a_vm_of_its_own<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f)
        .join()
        .expect("the test's VM panicked")
}

#[test]
fn ngx_wasm_module_refuses_the_filters_own_header_from_a_client_envoy_drops_it() {
    const OWN: [(&str, &str); 1] = [("x-grpc-wasm-original-path", "/somewhere")];
    let (status, body) = in_a_vm_of_its_own(|| {
        let host = transcoding(true);
        // nginx would forward the client's copy beside the filter's.
        request_headers(&host, &OWN, false);
        the_reply(&host)
    });
    assert_eq!(
        (status, body["code"].clone(), body["message"].clone()),
        (
            400,
            json!(3),
            json!("x-grpc-wasm-original-path is set by the filter, not by clients")
        )
    );
    let (action, header) = in_a_vm_of_its_own(|| {
        let host = transcoding(false);
        let action = request_headers(&host, &OWN, false);
        (
            action,
            host.map_value(MapType::HttpRequestHeaders, "x-grpc-wasm-original-path"),
        )
    });
    assert_eq!((action, header), (CONTINUE, None));
}

#[test]
fn ngx_wasm_module_clears_the_query_of_the_grpc_path_envoy_needs_not() {
    let path = |ngx| {
        in_a_vm_of_its_own(move || {
            let host = transcoding(ngx);
            let headers = [
                (":method", "POST"),
                (":path", "/helloworld.Greeter/SayHello?trace=1"),
                (":authority", "test"),
                ("content-type", "application/json"),
            ];
            host.set_map(MapType::HttpRequestHeaders, &headers);
            let action = proxy_on_request_headers(HTTP, headers.len() as u32, 0);
            let path = host.map_value(MapType::HttpRequestHeaders, ":path");
            (
                action,
                String::from_utf8(path.unwrap_or_default()).unwrap_or_default(),
            )
        })
    };
    // A `:path` set without a query keeps the old one there.
    assert_eq!(
        path(true),
        (CONTINUE, "/helloworld.Greeter/SayHello?".to_string())
    );
    assert_eq!(
        path(false),
        (CONTINUE, "/helloworld.Greeter/SayHello".to_string())
    );
}

const GREETER_LABELS: &str = ";grpc_service=helloworld.Greeter;grpc_method=SayHello";

/// A metric's value after the next tick (which hands counters to the
/// host); `name` may end in more labels (`;grpc_code=OK`), which follow
/// the method's.
fn counted(host: &MockHost, name: &str) -> Option<i64> {
    proxy_on_tick(ROOT);
    let (base, more) = name
        .split_once(';')
        .map_or((name, String::new()), |(b, m)| (b, format!(";{m}")));
    host.metric(&format!("{base}{GREETER_LABELS}{more}"))
        .map(|m| m.value)
}

/// A second HTTP stream (context HTTP + 1) whose JSON request headers arrive.
fn second_request(host: &MockHost) {
    proxy_on_context_create(HTTP + 1, ROOT);
    host.set_map(
        MapType::HttpRequestHeaders,
        &[
            (":method", "POST"),
            (":path", "/helloworld.Greeter/SayHello"),
            ("content-type", "application/json"),
        ],
    );
    proxy_on_request_headers(HTTP + 1, 3, 0);
}

#[test]
fn a_transcoded_call_is_counted_once_and_one_whose_client_left_is_cancelled() {
    let host = transcoding(false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    response_headers(&host, &GRPC_OK, false);
    response_body(&host, &frame(REPLY), false);
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    proxy_on_response_trailers(HTTP, 1);
    proxy_on_delete(HTTP);
    assert_eq!(counted(&host, "grpc_client_started_total"), Some(1));
    assert_eq!(
        counted(&host, "grpc_client_handled_total").map(|_| ()),
        None,
        "handled has a code"
    );
    assert_eq!(
        counted(&host, "grpc_client_handled_total;grpc_code=OK"),
        Some(1)
    );
    assert_eq!(counted(&host, "grpc_client_msg_sent_total"), Some(1));
    assert_eq!(
        counted(&host, "grpc_client_msg_sent_bytes_total"),
        Some(frame(REQUEST).len() as i64)
    );
    assert_eq!(counted(&host, "grpc_client_msg_received_total"), Some(1));
    // A second exchange whose client goes away before any answer.
    second_request(&host);
    proxy_on_delete(HTTP + 1);
    assert_eq!(counted(&host, "grpc_client_started_total"), Some(2));
    assert_eq!(
        counted(&host, "grpc_client_handled_total;grpc_code=CANCELLED"),
        Some(1)
    );
    assert_eq!(
        counted(&host, "grpc_client_handled_total;grpc_code=OK"),
        Some(1)
    );
    let duration = host
        .metric(&format!(
            "grpc_client_handling_milliseconds{GREETER_LABELS}"
        ))
        .unwrap();
    assert_eq!(duration.recorded.len(), 2);
}

#[test]
fn a_callout_counts_its_messages_and_a_local_refusal_as_a_request_failure() {
    let host = callout(json!({}), false);
    request_headers(&host, &[], false);
    request_body(&host, br#"{"name":"ann"}"#, true);
    let token = host.state.borrow().opened[0].token;
    host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, REPLY);
    proxy_on_grpc_receive(ROOT, token, REPLY.len() as u32);
    // Envoy's unary call goes as a stream: it ends at its status.
    assert_eq!(
        counted(&host, "grpc_client_handled_total;grpc_code=OK"),
        None
    );
    host.state.borrow_mut().status = Some((0, Vec::new()));
    proxy_on_grpc_close(ROOT, token, 0);
    assert_eq!(
        counted(&host, "grpc_client_handled_total;grpc_code=OK"),
        Some(1)
    );
    assert_eq!(
        counted(&host, "grpc_client_msg_received_bytes_total"),
        Some(REPLY.len() as i64 + 5)
    );
    // The opened call named the module.
    let opened = host.state.borrow().opened[0].clone();
    let agent = opened.metadata.iter().find(|(k, _)| k == "user-agent");
    assert_eq!(
        agent.map(|(_, v)| v.as_slice()),
        Some(crate::USER_AGENT.as_bytes())
    );
    // Bad JSON never leaves: a request failure.
    second_request(&host);
    host.set_buffer_bytes(BufferType::HttpRequestBody, b"{nope");
    proxy_on_request_body(HTTP + 1, 5, 1);
    assert_eq!(
        counted(
            &host,
            "grpc_client_handled_total;grpc_code=INVALID_ARGUMENT"
        ),
        Some(1)
    );
    assert_eq!(
        counted(&host, "grpc_wasm_transcode_failures_total;cause=request"),
        Some(1)
    );
    assert_eq!(counted(&host, "grpc_client_msg_sent_total"), Some(1));
}

/// A stream that ends before its first message (trailers-only OK): the
/// reply carries what it says, an empty stream in the configured format.
fn empty_stream_reply(stream_format: &str, ngx: bool) -> (String, String) {
    let host = testing_filter(json!({"stream_format": stream_format}), ngx);
    json_request(&host, STREAM_THEN_FAIL, br#"{"count":0}"#);
    let trailers_only = [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "0"),
    ];
    response_headers(&host, &trailers_only, false);
    let state = host.state.borrow();
    if let [reply] = state.replies.as_slice() {
        let content_type = reply.headers.iter().find(|(k, _)| k == "content-type");
        let content_type = content_type.map(|(_, v)| String::from_utf8_lossy(v).into_owned());
        return (
            content_type.unwrap_or_default(),
            String::from_utf8_lossy(&reply.body).into_owned(),
        );
    }
    assert!(ngx, "Envoy gets a local reply: {:?}", state.replies);
    drop(state);
    let content_type = host
        .map_value(MapType::HttpResponseHeaders, "content-type")
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default();
    response_body(&host, b"", true);
    (content_type, response_text(&host))
}

#[test]
fn an_empty_stream_is_answered_in_its_own_format_on_both_hosts() {
    for ngx in [false, true] {
        assert_eq!(
            empty_stream_reply("ndjson", ngx),
            ("application/x-ndjson".into(), String::new()),
            "ngx: {ngx}"
        );
        assert_eq!(
            empty_stream_reply("sse", ngx),
            ("text/event-stream".into(), String::new()),
            "ngx: {ngx}"
        );
        assert_eq!(
            empty_stream_reply("array", ngx),
            ("application/json".into(), "[]".into()),
            "ngx: {ngx}"
        );
    }
}

#[test]
fn ngx_wasm_module_refuses_reflection_at_load_with_one_line() {
    let host = Rc::new(MockHost::default());
    host.state
        .borrow_mut()
        .properties
        .insert(b"ngx\0hostname".to_vec(), b"test".to_vec());
    let config = json!({"reflection": {"upstream": "127.0.0.1:50051"}}).to_string();
    host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    install(host.clone());
    proxy_on_context_create(ROOT, 0);
    assert_eq!(proxy_on_configure(ROOT, config.len() as u32), 0);
    let logs = &host.state.borrow().logs;
    assert_eq!(
        logs.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
        ["grpc-wasm: bad configuration: reflection: this host has no gRPC calls (ngx_wasm_module); give \"protos\" or \"descriptor_set\""]
    );
}

#[test]
fn envoy_before_the_first_reflection_load_json_gets_503_and_grpc_passes() {
    let host = Rc::new(MockHost::default());
    // What tells a host with gRPC calls while configuring.
    host.state
        .borrow_mut()
        .properties
        .insert(b"plugin_vm_id".to_vec(), b"grpc_wasm".to_vec());
    let config = json!({"reflection": {"upstream": "greeter"}}).to_string();
    host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    install(host.clone());
    proxy_on_context_create(ROOT, 0);
    assert_eq!(proxy_on_configure(ROOT, config.len() as u32), 1);
    proxy_on_context_create(HTTP, ROOT);
    // The first load starts at the first tick, on a stream of v1.
    proxy_on_tick(ROOT);
    let opened = host.state.borrow().opened.clone();
    assert_eq!(opened.len(), 1);
    assert_eq!(
        (opened[0].service.as_str(), opened[0].method.as_str()),
        (
            "grpc.reflection.v1.ServerReflection",
            "ServerReflectionInfo"
        )
    );
    assert_eq!(request_headers(&host, &[], false), PAUSE);
    assert_eq!(
        the_reply(&host),
        (
            503,
            json!({"code": 14, "message": "grpc-wasm: descriptors not loaded yet (the proxy's log says why)", "details": []})
        )
    );
    proxy_on_context_create(HTTP + 1, ROOT);
    let grpc = [
        (":method", "POST"),
        (":path", "/helloworld.Greeter/SayHello"),
        ("content-type", "application/grpc"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &grpc);
    assert_eq!(proxy_on_request_headers(HTTP + 1, 3, 0), CONTINUE);
}
