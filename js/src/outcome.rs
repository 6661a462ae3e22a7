//! Statuses and events as the JSON the JavaScript side parses.

use grpc_wasm::details::decode_details;
use grpc_wasm::web::Outcome;
use grpc_wasm::{JsonOptions, Registry, Status};
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
/// (an array of numbers, which the JavaScript side makes a Uint8Array).
fn metadata_json(pairs: &[(String, String)]) -> Value {
    let mut map = Map::new();
    for (key, value) in pairs {
        if grpc_wasm::metadata::is_binary_key(key) {
            if let Ok(bytes) = grpc_wasm::metadata::decode_binary(key, value.as_bytes()) {
                map.insert(key.clone(), json!(bytes));
            }
            continue;
        }
        let joined = match map.get(key).and_then(Value::as_str) {
            Some(before) => format!("{before}, {value}"),
            None => value.clone(),
        };
        map.insert(key.clone(), Value::String(joined));
    }
    Value::Object(map)
}

/// Events as `{"messages": [...], "end": outcome | null}`. Messages are
/// already JSON text, spliced in without a second parse.
pub fn events_json(messages: &[String], end: Option<Value>) -> String {
    let mut out = String::from("{\"messages\":[");
    out.push_str(&messages.join(","));
    out.push_str("],\"end\":");
    match end {
        Some(value) => out.push_str(&value.to_string()),
        None => out.push_str("null"),
    }
    out.push('}');
    out
}
