//! JSON ⇄ protobuf over a schema with every scalar, maps, oneofs,
//! recursion, `Any`, `Struct`/`Value` and the other well-known types. What
//! the codec writes it must read back: JSON it accepted prints again, and
//! JSON it printed parses again and prints the same. Protobuf is printed
//! from its wire bytes; decoded into a `DynamicMessage` and printed from
//! that tree, it must give the same JSON (or fail too).
//!
//! Input: `[flags, type]` then the payload. Flag bits 0–4 are the JSON
//! options, bit 5 reads the payload as protobuf instead of JSON; `type`
//! picks one of `MESSAGE_TYPES`.

#![no_main]

use grpc_wasm::json::{decode_message, json_to_protobuf, message_to_json, protobuf_to_json};
use grpc_wasm_fuzz::{header, json_options, on_host_stack, registry, MESSAGE_TYPES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let Some(([flags, pick], payload)) = header::<2>(data) else {
        return;
    };
    let name = MESSAGE_TYPES[usize::from(pick) % MESSAGE_TYPES.len()];
    let desc = registry()
        .message(name)
        .expect("the schema has every listed type");
    let options = json_options(flags);
    let bytes = if flags & 0x20 == 0 {
        match json_to_protobuf(&desc, payload, &options) {
            Ok(bytes) => bytes,
            Err(_) => return,
        }
    } else {
        payload.to_vec()
    };
    let printed = protobuf_to_json(&desc, &bytes, &options);
    let by_tree = decode_message(&desc, &bytes).and_then(|m| message_to_json(&m, &options));
    match (&printed, &by_tree) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the wire and the tree print differently ({name})"),
        // The wire printer alone bounds the JSON per wire byte.
        (Err(e), Ok(_)) => assert!(
            matches!(e, grpc_wasm::Error::TooCostly { .. }),
            "the tree prints what the wire refuses ({name}): {e}"
        ),
        (Ok(_), Err(e)) => panic!("the wire prints what the tree refuses ({name}): {e}"),
        (Err(_), Err(_)) => {}
    }
    let Ok(printed) = printed else {
        assert!(
            flags & 0x20 != 0,
            "JSON that was accepted does not print: {name}"
        );
        return;
    };
    let again = json_to_protobuf(&desc, printed.as_bytes(), &options)
        .unwrap_or_else(|e| panic!("printed JSON does not parse ({name}): {e}\n{printed}"));
    let reprinted = protobuf_to_json(&desc, &again, &options)
        .unwrap_or_else(|e| panic!("re-encoded bytes do not print ({name}): {e}"));
    // Compared as JSON values whose numbers are compared as numbers, in
    // which -0 equals 0: a negative zero in a float without presence is
    // dropped as the default on the way back to protobuf (a known
    // difference, listed in the README), which only shows when defaults
    // are printed; whole floats print without a fraction (`-0`, `2`), which
    // serde_json reads as integers.
    let value = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .map(numbers)
    };
    assert!(
        value(&printed).is_some() && value(&printed) == value(&reprinted),
        "printing is not stable ({name}):\n{printed}\n{reprinted}"
    );
}

/// Every number of a JSON value as an f64, so that `-0` and `0.0` (or `2`
/// and `2.0`) compare equal.
fn numbers(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Number(n), Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers).collect()),
        Value::Object(fields) => {
            Value::Object(fields.into_iter().map(|(k, v)| (k, numbers(v))).collect())
        }
        other => other,
    }
}
