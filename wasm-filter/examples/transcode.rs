//! Batch JSON ⇄ protobuf through the core, one request per line; the engine
//! of the differential test (host-tests/differential).
//!
//! Usage: transcode DIR FILE.proto...   (files named relative to DIR)
//!
//! Each stdin line is a JSON object:
//!   {"type": "pkg.Msg", "json": "<JSON text>"}   → {"bin": "<base64>", "json": "<JSON from those bytes>"}
//!   {"type": "pkg.Msg", "bin": "<base64>"}        → {"json": "<JSON text>"}
//! with optional "options": {"emit_defaults", "int64_as_number",
//! "enums_as_numbers", "proto_field_names", "ignore_unknown_fields"}.
//! A failure answers {"error": "<message>"}.

use std::io::{self, BufRead, Write};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{JsonOptions, Registry};
use serde_json::{json, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: transcode DIR FILE.proto...")?;
    let mut sources = Vec::new();
    for name in args {
        let text = std::fs::read_to_string(std::path::Path::new(&dir).join(&name))?;
        sources.push((name, text));
    }
    let mut registry = Registry::new()?;
    registry.add_sources(sources.iter().map(|(n, s)| (n.as_str(), s.as_str())))?;

    let stdout = io::stdout();
    let mut out = stdout.lock();
    for line in io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match handle(&registry, &line) {
            Ok(v) => v,
            Err(e) => json!({ "error": e }),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn handle(registry: &Registry, line: &str) -> Result<Value, String> {
    let request: Value =
        serde_json::from_str(line).map_err(|e| format!("bad request line: {e}"))?;
    let type_name = request["type"].as_str().ok_or("request has no \"type\"")?;
    let desc = registry.message(type_name).map_err(|e| e.to_string())?;
    let options = options(&request["options"]);
    if let Some(text) = request["json"].as_str() {
        let bytes =
            json_to_protobuf(&desc, text.as_bytes(), &options).map_err(|e| e.to_string())?;
        let back =
            protobuf_to_json(&desc, &bytes, &JsonOptions::default()).map_err(|e| e.to_string())?;
        return Ok(json!({ "bin": STANDARD.encode(&bytes), "json": back }));
    }
    let encoded = request["bin"]
        .as_str()
        .ok_or("request has neither \"json\" nor \"bin\"")?;
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|e| format!("bad base64: {e}"))?;
    let text = protobuf_to_json(&desc, &bytes, &options).map_err(|e| e.to_string())?;
    Ok(json!({ "json": text }))
}

fn options(value: &Value) -> JsonOptions {
    let flag = |name: &str| value[name].as_bool().unwrap_or(false);
    JsonOptions {
        emit_defaults: flag("emit_defaults"),
        int64_as_number: flag("int64_as_number"),
        enums_as_numbers: flag("enums_as_numbers"),
        proto_field_names: flag("proto_field_names"),
        ignore_unknown_fields: flag("ignore_unknown_fields"),
    }
}
