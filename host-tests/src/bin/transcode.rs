//! Batch JSON ⇄ protobuf through the core, one request per line; the driver
//! of the differential test (host-tests/differential).
//!
//! Usage: transcode DIR FILE.proto...   (files named relative to DIR)
//! `CORE_WASM=path/grpc_wasm.wasm` runs the core as that module instead of
//! natively (see `host-tests/src/engine.rs`).
//!
//! Each stdin line is a JSON object:
//! ```text
//! {"type": "pkg.Msg", "json": "<JSON text>"}   → {"bin": "<base64>", "json": "<JSON from those bytes>"}
//! {"type": "pkg.Msg", "bin": "<base64>"}        → {"json": "<JSON text>"}
//! ```
//! with optional `"options": {"emit_defaults", "int64_as_number",
//! "enums_as_numbers", "proto_field_names", "ignore_unknown_fields"}`.
//! The core refusing an input answers `{"error": "<message>"}`; the engine
//! failing (a trap in the module) ends the tool with an error, so that it is
//! never taken for a rejection.

use std::io::{self, BufRead, Write};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use grpc_wasm::JsonOptions;
// Not in the library: it links wasmtime, which every server binary would
// then carry through its LTO link (minutes each).
#[path = "../engine.rs"]
mod engine;

use engine::{Engine, EngineError};
use serde_json::{json, Value};

fn main() -> Result<(), host_tests::BoxError> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: transcode DIR FILE.proto...")?;
    let mut sources = Vec::new();
    for name in args {
        let text = std::fs::read_to_string(std::path::Path::new(&dir).join(&name))?;
        sources.push((name, text));
    }
    let mut engine = Engine::from_env(&sources)?;

    let stdout = io::stdout();
    let mut out = stdout.lock();
    for line in io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match handle(&mut engine, &line) {
            Ok(v) => v,
            Err(EngineError::Refused(e)) => json!({ "error": e }),
            Err(broken) => return Err(format!("{} engine: {broken}", engine.name()).into()),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn handle(engine: &mut Engine, line: &str) -> Result<Value, EngineError> {
    let refused = |e: String| EngineError::Refused(e);
    let request: Value =
        serde_json::from_str(line).map_err(|e| refused(format!("bad request line: {e}")))?;
    let type_name = request["type"]
        .as_str()
        .ok_or_else(|| refused("request has no \"type\"".into()))?;
    let options = options(&request["options"]);
    if let Some(text) = request["json"].as_str() {
        let bytes = engine.json_to_proto(type_name, text.as_bytes(), &options)?;
        let back = engine.proto_to_json(type_name, &bytes, &JsonOptions::default())?;
        return Ok(json!({ "bin": STANDARD.encode(&bytes), "json": back }));
    }
    let encoded = request["bin"]
        .as_str()
        .ok_or_else(|| refused("request has neither \"json\" nor \"bin\"".into()))?;
    let bytes = STANDARD
        .decode(encoded)
        .map_err(|e| refused(format!("bad base64: {e}")))?;
    let text = engine.proto_to_json(type_name, &bytes, &options)?;
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
