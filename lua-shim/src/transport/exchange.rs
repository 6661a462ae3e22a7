//! What both transports put on HTTP/2 for a call and read back from it,
//! written once: the request's headers, its messages framed by the core
//! (compressed as the caller asked), and the response's encoding.

use bytes::Bytes;
use grpc_wasm::framing::{encode_frame, Compression, ACCEPT_ENCODING};
use grpc_wasm::timeout::encode_timeout;

use crate::call::{events, GrpcTarget};

const APPLICATION_GRPC: http::HeaderValue = http::HeaderValue::from_static("application/grpc");
const TRAILERS: http::HeaderValue = http::HeaderValue::from_static("trailers");
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
const GRPC_ACCEPT_ENCODING: http::HeaderName =
    http::HeaderName::from_static("grpc-accept-encoding");
const ACCEPTED_ENCODINGS: http::HeaderValue = http::HeaderValue::from_static(ACCEPT_ENCODING);

/// Where a connection's requests go: its scheme and authority.
pub(crate) type Origin = (http::uri::Scheme, http::uri::Authority);

/// The scheme and authority of a connection's requests; an address that is
/// no authority fails each call, as a bad method path does.
pub(crate) fn origin(authority: &str, tls: bool) -> Result<Origin, String> {
    let scheme = if tls {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    };
    let authority = http::uri::Authority::try_from(authority)
        .map_err(|e| format!("invalid address '{authority}': {e}"))?;
    Ok((scheme, authority))
}

/// A call's request headers: to `origin`, for `target`'s method and
/// metadata, with its deadline as `grpc-timeout` when it has one, and
/// `grpc-encoding` when its messages go compressed.
pub(crate) fn request(
    origin: &Result<Origin, String>,
    target: &GrpcTarget,
    timeout_ms: Option<u32>,
) -> Result<http::Request<()>, String> {
    let (scheme, authority) = origin.clone()?;
    let mut path = String::with_capacity(2 + target.service.len() + target.method.len());
    path.push('/');
    path.push_str(&target.service);
    path.push('/');
    path.push_str(&target.method);
    let path =
        http::uri::PathAndQuery::try_from(path).map_err(|e| format!("invalid method path: {e}"))?;
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(scheme);
    parts.authority = Some(authority);
    parts.path_and_query = Some(path);
    let uri = http::Uri::from_parts(parts).map_err(|e| format!("invalid method path: {e}"))?;
    let mut request = http::Request::new(());
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(http::header::TE, TRAILERS);
    headers.insert(GRPC_ACCEPT_ENCODING, ACCEPTED_ENCODINGS);
    if target.compression != Compression::Identity {
        headers.insert(
            GRPC_ENCODING,
            http::HeaderValue::from_static(target.compression.name()),
        );
    }
    if let Some(ms) = timeout_ms {
        let value = encode_timeout(std::time::Duration::from_millis(u64::from(ms.max(1))));
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert(GRPC_TIMEOUT, value);
        }
    }
    events::append_metadata(headers, &target.metadata);
    Ok(request)
}

/// One length-prefixed request message, framed by the core: compressed
/// with the call's encoding, or not when its caller sends this one
/// uncompressed (gRPC sets the flag per message).
pub(crate) fn frame(message: &[u8], call: Compression, compress: bool) -> Result<Bytes, String> {
    let compression = if compress {
        call
    } else {
        Compression::Identity
    };
    encode_frame(message, compression)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// The encoding of a response's messages, from its `grpc-encoding`: what
/// the request offered, or why it cannot be read (gRPC's compression spec
/// makes that UNIMPLEMENTED).
pub(crate) fn response_encoding(headers: &http::HeaderMap) -> Result<Compression, String> {
    match headers.get(GRPC_ENCODING).map(|v| v.to_str()) {
        None => Ok(Compression::Identity),
        Some(Ok(name)) => Compression::from_header(name).ok_or_else(|| unoffered(name)),
        Some(Err(_)) => Err(unoffered("(not text)")),
    }
}

/// Why a response compressed with `name` cannot be read.
fn unoffered(name: &str) -> String {
    format!("the server compressed the response with '{name}', which this client did not offer (it offers gzip)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(compression: Compression) -> GrpcTarget {
        GrpcTarget {
            upstream: "1".into(),
            service: "grpc.testing.TestService".into(),
            method: "UnaryCall".into(),
            compression,
            ..Default::default()
        }
    }

    fn origin() -> Result<Origin, String> {
        Ok((http::uri::Scheme::HTTP, "127.0.0.1:1".parse().unwrap()))
    }

    #[test]
    fn a_compressed_call_says_so_and_an_identity_call_does_not() {
        let gzip = request(&origin(), &target(Compression::Gzip), Some(5)).unwrap();
        assert_eq!(gzip.headers()["grpc-encoding"], "gzip");
        assert_eq!(gzip.headers()["grpc-accept-encoding"], "gzip");
        assert_eq!(gzip.headers()["grpc-timeout"], "5000000n");
        let plain = request(&origin(), &target(Compression::Identity), None).unwrap();
        assert!(plain.headers().get("grpc-encoding").is_none());
        assert!(plain.headers().get("grpc-timeout").is_none());
    }

    #[test]
    fn each_message_carries_its_own_flag() {
        let message = vec![0u8; 1000];
        let compressed = frame(&message, Compression::Gzip, true).unwrap();
        assert_eq!(compressed[0], 1);
        assert!(compressed.len() < 100, "{} bytes", compressed.len());
        let uncompressed = frame(&message, Compression::Gzip, false).unwrap();
        assert_eq!(uncompressed[0], 0);
        assert_eq!(uncompressed.len(), 1005);
        assert_eq!(frame(&message, Compression::Identity, true).unwrap()[0], 0);
    }

    #[test]
    fn a_response_encoding_not_offered_is_named() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(response_encoding(&headers), Ok(Compression::Identity));
        headers.insert("grpc-encoding", "gzip".parse().unwrap());
        assert_eq!(response_encoding(&headers), Ok(Compression::Gzip));
        headers.insert("grpc-encoding", "snappy".parse().unwrap());
        assert_eq!(
            response_encoding(&headers),
            Err("the server compressed the response with 'snappy', which this client did not offer (it offers gzip)".into())
        );
    }
}
