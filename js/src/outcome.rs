//! Statuses and events as the JSON the JavaScript side parses.

use grpc_wasm::details::decode_details;
use grpc_wasm::web::Outcome;
use grpc_wasm::{JsonOptions, Registry, Status};
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// `{code, name, message, details, headers, trailers}`: the shape of both a
/// finished call's status and a thrown error. Details are the decoded
/// `google.rpc.Status` details, each with its `@type`.
pub fn outcome_json(registry: &Registry, outcome: &Outcome, options: &JsonOptions) -> Value {
    let mut value = status_json(registry, &outcome.status, options);
    value["headers"] = metadata_json(&outcome.headers);
    value["trailers"] = metadata_json(&outcome.trailers);
    value
}

pub fn status_json(registry: &Registry, status: &Status, options: &JsonOptions) -> Value {
    let details: Vec<Value> = status
        .details
        .as_deref()
        .and_then(|bytes| decode_details(registry, bytes, options).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|text| serde_json::from_str(text).ok())
        .collect();
    json!({
        "code": status.code.as_i32(),
        "name": status.code.name(),
        "message": status.message,
        "details": details,
    })
}

/// Metadata as an object: one value per key as a string (repeated keys
/// joined by ", ", as HTTP does), a `-bin` key's value as its decoded bytes
/// (an array of numbers, which the JavaScript side makes a Uint8Array), or
/// several such arrays when the key repeats (fetch joins repeated headers
/// with ", "; base64 has no comma). A `-bin` value that is not base64 is
/// kept as the text it came as, not dropped.
fn metadata_json(pairs: &[(String, String)]) -> Value {
    // Each key found once, each value appended once: linear in the
    // metadata, however often a key repeats.
    let mut text: BTreeMap<&str, String> = BTreeMap::new();
    let mut binary: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for (key, value) in pairs {
        if grpc_wasm::metadata::is_binary_key(key) {
            let values = binary.entry(key).or_default();
            values.extend(value.split(',').map(|one| {
                match grpc_wasm::metadata::decode_binary(key, one.trim().as_bytes()) {
                    Ok(bytes) => json!(bytes),
                    Err(_) => json!(one.trim()),
                }
            }));
            continue;
        }
        match text.get_mut(key.as_str()) {
            Some(joined) => {
                joined.push_str(", ");
                joined.push_str(value);
            }
            None => {
                text.insert(key, value.clone());
            }
        }
    }
    let mut map = Map::new();
    for (key, joined) in text {
        map.insert(key.to_string(), Value::String(joined));
    }
    for (key, mut values) in binary {
        let value = match values.len() {
            1 => values.remove(0),
            _ => Value::Array(values),
        };
        map.insert(key.to_string(), value);
    }
    Value::Object(map)
}

/// Events as `{"messages": [...], "end": outcome | null, "more": bool}`.
/// Messages are already JSON text, spliced in without a second parse.
pub fn events_json(messages: &[String], end: Option<Value>, more: bool) -> String {
    let mut out = String::from("{\"messages\":[");
    out.push_str(&messages.join(","));
    out.push_str("],\"end\":");
    match end {
        Some(value) => out.push_str(&value.to_string()),
        None => out.push_str("null"),
    }
    out.push_str(if more {
        ",\"more\":true}"
    } else {
        ",\"more\":false}"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn binary_metadata_keeps_every_value() {
        // fetch joins repeated headers; HTTP/2 trailers repeat the key.
        let joined = metadata_json(&pairs(&[("x-a-bin", "AQI=, AwQ=")]));
        assert_eq!(joined, json!({ "x-a-bin": [[1, 2], [3, 4]] }));
        let repeated = metadata_json(&pairs(&[("x-a-bin", "AQI="), ("x-a-bin", "AwQ")]));
        assert_eq!(repeated, json!({ "x-a-bin": [[1, 2], [3, 4]] }));
        let one = metadata_json(&pairs(&[("x-a-bin", "AQI="), ("x-t", "a"), ("x-t", "b")]));
        assert_eq!(one, json!({ "x-a-bin": [1, 2], "x-t": "a, b" }));
        let broken = metadata_json(&pairs(&[("x-a-bin", "not base64!")]));
        assert_eq!(broken, json!({ "x-a-bin": "not base64!" }));
    }
}
