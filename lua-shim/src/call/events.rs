//! The rules both transports follow to turn an HTTP/2 response into the
//! module's events, written once: Envoy's event order, a unary call's one
//! message, the status from trailers or a trailers-only response, and
//! header maps both ways. The status rules themselves are the core's
//! ([`Status`], [`Code`]).

use grpc_wasm::{Code, Status};

use super::{GrpcEvent, HeaderBlock, Pairs};

/// The close event for `status`: its code, and `grpc-message` as it goes
/// on the wire (the module decodes it, as it would Envoy's).
pub fn close(status: &Status) -> GrpcEvent {
    GrpcEvent::Close(
        status.code.as_i32() as u32,
        status.encoded_message().into_bytes(),
    )
}

/// A close this side decided, with its reason.
pub fn close_as(code: Code, message: &str) -> GrpcEvent {
    close(&Status::new(code, message))
}

/// Why a call on a connection the caller closed (or never had) ends.
pub const CONNECTION_CLOSED: &str = "the connection is closed";

/// The end of a call whose connection is closed: UNAVAILABLE, as the call
/// never reached a server.
pub fn connection_closed() -> GrpcEvent {
    close_as(Code::Unavailable, CONNECTION_CLOSED)
}

/// The status a response's header map carries (its trailers, or the
/// headers of a trailers-only response); `None` without `grpc-status`.
pub fn status_of(headers: &http::HeaderMap) -> Option<Status> {
    let value = |name: &str| headers.get(name).map(|v| v.as_bytes());
    Status::from_header_values(value("grpc-status"), value("grpc-message"), None)
}

/// The end of a call whose status came from the server: its trailing
/// metadata, then the close.
pub fn ended(trailing: HeaderBlock, status: &Status) -> Vec<GrpcEvent> {
    vec![GrpcEvent::TrailingMetadata(trailing), close(status)]
}

/// A unary call the server answered with OK: in Envoy's order (initial
/// metadata, trailing metadata, then the message and no close), if the
/// answer is exactly one message; INTERNAL otherwise.
pub fn unary_answer(
    initial: HeaderBlock,
    trailing: HeaderBlock,
    mut messages: Vec<Vec<u8>>,
) -> Vec<GrpcEvent> {
    if messages.len() != 1 {
        let message = format!("expected one response message, got {}", messages.len());
        return vec![close_as(Code::Internal, &message)];
    }
    vec![
        GrpcEvent::InitialMetadata(initial),
        GrpcEvent::TrailingMetadata(trailing),
        GrpcEvent::Message(messages.remove(0)),
    ]
}

/// A response's header map for the module, with one more entry if given.
pub fn header_block(headers: &http::HeaderMap, extra: Option<(&str, &[u8])>) -> HeaderBlock {
    HeaderBlock::from_entries(|| {
        headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .chain(extra)
            .map(|(k, v)| (&b""[..], k.as_bytes(), v))
    })
}

/// The module's metadata onto a request. An entry that is no valid HTTP
/// header is left out, as Envoy leaves it out.
pub fn append_metadata(headers: &mut http::HeaderMap, metadata: &Pairs) {
    for (k, v) in metadata {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_bytes(v),
        ) {
            headers.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close_of(events: &[GrpcEvent]) -> Option<(u32, String)> {
        match events.last() {
            Some(GrpcEvent::Close(code, message)) => {
                Some((*code, String::from_utf8_lossy(message).into_owned()))
            }
            _ => None,
        }
    }

    #[test]
    fn a_unary_answer_is_exactly_one_message_in_envoys_order() {
        let events = unary_answer(
            HeaderBlock::default(),
            HeaderBlock::default(),
            vec![b"m".to_vec()],
        );
        assert!(matches!(
            events.as_slice(),
            [
                GrpcEvent::InitialMetadata(_),
                GrpcEvent::TrailingMetadata(_),
                GrpcEvent::Message(m)
            ] if m == b"m"
        ));
        for n in [0, 2] {
            let events = unary_answer(
                HeaderBlock::default(),
                HeaderBlock::default(),
                vec![Vec::new(); n],
            );
            assert_eq!(
                close_of(&events),
                Some((13, format!("expected one response message, got {n}")))
            );
            assert_eq!(events.len(), 1);
        }
    }

    #[test]
    fn statuses_follow_the_cores_rules_and_go_out_encoded() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(status_of(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("x"));
        assert_eq!(status_of(&headers).map(|s| s.code), Some(Code::Unknown));
        headers.insert("grpc-status", http::HeaderValue::from_static("5"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static("caf%C3%A9 %25"),
        );
        let status = status_of(&headers).unwrap_or_else(Status::ok);
        assert_eq!(
            (status.code, status.message.as_str()),
            (Code::NotFound, "café %")
        );
        assert_eq!(
            close_of(&[close(&status)]),
            Some((5, "caf%C3%A9 %25".into()))
        );
        let end = ended(
            HeaderBlock::default(),
            &Status::missing_grpc_status("the server's response"),
        );
        assert!(matches!(end[0], GrpcEvent::TrailingMetadata(_)));
        assert_eq!(
            close_of(&end),
            Some((13, "no grpc-status in the server's response".into()))
        );
    }

    #[test]
    fn metadata_that_is_no_header_is_left_out() {
        let mut headers = http::HeaderMap::new();
        let metadata = vec![
            ("x-a".to_string(), b"1".to_vec()),
            ("bad name".to_string(), b"2".to_vec()),
            ("x-b".to_string(), b"line\nbreak".to_vec()),
            ("x-a".to_string(), b"3".to_vec()),
        ];
        append_metadata(&mut headers, &metadata);
        let block = header_block(&headers, Some(("extra", b"e")));
        assert_eq!(
            block.entries(),
            vec![
                (&b"x-a"[..], &b"1"[..]),
                (&b"x-a"[..], &b"3"[..]),
                (&b"extra"[..], &b"e"[..])
            ]
        );
    }
}
