//! `grpc-status-details-bin`: a `google.rpc.Status` whose details are `Any`s,
//! rendered as JSON for people and JSON clients.

use prost_reflect::{DynamicMessage, Value};

use crate::descriptors::Registry;
use crate::error::Error;
use crate::json::{decode_message, message_to_json, JsonOptions};
use crate::metadata::encode_binary;
use crate::status::Status;

/// `google.rpc.Status` as its details travel: what a transport that
/// carries them some other way (Connect's error JSON) encodes them back
/// into, so that [`decode_details`] serves every protocol.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub(crate) code: i32,
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) details: Vec<prost_types::Any>,
}

/// The status as a `google.rpc.Status` JSON object `{code, message, details}`.
/// Details come from `grpc-status-details-bin` when present and decodable;
/// each detail of a known type is written as that type (with `@type`), an
/// unknown one as `{"@type": url, "value": base64}` so nothing is lost.
pub fn status_to_json(registry: &Registry, status: &Status, options: &JsonOptions) -> String {
    let details = status
        .details
        .as_deref()
        .and_then(|bytes| decode_details(registry, bytes, options).ok())
        .unwrap_or_default();
    format!(
        "{{\"code\":{},\"message\":{},\"details\":[{}]}}",
        status.code.as_i32(),
        json_string(&status.message),
        details.join(",")
    )
}

/// The details of an encoded `google.rpc.Status`, each as JSON text.
pub fn decode_details(
    registry: &Registry,
    bytes: &[u8],
    options: &JsonOptions,
) -> Result<Vec<String>, Error> {
    let status_type = registry.message("google.rpc.Status")?;
    let status = decode_message(&status_type, bytes)?;
    let Some(Value::List(anys)) = status.get_field_by_name("details").map(|v| v.into_owned())
    else {
        return Ok(Vec::new());
    };
    Ok(anys
        .iter()
        .filter_map(Value::as_message)
        .map(|any| any_to_json(registry, any, options))
        .collect())
}

fn any_to_json(registry: &Registry, any: &DynamicMessage, options: &JsonOptions) -> String {
    let type_url = field_str(any, "type_url");
    let value = any
        .get_field_by_name("value")
        .and_then(|v| v.as_bytes().map(|b| b.to_vec()))
        .unwrap_or_default();
    let type_key = format!("{{\"@type\":{}", json_string(&type_url));
    match known_detail(registry, &type_url, &value, options) {
        // A message prints as an object: splice "@type" in as its first key.
        Some(text) if text == "{}" => format!("{type_key}}}"),
        Some(text) if text.starts_with('{') => format!("{type_key},{}", &text[1..]),
        // Well-known types with a scalar JSON form (Duration, ...) nest under "value".
        Some(text) => format!("{type_key},\"value\":{text}}}"),
        None => format!(
            "{type_key},\"value\":{}}}",
            json_string(&encode_binary(&value))
        ),
    }
}

fn known_detail(
    registry: &Registry,
    type_url: &str,
    value: &[u8],
    options: &JsonOptions,
) -> Option<String> {
    let name = type_url.rsplit('/').next()?;
    let desc = registry.message(name).ok()?;
    let message = decode_message(&desc, value).ok()?;
    message_to_json(&message, options).ok()
}

fn json_string(text: &str) -> String {
    // Serializing a str cannot fail.
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_string())
}

fn field_str(message: &DynamicMessage, name: &str) -> String {
    message
        .get_field_by_name(name)
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code::Code;
    use prost::Message;

    fn any(type_url: &str, value: Vec<u8>) -> prost_types::Any {
        prost_types::Any {
            type_url: type_url.into(),
            value,
        }
    }

    #[test]
    fn known_and_unknown_details() {
        let registry = Registry::new().unwrap();
        let error_info = registry.message("google.rpc.ErrorInfo").unwrap();
        let info = crate::json::json_to_protobuf(
            &error_info,
            br#"{"reason":"NO_BOOK","domain":"library","metadata":{"id":"7"}}"#,
            &JsonOptions::default(),
        )
        .unwrap();
        // google.rpc.Status { code = 5, message = "gone", details = [...] }.
        let bytes = RpcStatus {
            code: 5,
            message: "gone".into(),
            details: vec![
                any("type.googleapis.com/google.rpc.ErrorInfo", info),
                any("type.googleapis.com/acme.Secret", vec![1, 2, 3]),
            ],
        }
        .encode_to_vec();
        let status = Status {
            code: Code::NotFound,
            message: "gone".into(),
            details: Some(bytes),
        };
        let got: serde_json::Value =
            serde_json::from_str(&status_to_json(&registry, &status, &JsonOptions::default()))
                .unwrap();
        assert_eq!(
            got,
            serde_json::json!({
                "code": 5,
                "message": "gone",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "NO_BOOK", "domain": "library", "metadata": {"id": "7"}},
                    {"@type": "type.googleapis.com/acme.Secret", "value": "AQID"}
                ]
            })
        );
    }

    #[test]
    fn garbage_details_leave_the_status_intact() {
        let registry = Registry::new().unwrap();
        let status = Status {
            code: Code::Internal,
            message: "x".into(),
            details: Some(vec![0xff]),
        };
        assert_eq!(
            status_to_json(&registry, &status, &JsonOptions::default()),
            r#"{"code":13,"message":"x","details":[]}"#
        );
    }
}
