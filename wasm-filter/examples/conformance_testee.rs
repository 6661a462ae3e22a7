//! A testee for protobuf's conformance suite, built on the core alone.
//!
//! The protobuf source tree (for conformance.proto and the test messages) is
//! named by the PROTOBUF_SRC environment variable or the first argument; the
//! runner starts the testee without arguments, so `make conformance` sets it.
//! The runner speaks on stdin/stdout: a little-endian u32 length, then a
//! ConformanceRequest; we answer the same way with a ConformanceResponse.
//! The request and response are themselves handled as dynamic messages.

use std::io::{self, Read, Write};
use std::path::Path;

use grpc_wasm::json::{decode_message, json_to_message, message_to_json};
use grpc_wasm::{encode_deterministic, JsonOptions, Registry};
use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, Value};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PROTOBUF_SRC").ok())
        .ok_or("set PROTOBUF_SRC to the protobuf source tree")?;
    let registry = load(Path::new(&root))?;
    let request_type = registry.message("conformance.ConformanceRequest")?;
    let response_type = registry.message("conformance.ConformanceResponse")?;
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    while let Some(request) = read_frame(&mut stdin)? {
        let request = DynamicMessage::decode(request_type.clone(), request.as_slice())?;
        let (field, value) = serve(&registry, &request);
        let mut response = DynamicMessage::new(response_type.clone());
        response.set_field_by_name(field, value);
        let bytes = response.encode_to_vec();
        stdout.write_all(&(bytes.len() as u32).to_le_bytes())?;
        stdout.write_all(&bytes)?;
        stdout.flush()?;
    }
    Ok(())
}

fn load(root: &Path) -> Result<Registry, Box<dyn std::error::Error>> {
    let mut sources = Vec::new();
    for (name, path) in FILES {
        sources.push((name, std::fs::read_to_string(root.join(path))?));
    }
    let mut registry = Registry::new()?;
    registry.add_sources(sources.iter().map(|(n, s)| (*n, s.as_str())))?;
    Ok(registry)
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
fn serve(registry: &Registry, request: &DynamicMessage) -> (&'static str, Value) {
    let message_type = string_field(request, "message_type");
    let Ok(desc) = registry.message(&message_type) else {
        return skipped(format!("unsupported message type {message_type}"));
    };
    let category = enum_field(request, "test_category");
    let options = JsonOptions {
        ignore_unknown_fields: category == JSON_IGNORE_UNKNOWN_PARSING_TEST,
        ..Default::default()
    };
    let parsed = if request.has_field_by_name("protobuf_payload") {
        decode_message(&desc, &bytes_field(request, "protobuf_payload"))
    } else if request.has_field_by_name("json_payload") {
        json_to_message(
            &desc,
            string_field(request, "json_payload").as_bytes(),
            &options,
        )
    } else {
        return skipped("only protobuf and JSON input are supported".into());
    };
    let message = match parsed {
        Ok(message) => message,
        Err(e) => return ("parse_error", Value::String(e.to_string())),
    };
    write_output(
        &desc,
        &message,
        enum_field(request, "requested_output_format"),
        &options,
    )
}

fn write_output(
    _desc: &MessageDescriptor,
    message: &DynamicMessage,
    format: i32,
    options: &JsonOptions,
) -> (&'static str, Value) {
    match format {
        PROTOBUF => (
            "protobuf_payload",
            Value::Bytes(encode_deterministic(message).into()),
        ),
        JSON => match message_to_json(message, options) {
            Ok(json) => ("json_payload", Value::String(json)),
            Err(e) => ("serialize_error", Value::String(e.to_string())),
        },
        _ => skipped("only protobuf and JSON output are supported".into()),
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
