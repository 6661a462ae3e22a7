//! The proxy-wasm header map codec, as a host hands it over: `visit`,
//! `index` and `deserialize` agree on what is valid, a valid map
//! serializes back to the same bytes, and `changes` over it never asks for
//! a change twice.

#![no_main]

use grpc_wasm::contract::pairs::{self, Change};
use grpc_wasm_fuzz::on_host_stack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let mut entries: Vec<(&[u8], &[u8])> = Vec::new();
    let valid = pairs::visit(data, |k, v| entries.push((k, v))).is_some();
    let index = pairs::index(data);
    let owned = pairs::deserialize(data);
    assert_eq!(valid, index.is_some(), "visit and index disagree");
    assert_eq!(valid, owned.is_some(), "visit and deserialize disagree");
    if !valid {
        return;
    }
    if !data.is_empty() {
        assert_eq!(
            pairs::serialize(&entries),
            data,
            "a valid map does not round-trip"
        );
    }
    for ((key, value), (k, v)) in entries.iter().zip(index.unwrap_or_default()) {
        assert_eq!(
            (*key, *value),
            (&data[k], &data[v]),
            "index points elsewhere"
        );
    }
    let set = [("content-type", "application/grpc"), ("te", "trailers")];
    let changes = pairs::changes(entries.iter().copied(), &set, &["content-length"]);
    for (i, change) in changes.iter().enumerate() {
        assert!(
            !changes[..i].contains(change),
            "a change asked twice: {change:?}"
        );
        if let Change::Remove(name) = change {
            assert_eq!(*name, "content-length");
        }
    }
}
