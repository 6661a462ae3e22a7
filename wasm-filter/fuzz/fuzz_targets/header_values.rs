//! The header values a peer writes: `grpc-timeout`, `grpc-status` with
//! `grpc-message` and `grpc-status-details-bin`, and binary metadata.
//! Parsers fail with an error, never a panic, and what the core encodes it
//! decodes to the same value.
//!
//! Input: `[selector]` then the value.

#![no_main]

use grpc_wasm::metadata::{decode_binary, encode_binary};
use grpc_wasm::status::{percent_decode, percent_encode};
use grpc_wasm::timeout::{encode_timeout, parse_timeout};
use grpc_wasm::{Metadata, Status};
use grpc_wasm_fuzz::{header, on_host_stack};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let Some(([selector], value)) = header::<1>(data) else {
        return;
    };
    match selector % 4 {
        0 => timeout(value),
        1 => status(value),
        2 => message(value),
        _ => metadata(value),
    }
}

/// A parsed timeout encodes to one that is never shorter.
fn timeout(value: &[u8]) {
    let Ok(Ok(duration)) = std::str::from_utf8(value).map(parse_timeout) else {
        return;
    };
    let encoded = encode_timeout(duration);
    let again = parse_timeout(&encoded).expect("an encoded timeout parses");
    assert!(again >= duration, "{encoded} is shorter than {duration:?}");
}

/// The three status headers, split at NUL bytes.
fn status(value: &[u8]) {
    let mut parts = value.splitn(3, |&b| b == 0);
    let (code, message, details) = (parts.next(), parts.next(), parts.next());
    if let Some(status) = Status::from_header_values(code, message, details) {
        let message = status.encoded_message();
        assert_eq!(percent_decode(message.as_bytes()), status.message);
    }
}

/// A message survives `grpc-message` encoding.
fn message(value: &[u8]) {
    let text = String::from_utf8_lossy(value);
    let encoded = percent_encode(&text);
    assert!(encoded.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    assert_eq!(percent_decode(encoded.as_bytes()), text);
    percent_decode(value);
}

/// Binary metadata decodes, or fails, and re-encodes to what decodes again.
fn metadata(value: &[u8]) {
    if let Ok(bytes) = decode_binary("x-bin", value) {
        assert_eq!(
            decode_binary("x-bin", encode_binary(&bytes).as_bytes()).ok(),
            Some(bytes)
        );
    }
    let mut map = Metadata::new();
    let _ = map.append_wire("x-fuzz", value);
    let _ = map.append_wire("x-fuzz-bin", value);
    let _ = map.to_headers();
}
