//! A testee for protobuf's conformance suite, over the core's conversions
//! run natively or, with `CORE_WASM=path/grpc_wasm.wasm`, inside the module
//! the hosts run (see `host-tests/src/engine.rs`).
//!
//! The protobuf source tree (for conformance.proto and the test messages) is
//! named by the PROTOBUF_SRC environment variable or the first argument; the
//! runner starts the testee without arguments, so `make conformance` sets it.
//! The runner speaks on stdin/stdout: a little-endian u32 length, then a
//! ConformanceRequest; we answer the same way with a ConformanceResponse.
//! The request and response are themselves handled as dynamic messages, by
//! a native registry of the harness's own: only the payloads go through the
//! engine under test.

use std::io::{self, Read, Write};
use std::path::Path;

use grpc_wasm::{JsonOptions, Registry};
// Not in the library: it links wasmtime, which every server binary would
// then carry through its LTO link (minutes each).
#[path = "../engine.rs"]
mod engine;

use engine::{Engine, EngineError};
use prost::Message;
use prost_reflect::{DynamicMessage, Value};

const FILES: [(&str, &str); 3] = [
    (
        "conformance/conformance.proto",
        "conformance/conformance.proto",
    ),
    (
        "google/protobuf/test_messages_proto3.proto",
        "src/google/protobuf/test_messages_proto3.proto",
    ),
    (
        "google/protobuf/test_messages_proto2.proto",
        "src/google/protobuf/test_messages_proto2.proto",
    ),
];

const PROTOBUF: i32 = 1;
const JSON: i32 = 2;
const JSON_IGNORE_UNKNOWN_PARSING_TEST: i32 = 3;

fn main() -> Result<(), host_tests::BoxError> {
    let root = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PROTOBUF_SRC").ok())
        .ok_or("set PROTOBUF_SRC to the protobuf source tree")?;
    let sources = read_sources(Path::new(&root))?;
    let mut registry = Registry::new()?;
    registry.add_sources(sources.iter().map(|(n, s)| (n.as_str(), s.as_str())))?;
    let mut engine = Engine::from_env(&sources)?;
    let request_type = registry.message("conformance.ConformanceRequest")?;
    let response_type = registry.message("conformance.ConformanceResponse")?;
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    while let Some(request) = read_frame(&mut stdin)? {
        let request = DynamicMessage::decode(request_type.clone(), request.as_slice())?;
        let (field, value) = serve(&registry, &mut engine, &request);
        let mut response = DynamicMessage::new(response_type.clone());
        response.set_field_by_name(field, value);
        let bytes = response.encode_to_vec();
        stdout.write_all(&(bytes.len() as u32).to_le_bytes())?;
        stdout.write_all(&bytes)?;
        stdout.flush()?;
    }
    Ok(())
}

fn read_sources(root: &Path) -> io::Result<Vec<(String, String)>> {
    FILES
        .iter()
        .map(|(name, path)| Ok((name.to_string(), std::fs::read_to_string(root.join(path))?)))
        .collect()
}

fn read_frame(input: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
    input.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// The response's oneof field and its value.
fn serve(
    registry: &Registry,
    engine: &mut Engine,
    request: &DynamicMessage,
) -> (&'static str, Value) {
    let message_type = string_field(request, "message_type");
    if registry.message(&message_type).is_err() {
        return skipped(format!("unsupported message type {message_type}"));
    }
    let category = enum_field(request, "test_category");
    let options = JsonOptions {
        ignore_unknown_fields: category == JSON_IGNORE_UNKNOWN_PARSING_TEST,
        ..Default::default()
    };
    // Parsing alone first, so that a failure is told apart from one in
    // writing the output, as the suite requires.
    let parsed = if request.has_field_by_name("protobuf_payload") {
        engine.proto_to_proto(&message_type, &bytes_field(request, "protobuf_payload"))
    } else if request.has_field_by_name("json_payload") {
        let json = string_field(request, "json_payload");
        engine.json_to_proto(&message_type, json.as_bytes(), &options)
    } else {
        return skipped("only protobuf and JSON input are supported".into());
    };
    let bytes = match parsed {
        Ok(bytes) => bytes,
        Err(e) => return failed("parse_error", e),
    };
    match enum_field(request, "requested_output_format") {
        PROTOBUF => ("protobuf_payload", Value::Bytes(bytes.into())),
        JSON => match engine.proto_to_json(&message_type, &bytes, &options) {
            Ok(json) => ("json_payload", Value::String(json)),
            Err(e) => failed("serialize_error", e),
        },
        _ => skipped("only protobuf and JSON output are supported".into()),
    }
}

/// The engine failing is a runtime error: the suite counts it as a failed
/// test whatever the test expected.
fn failed(field: &'static str, e: EngineError) -> (&'static str, Value) {
    match e {
        EngineError::Refused(reason) => (field, Value::String(reason)),
        broken => ("runtime_error", Value::String(broken.to_string())),
    }
}

fn skipped(reason: String) -> (&'static str, Value) {
    ("skipped", Value::String(reason))
}

fn string_field(message: &DynamicMessage, name: &str) -> String {
    message
        .get_field_by_name(name)
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn bytes_field(message: &DynamicMessage, name: &str) -> Vec<u8> {
    message
        .get_field_by_name(name)
        .and_then(|v| v.as_bytes().map(|b| b.to_vec()))
        .unwrap_or_default()
}

fn enum_field(message: &DynamicMessage, name: &str) -> i32 {
    message
        .get_field_by_name(name)
        .and_then(|v| v.as_enum_number())
        .unwrap_or(0)
}
