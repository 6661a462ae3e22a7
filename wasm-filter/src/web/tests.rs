use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::*;
use crate::code::Code;
use crate::framing::encode_frame;
use crate::framing::Compression;
use crate::status::Status;

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn reader(protocol: Protocol, codec: Codec, kind: StreamingKind) -> ResponseReader {
    ResponseReader::new(Wire::new(protocol, codec, kind), 1024)
}

fn frame(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Feeds a whole response one byte at a time, as a slow network might.
fn read_bytewise(r: &mut ResponseReader, body: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    for b in body {
        events.extend(r.push(std::slice::from_ref(b)));
    }
    events.extend(r.finish(None));
    events
}

fn end(events: &[Event]) -> &Outcome {
    match events.last() {
        Some(Event::End(outcome)) => outcome,
        Some(Event::Message(m)) => {
            panic!("no End: the last event is a message of {} bytes", m.len())
        }
        None => panic!("no events"),
    }
}

fn messages(events: &[Event]) -> Vec<&[u8]> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some(&m[..]),
            Event::End(_) => None,
        })
        .collect()
}

#[test]
fn grpc_web_messages_then_the_trailers_frame() {
    let mut r = reader(
        Protocol::GrpcWeb,
        Codec::Proto,
        StreamingKind::ServerStreaming,
    );
    let events = r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web+proto"), ("x-a", "1")]),
    );
    assert!(events.is_empty());
    let mut body = frame(0, b"one");
    body.extend(frame(0, b"two"));
    body.extend(frame(
        0x80,
        b"grpc-status:5\r\ngrpc-message: not%20here\r\nx-t: 2\r\n",
    ));
    let events = read_bytewise(&mut r, &body);
    assert_eq!(messages(&events), vec![&b"one"[..], &b"two"[..]]);
    let outcome = end(&events);
    assert_eq!(outcome.status, Status::new(Code::NotFound, "not here"));
    assert_eq!(outcome.headers, headers(&[("x-a", "1")]));
    assert_eq!(outcome.trailers, headers(&[("x-t", "2")]));
}

#[test]
fn metadata_at_the_end_is_bounded_as_a_header_block_is() {
    // (status, how many trailers were kept) of a stream that ends with `body`.
    let ended_with = |protocol, body: Vec<u8>| {
        let wire = Wire::new(protocol, Codec::Proto, StreamingKind::ServerStreaming);
        let mut r = ResponseReader::new(wire, 4 << 20);
        let kind = match protocol {
            Protocol::Connect => "application/connect+proto",
            _ => "application/grpc-web+proto",
        };
        r.headers(200, &headers(&[("content-type", kind)]));
        let mut events = r.push(&body);
        events.extend(r.finish(None));
        let outcome = end(&events);
        (outcome.status.clone(), outcome.trailers.len())
    };
    let lines = |n: usize| format!("grpc-status: 0\r\n{}", "x-t: a\r\n".repeat(n));
    let (status, kept) = ended_with(Protocol::GrpcWeb, frame(0x80, lines(100).as_bytes()));
    assert_eq!((status.code, kept), (Code::Ok, 100));
    let (status, kept) = ended_with(Protocol::GrpcWeb, frame(0x80, lines(101).as_bytes()));
    assert_eq!(
        (status.code, status.message.as_str(), kept),
        (
            Code::ResourceExhausted,
            "the peer ended the call with 101 entries of metadata, more than 100 entries or 65536 bytes may be",
            0
        )
    );
    let large = format!("grpc-status: 0\r\nx-t: {}\r\n", "a".repeat(70_000));
    let (status, _) = ended_with(Protocol::GrpcWeb, frame(0x80, large.as_bytes()));
    assert_eq!(status.code, Code::ResourceExhausted);
    assert_eq!(
        status.message,
        "the peer ended the call with 70023 bytes of metadata, more than 100 entries or 65536 bytes may be"
    );
    let values: Vec<String> = (0..101).map(|i| format!("\"{i}\"")).collect();
    let json = format!(r#"{{"metadata":{{"x-t":[{}]}}}}"#, values.join(","));
    let (status, kept) = ended_with(Protocol::Connect, frame(2, json.as_bytes()));
    assert_eq!((status.code, kept), (Code::ResourceExhausted, 0));
    let huge = format!(r#"{{"metadata":{{"x-t":["{}"]}}}}"#, "a".repeat(140_000));
    let (status, _) = ended_with(Protocol::Connect, frame(2, huge.as_bytes()));
    assert_eq!(
        status.message,
        "the peer's end-of-stream message is 140025 bytes, more than 131072 may be"
    );
}

#[test]
fn grpc_web_text_in_separately_padded_pieces() {
    let mut r = reader(
        Protocol::GrpcWebText,
        Codec::Proto,
        StreamingKind::ServerStreaming,
    );
    r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web-text")]),
    );
    // Three writes, each its own base64 string: "a" pads with "==", "bc" with "=".
    let pieces = [
        frame(0, b"a"),
        frame(0, b"bc"),
        frame(0x80, b"grpc-status: 0\r\n"),
    ];
    let text: String = pieces.iter().map(|p| STANDARD.encode(p)).collect();
    assert!(text.contains("=="));
    let events = read_bytewise(&mut r, text.as_bytes());
    assert_eq!(messages(&events), vec![&b"a"[..], &b"bc"[..]]);
    assert_eq!(end(&events).status, Status::ok());
}

#[test]
fn invalid_base64_ends_the_call_internal() {
    let mut r = reader(Protocol::GrpcWebText, Codec::Proto, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web-text")]),
    );
    let events = r.push(b"AAAA*AAA");
    let status = &end(&events).status;
    assert_eq!(status.code, Code::Internal);
    assert!(
        status
            .message
            .starts_with("invalid base64 in a grpc-web-text response"),
        "{status}"
    );
    assert!(r.push(b"more").is_empty(), "nothing after the end");
}

#[test]
fn a_truncated_frame_and_a_missing_trailers_frame() {
    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web+proto")]),
    );
    let events = read_bytewise(&mut r, &frame(0, b"abc")[..6]);
    assert_eq!(
        end(&events).status,
        Status::new(
            Code::Internal,
            "grpc: stream ended inside a message (6 bytes buffered)"
        )
    );

    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    r.headers(200, &headers(&[("content-type", "application/grpc-web")]));
    let events = read_bytewise(&mut r, &frame(0, b"abc"));
    assert_eq!(messages(&events), vec![&b"abc"[..]]);
    assert_eq!(
        end(&events).status,
        Status::new(
            Code::Internal,
            "the gRPC-Web response ended without its trailers frame"
        )
    );
}

#[test]
fn a_message_over_the_limit_is_resource_exhausted_before_its_bytes_arrive() {
    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web+proto")]),
    );
    let events = r.push(&[0, 0, 0, 4, 1]);
    assert_eq!(
        end(&events).status,
        Status::new(
            Code::ResourceExhausted,
            "grpc: received message larger than max (1025 vs. 1024)"
        )
    );
}

#[test]
fn trailers_only_and_non_grpc_answers() {
    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    let events = r.headers(
        200,
        &headers(&[
            ("grpc-status", "16"),
            ("grpc-message", "who?"),
            ("x-why", "token"),
        ]),
    );
    let outcome = end(&events);
    assert_eq!(outcome.status, Status::new(Code::Unauthenticated, "who?"));
    assert_eq!(outcome.trailers, headers(&[("x-why", "token")]));

    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    let events = r.headers(503, &headers(&[("content-type", "text/html")]));
    assert_eq!(end(&events).status.code, Code::Unavailable);

    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    let events = r.headers(200, &headers(&[("content-type", "text/html")]));
    assert_eq!(
        end(&events).status,
        Status::new(
            Code::Unknown,
            "the response's content-type is 'text/html', expected 'application/grpc-web+proto'"
        )
    );
}

#[test]
fn grpc_over_http2_reads_the_trailers_and_gzip() {
    let mut r = reader(Protocol::Grpc, Codec::Proto, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "gzip"),
        ]),
    );
    let events = r.push(&encode_frame(b"zipped", Compression::Gzip).unwrap());
    assert_eq!(messages(&events), vec![&b"zipped"[..]]);
    let events = r.finish(Some(&headers(&[("grpc-status", "0"), ("x-t", "1")])));
    assert_eq!(end(&events).status, Status::ok());
    assert_eq!(end(&events).trailers, headers(&[("x-t", "1")]));

    let mut r = reader(Protocol::Grpc, Codec::Proto, StreamingKind::Unary);
    r.headers(200, &headers(&[("content-type", "application/grpc")]));
    assert_eq!(
        end(&r.finish(None)).status,
        Status::new(Code::Internal, "no grpc-status in the response's trailers")
    );
}

#[test]
fn connect_unary_success_with_trailer_headers() {
    let mut r = reader(Protocol::Connect, Codec::Json, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[
            ("content-type", "application/json"),
            ("x-h", "1"),
            ("trailer-x-t", "2"),
        ]),
    );
    let events = read_bytewise(&mut r, br#"{"message":"hi"}"#);
    assert_eq!(messages(&events), vec![&br#"{"message":"hi"}"#[..]]);
    let outcome = end(&events);
    assert_eq!(outcome.status, Status::ok());
    assert_eq!(outcome.headers, headers(&[("x-h", "1")]));
    assert_eq!(outcome.trailers, headers(&[("x-t", "2")]));
}

#[test]
fn connect_unary_error_json_with_details() {
    let mut r = reader(Protocol::Connect, Codec::Proto, StreamingKind::Unary);
    r.headers(404, &headers(&[("content-type", "application/json")]));
    // "CgJpZA" is a padless base64 google.rpc.ErrorInfo { reason: "id" }.
    let body = br#"{"code":"not_found","message":"no such book","details":[{"type":"google.rpc.ErrorInfo","value":"CgJpZA"}]}"#;
    let events = read_bytewise(&mut r, body);
    assert!(messages(&events).is_empty());
    let status = &end(&events).status;
    assert_eq!(
        (status.code, status.message.as_str()),
        (Code::NotFound, "no such book")
    );
    let registry = crate::Registry::new().unwrap();
    let details = crate::details::decode_details(
        &registry,
        status.details.as_deref().unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        details,
        vec![r#"{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"id"}"#]
    );

    let mut r = reader(Protocol::Connect, Codec::Proto, StreamingKind::Unary);
    r.headers(502, &headers(&[("content-type", "text/html")]));
    let events = read_bytewise(&mut r, b"<html>bad gateway</html>");
    assert_eq!(end(&events).status.code, Code::Unavailable);
}

#[test]
fn connect_stream_end_of_stream() {
    let mut r = reader(
        Protocol::Connect,
        Codec::Proto,
        StreamingKind::ServerStreaming,
    );
    r.headers(
        200,
        &headers(&[("content-type", "application/connect+proto")]),
    );
    let mut body = frame(0, b"m1");
    body.extend(frame(
        0x02,
        br#"{"error":{"code":"canceled","message":"stop"},"metadata":{"X-T":["a","b"]}}"#,
    ));
    let events = read_bytewise(&mut r, &body);
    assert_eq!(messages(&events), vec![&b"m1"[..]]);
    let outcome = end(&events);
    assert_eq!(outcome.status, Status::new(Code::Cancelled, "stop"));
    assert_eq!(outcome.trailers, headers(&[("x-t", "a"), ("x-t", "b")]));

    let mut r = reader(
        Protocol::Connect,
        Codec::Json,
        StreamingKind::ServerStreaming,
    );
    r.headers(
        200,
        &headers(&[("content-type", "application/connect+json")]),
    );
    let events = read_bytewise(&mut r, &frame(0x02, b"not json"));
    let status = &end(&events).status;
    assert_eq!(status.code, Code::Internal);
    assert!(status
        .message
        .starts_with("the Connect end-of-stream message is not valid JSON"));

    let mut r = reader(
        Protocol::Connect,
        Codec::Json,
        StreamingKind::ServerStreaming,
    );
    r.headers(
        200,
        &headers(&[("content-type", "application/connect+json")]),
    );
    let events = read_bytewise(&mut r, &frame(0, b"{}"));
    assert_eq!(
        end(&events).status,
        Status::new(
            Code::Internal,
            "the Connect stream ended without its end-of-stream message"
        )
    );
}

#[test]
fn request_headers_per_protocol() {
    let mut metadata = crate::Metadata::new();
    metadata
        .append("x-k", crate::MetadataValue::Ascii("v".into()))
        .unwrap();
    let timeout = Some(std::time::Duration::from_millis(1500));
    let web = Wire::new(Protocol::GrpcWebText, Codec::Json, StreamingKind::Unary);
    assert_eq!(
        request_headers(&web, timeout, &metadata),
        headers(&[
            ("content-type", "application/grpc-web-text"),
            ("accept", "application/grpc-web-text"),
            ("x-grpc-web", "1"),
            ("grpc-timeout", "1500000u"),
            ("x-k", "v"),
        ])
    );
    let connect = Wire::new(
        Protocol::Connect,
        Codec::Json,
        StreamingKind::ServerStreaming,
    );
    assert_eq!(
        request_headers(&connect, timeout, &crate::Metadata::new()),
        headers(&[
            ("content-type", "application/connect+json"),
            ("connect-protocol-version", "1"),
            ("connect-timeout-ms", "1500"),
        ])
    );
}

#[test]
fn connect_get_only_for_methods_without_side_effects() {
    let mut registry = crate::Registry::new().unwrap();
    registry
        .add_sources([(
            "t.proto",
            "syntax = \"proto3\"; package t; message M { string s = 1; }
             service S {
               rpc Get(M) returns (M) { option idempotency_level = NO_SIDE_EFFECTS; }
               rpc Put(M) returns (M);
             }",
        )])
        .unwrap();
    let wire = Wire::new(Protocol::Connect, Codec::Proto, StreamingKind::Unary);
    let get = registry.method("/t.S/Get").unwrap();
    assert_eq!(
        get_query(&wire, &get, br#"{"s":"x"}"#, &Default::default()).unwrap(),
        "connect=v1&encoding=proto&base64=1&message=CgF4"
    );
    let put = registry.method("/t.S/Put").unwrap();
    assert_eq!(
        get_query(&wire, &put, b"{}", &Default::default()).unwrap_err().to_string(),
        "/t.S/Put is not idempotent (option idempotency_level = NO_SIDE_EFFECTS): only such methods may be called by GET"
    );
}

#[test]
fn request_messages_per_wire() {
    let registry = crate::Registry::new().unwrap();
    let ty = crate::json::MessageType::new(registry.message("google.rpc.ErrorInfo").unwrap());
    let options = Default::default();
    let json = br#"{"reason": "id"}"#;
    let text = Wire::new(Protocol::GrpcWebText, Codec::Proto, StreamingKind::Unary);
    assert_eq!(
        encode_message(&text, &ty, json, &options).unwrap(),
        b"AAAAAAQKAmlk"
    );
    let connect_json = Wire::new(Protocol::Connect, Codec::Json, StreamingKind::Unary);
    assert_eq!(
        encode_message(&connect_json, &ty, json, &options).unwrap(),
        br#"{"reason":"id"}"#
    );
    let connect_stream = Wire::new(
        Protocol::Connect,
        Codec::Proto,
        StreamingKind::ClientStreaming,
    );
    assert_eq!(
        encode_message(&connect_stream, &ty, json, &options).unwrap(),
        frame(0, b"\x0a\x02id")
    );
}

#[test]
fn a_chunk_of_many_compressed_frames_is_read_a_batch_at_a_time() {
    // 64 frames of 4 KiB gzip that inflate to 1 MiB each, in one chunk: a
    // stream takes them a budget (here 2 MiB) at a time, not all at once.
    let big = vec![b'x'; 1 << 20];
    let frame = encode_frame(&big, Compression::Gzip).unwrap();
    assert!(frame.len() < 8 << 10);
    let body: Vec<u8> = std::iter::repeat_n(frame, 64).flatten().collect();
    let wire = Wire::new(Protocol::Grpc, Codec::Proto, StreamingKind::ServerStreaming);
    let mut r = ResponseReader::new(wire, 2 << 20);
    r.headers(
        200,
        &headers(&[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "gzip"),
        ]),
    );
    let mut batches = vec![messages(&r.push(&body)).len()];
    while r.has_more() {
        batches.push(messages(&r.pull()).len());
    }
    assert_eq!(batches.iter().sum::<usize>(), 64);
    assert!(batches.iter().all(|&n| n <= 2), "{batches:?}");
    assert_eq!(
        end(&r.finish(Some(&headers(&[("grpc-status", "0")])))).status,
        Status::ok()
    );

    // A unary response's messages are bounded together.
    let wire = Wire::new(Protocol::Grpc, Codec::Proto, StreamingKind::Unary);
    let mut r = ResponseReader::new(wire, 2 << 20);
    r.headers(
        200,
        &headers(&[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "gzip"),
        ]),
    );
    assert_eq!(messages(&r.push(&body)).len(), 2);
    assert!(r.has_more());
    assert_eq!(
        end(&r.pull()).status,
        Status::new(
            Code::ResourceExhausted,
            "grpc: received messages larger than max in total (limit 2097152 bytes)"
        )
    );
}

#[test]
fn connect_errors_read_a_bounded_prefix_and_keep_unknown_codes() {
    let mut r = reader(Protocol::Connect, Codec::Proto, StreamingKind::Unary);
    r.headers(503, &headers(&[("content-type", "text/html")]));
    assert!(r.push(&vec![b'<'; 5 << 20]).is_empty());
    assert_eq!(
        end(&r.finish(None)).status,
        Status::new(
            Code::Unavailable,
            "HTTP status 503 from a non-gRPC response"
        )
    );

    let mut r = reader(Protocol::Connect, Codec::Json, StreamingKind::Unary);
    r.headers(500, &headers(&[("content-type", "application/json")]));
    let events = read_bytewise(&mut r, br#"{"code":"brand_new","message":"m"}"#);
    assert_eq!(end(&events).status, Status::new(Code::Unknown, "m"));
}

#[test]
fn web_trailers_with_bare_line_feeds() {
    let mut r = reader(Protocol::GrpcWeb, Codec::Proto, StreamingKind::Unary);
    r.headers(
        200,
        &headers(&[("content-type", "application/grpc-web+proto")]),
    );
    let events = read_bytewise(&mut r, &frame(0x80, b"grpc-status:7\ngrpc-message:nope\n"));
    assert_eq!(
        end(&events).status,
        Status::new(Code::PermissionDenied, "nope")
    );
}

#[test]
fn a_reset_stream_names_its_http2_error() {
    assert_eq!(
        Status::from_h2_reset(8),
        Status::new(Code::Cancelled, "the server reset the stream with CANCEL")
    );
    assert_eq!(
        Status::from_h2_reset(7),
        Status::new(
            Code::Unavailable,
            "the server reset the stream with REFUSED_STREAM"
        )
    );
    assert_eq!(
        Status::from_h2_reset(0x99),
        Status::new(
            Code::Internal,
            "the server reset the stream with error code 0x99"
        )
    );
}

#[test]
fn a_connect_unary_body_over_the_limit_says_the_limit_however_it_is_cut() {
    for chunk in [1, 7, 4096] {
        let mut r = reader(Protocol::Connect, Codec::Proto, StreamingKind::Unary);
        r.headers(200, &headers(&[("content-type", "application/proto")]));
        let mut events = Vec::new();
        for piece in vec![b'x'; 2000].chunks(chunk) {
            events.extend(r.push(piece));
        }
        events.extend(r.finish(None));
        assert_eq!(
            end(&events).status,
            Status::new(
                Code::ResourceExhausted,
                "the response message is larger than the limit of 1024 bytes"
            )
        );
    }
}
