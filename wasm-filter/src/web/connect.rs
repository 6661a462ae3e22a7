//! The Connect protocol's JSON: errors, the end-of-stream message, and code
//! names.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};
use prost::Message;
use serde::Deserialize;
use std::collections::BTreeMap;

use crate::code::Code;
use crate::details::RpcStatus;
use crate::status::Status;

/// The prefix of a unary response's trailers, sent as headers.
pub const TRAILER_PREFIX: &str = "trailer-";

/// Connect writes detail values in base64, padded or not; decoders must
/// take both alphabets.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Deserialize)]
struct ErrorJson {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Vec<DetailJson>,
}

#[derive(Deserialize)]
struct DetailJson {
    #[serde(rename = "type")]
    type_name: String,
    value: String,
}

#[derive(Deserialize)]
struct EndJson {
    error: Option<ErrorJson>,
    #[serde(default)]
    metadata: BTreeMap<String, Vec<String>>,
}

/// The code for a Connect code name (`not_found`; `canceled` with one L).
pub fn code_from_name(name: &str) -> Option<Code> {
    match name {
        "canceled" => Some(Code::Cancelled),
        "ok" => None,
        _ => Code::from_name(&name.to_ascii_uppercase()),
    }
}

/// The status of a unary answer that is not 200: its JSON error (a code
/// this client does not know is UNKNOWN, its message kept), or, when the
/// body is no such JSON (a proxy's page), the HTTP status's code.
pub fn error_from_body(http_status: u16, body: &[u8]) -> Status {
    match serde_json::from_slice::<ErrorJson>(body) {
        Ok(error) if !error.code.is_empty() => {
            let code = code_from_name(&error.code).unwrap_or(Code::Unknown);
            status_of(code, error)
        }
        _ => Status::from_http_status(http_status),
    }
}

/// The status and trailers of a stream's end-of-stream message.
pub fn end_of_stream(json: &[u8]) -> (Status, Vec<(String, String)>) {
    let end: EndJson = match serde_json::from_slice(json) {
        Ok(end) => end,
        Err(e) => {
            let status = Status::new(
                Code::Internal,
                format!("the Connect end-of-stream message is not valid JSON: {e}"),
            );
            return (status, Vec::new());
        }
    };
    let trailers = end
        .metadata
        .into_iter()
        .flat_map(|(name, values)| {
            let name = name.to_ascii_lowercase();
            values.into_iter().map(move |v| (name.clone(), v))
        })
        .collect();
    let status = match end.error {
        None => Status::ok(),
        Some(error) => {
            let code = code_from_name(&error.code).unwrap_or(Code::Unknown);
            status_of(code, error)
        }
    };
    (status, trailers)
}

/// A unary answer's trailers, their `trailer-` prefix taken off.
pub fn unary_trailers(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix(TRAILER_PREFIX)?;
            Some((name.to_string(), value.clone()))
        })
        .collect()
}

/// The status, its details kept as an encoded `google.rpc.Status` as
/// gRPC's `grpc-status-details-bin` carries them, so that one decoder
/// serves every protocol. Details whose value is not base64 are dropped.
fn status_of(code: Code, error: ErrorJson) -> Status {
    let details: Vec<prost_types::Any> = error
        .details
        .iter()
        .filter_map(|detail| {
            let value = detail.value.replace('-', "+").replace('_', "/");
            // The spec's "type" is a bare message name; Envoy's bridge
            // writes a whole type URL. Both are read.
            let type_url = match detail.type_name.contains('/') {
                true => detail.type_name.clone(),
                false => format!("type.googleapis.com/{}", detail.type_name),
            };
            Some(prost_types::Any {
                type_url,
                value: LENIENT.decode(value.trim()).ok()?,
            })
        })
        .collect();
    let encoded = (!details.is_empty()).then(|| {
        RpcStatus {
            code: code.as_i32(),
            message: error.message.clone(),
            details,
        }
        .encode_to_vec()
    });
    Status {
        details: encoded,
        ..Status::new(code, error.message)
    }
}
