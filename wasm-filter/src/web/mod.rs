//! The client side of the protocols that carry gRPC calls where a client
//! cannot read HTTP/2 trailers (gRPC-Web, binary and text, and Connect), and
//! of gRPC itself: what a call sends, and a reader that turns the response's
//! byte chunks into messages and one final status. Transports (the
//! wasm-bindgen package's `fetch` and `node:http2`) only move the bytes;
//! every rule about them is here, tested natively.
//!
//! Facts from the protocols' specifications: gRPC-Web's `PROTOCOL-WEB.md`
//! (trailers as an `0x80`-flagged frame of HTTP/1 header lines; the text
//! variant base64-encodes the body, a response in independently padded
//! pieces) and connectrpc.com/docs/protocol (unary bodies unframed, errors
//! as JSON with a non-200 status, trailers as `trailer-` headers; streams in
//! envelopes ending with a `0x02`-flagged JSON end-of-stream message).

pub mod connect;
mod reader;
mod request;
mod text;

pub use reader::{Event, Outcome, ResponseReader};
pub use request::{
    encode_message, envelope, get_query, has_no_side_effects, request_headers, RequestError,
};

use crate::StreamingKind;

/// How a call travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC over HTTP/2, trailers and all (Node's `node:http2`).
    Grpc,
    /// gRPC-Web, `application/grpc-web+proto`.
    GrpcWeb,
    /// gRPC-Web text, `application/grpc-web-text`: the body in base64.
    GrpcWebText,
    /// The Connect protocol.
    Connect,
}

impl Protocol {
    /// `grpc`, `grpc-web`, `grpc-web-text` or `connect`.
    pub fn from_name(name: &str) -> Option<Protocol> {
        Some(match name {
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "grpc-web-text" => Protocol::GrpcWebText,
            "connect" => Protocol::Connect,
            _ => return None,
        })
    }
}

/// How messages are written. gRPC and gRPC-Web carry protobuf; Connect
/// either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Proto,
    Json,
}

impl Codec {
    /// `proto` or `json`.
    pub fn from_name(name: &str) -> Option<Codec> {
        Some(match name {
            "proto" => Codec::Proto,
            "json" => Codec::Json,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Codec::Proto => "proto",
            Codec::Json => "json",
        }
    }
}

/// One call's wire choices: the protocol, the codec, whether its messages
/// are enveloped (every protocol but Connect's unary calls), and whether
/// its response holds one message (unary and client-streaming calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    pub protocol: Protocol,
    pub codec: Codec,
    pub enveloped: bool,
    pub single_response: bool,
}

impl Wire {
    /// The wire for a method of this kind. gRPC and gRPC-Web have no JSON
    /// codec here: they are asked for protobuf.
    pub fn new(protocol: Protocol, codec: Codec, kind: StreamingKind) -> Wire {
        let codec = match protocol {
            Protocol::Connect => codec,
            _ => Codec::Proto,
        };
        Wire {
            protocol,
            codec,
            enveloped: protocol != Protocol::Connect || kind != StreamingKind::Unary,
            single_response: matches!(kind, StreamingKind::Unary | StreamingKind::ClientStreaming),
        }
    }

    /// The request's (and the expected response's) `content-type`.
    pub fn content_type(&self) -> &'static str {
        match (self.protocol, self.codec, self.enveloped) {
            (Protocol::Grpc, ..) => "application/grpc",
            (Protocol::GrpcWeb, ..) => "application/grpc-web+proto",
            (Protocol::GrpcWebText, ..) => "application/grpc-web-text",
            (Protocol::Connect, Codec::Proto, false) => "application/proto",
            (Protocol::Connect, Codec::Json, false) => "application/json",
            (Protocol::Connect, Codec::Proto, true) => "application/connect+proto",
            (Protocol::Connect, Codec::Json, true) => "application/connect+json",
        }
    }
}

/// Request metadata a caller may not set: the headers each protocol
/// writes itself (besides gRPC's reserved keys, which
/// [`crate::Metadata::append`] refuses).
pub fn is_protocol_request_key(name: &str) -> bool {
    is_protocol_header(name) || matches!(name, "x-grpc-web" | "accept")
}

/// Response headers that belong to the protocol or to HTTP, not to the
/// application: never reported as metadata.
pub fn is_protocol_header(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "content-length"
            | "content-encoding"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "grpc-status"
            | "grpc-message"
            | "grpc-status-details-bin"
            | "grpc-encoding"
            | "grpc-accept-encoding"
            | "accept-encoding"
            | "vary"
    ) || name.starts_with(':')
        || name.starts_with("connect-")
        || name.starts_with("access-control-")
}

#[cfg(test)]
mod tests;
