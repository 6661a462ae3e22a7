//! `grpc-status-details-bin` as JSON: any bytes an upstream sends give a
//! status the filter can write, and every detail it renders is JSON.
//!
//! Input: `[flags]` then the header's decoded bytes; flag bits 0–4 are the
//! JSON options.

#![no_main]

use grpc_wasm::details::{decode_details, status_to_json};
use grpc_wasm::{Code, Status};
use grpc_wasm_fuzz::{header, json_options, on_host_stack, registry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let Some(([flags], bytes)) = header::<1>(data) else {
        return;
    };
    let options = json_options(flags);
    if let Ok(details) = decode_details(registry(), bytes, &options) {
        for detail in &details {
            if let Err(e) = serde_json::from_str::<serde_json::Value>(detail) {
                panic!("a detail is not JSON ({e}): {detail}");
            }
        }
    }
    let status = Status {
        details: Some(bytes.to_vec()),
        ..Status::new(Code::Internal, "fuzz")
    };
    let text = status_to_json(registry(), &status, &options);
    if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
        panic!("the status is not JSON ({e}): {text}");
    }
}
