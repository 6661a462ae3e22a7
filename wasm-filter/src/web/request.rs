//! What a call sends: its headers, and each request message as its wire
//! wants it.

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use prost_reflect::{MethodDescriptor, Value};

use super::{Codec, Protocol, Wire};
use crate::error::Error;
use crate::framing::{encode_frame_into, ACCEPT_ENCODING};
use crate::json::{JsonOptions, MessageType};
use crate::metadata::Metadata;
use crate::timeout::encode_timeout;
use crate::Method;

/// Why a request cannot be made as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0} is not idempotent (option idempotency_level = NO_SIDE_EFFECTS): only such methods may be called by GET")]
    NotIdempotent(String),
    #[error("only Connect unary calls can be made by GET")]
    NotConnectUnary,
}

/// The headers of a call, the application's metadata last. `timeout` is
/// sent as the protocol writes it (`grpc-timeout`, `connect-timeout-ms`).
pub fn request_headers(
    wire: &Wire,
    timeout: Option<Duration>,
    metadata: &Metadata,
) -> Vec<(String, String)> {
    let mut headers = vec![("content-type".to_string(), wire.content_type().to_string())];
    let mut add = |name: &str, value: String| headers.push((name.to_string(), value));
    match wire.protocol {
        Protocol::Grpc => {
            add("te", "trailers".into());
            add("grpc-accept-encoding", ACCEPT_ENCODING.into());
        }
        Protocol::GrpcWeb | Protocol::GrpcWebText => {
            add("accept", wire.content_type().into());
            add("x-grpc-web", "1".into());
        }
        Protocol::Connect => add("connect-protocol-version", "1".into()),
    }
    if let Some(timeout) = timeout {
        match wire.protocol {
            // Connect allows at most ten digits.
            Protocol::Connect => add(
                "connect-timeout-ms",
                timeout.as_millis().clamp(1, 9_999_999_999).to_string(),
            ),
            _ => add("grpc-timeout", encode_timeout(timeout)),
        }
    }
    headers.extend(metadata.to_headers());
    headers
}

/// One request message from its JSON, as the body (or, streaming, the next
/// piece of the body) of the call: protobuf or canonical JSON, enveloped
/// where the wire envelopes, base64 for gRPC-Web text.
pub fn encode_message(
    wire: &Wire,
    message_type: &MessageType,
    json: &[u8],
    options: &JsonOptions,
) -> Result<Vec<u8>, Error> {
    let payload = payload(wire.codec, message_type, json, options)?;
    envelope(wire, payload)
}

/// An encoded message as the body (or the next piece of it) of a call
/// on `wire`: enveloped where the wire envelopes, base64 for gRPC-Web text.
pub fn envelope(wire: &Wire, payload: Vec<u8>) -> Result<Vec<u8>, Error> {
    if !wire.enveloped {
        return Ok(payload);
    }
    let mut framed = Vec::with_capacity(payload.len() + 5);
    encode_frame_into(&payload, &mut framed)?;
    Ok(match wire.protocol {
        Protocol::GrpcWebText => STANDARD.encode(&framed).into_bytes(),
        _ => framed,
    })
}

/// The query string of a Connect unary call made by GET
/// (`?connect=v1&encoding=…&base64=1&message=…`), for methods whose
/// `idempotency_level` is `NO_SIDE_EFFECTS`.
pub fn get_query(
    wire: &Wire,
    method: &Method,
    json: &[u8],
    options: &JsonOptions,
) -> Result<String, Error> {
    if wire.protocol != Protocol::Connect || wire.enveloped {
        return Err(Error::Request(RequestError::NotConnectUnary));
    }
    if !has_no_side_effects(method.descriptor()) {
        return Err(Error::Request(RequestError::NotIdempotent(
            method.path().to_string(),
        )));
    }
    let payload = payload(wire.codec, method.input_type(), json, options)?;
    Ok(format!(
        "connect=v1&encoding={}&base64=1&message={}",
        wire.codec.name(),
        URL_SAFE_NO_PAD.encode(payload)
    ))
}

/// Whether the method says `option idempotency_level = NO_SIDE_EFFECTS`.
pub fn has_no_side_effects(method: &MethodDescriptor) -> bool {
    // MethodOptions.idempotency_level; NO_SIDE_EFFECTS is 1.
    method
        .options()
        .get_field_by_number(34)
        .is_some_and(|value| matches!(value.as_ref(), Value::EnumNumber(1)))
}

fn payload(
    codec: Codec,
    message_type: &MessageType,
    json: &[u8],
    options: &JsonOptions,
) -> Result<Vec<u8>, Error> {
    let protobuf = message_type.json_to_protobuf(json, options)?;
    match codec {
        Codec::Proto => Ok(protobuf),
        // Through protobuf and back: what is sent is checked, and canonical.
        Codec::Json => Ok(message_type
            .protobuf_to_json(&protobuf, &JsonOptions::default())?
            .into_bytes()),
    }
}
