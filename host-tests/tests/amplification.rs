//! What transcoding holds is linear in its input with a small constant
//! (issue 26, item 3): every case of `make bench-amplification`, at 1 MiB,
//! holds at most 8 bytes of heap per input byte, its output included.
//! Reading a request's JSON into a tree and a `DynamicMessage` held 22 to
//! 95. A response whose JSON passes its limit (8 bytes per wire byte) is
//! refused within the same bound: the printer keeps 3 bytes per wire byte
//! and counts the rest (it held 24x and 26x, then 12x and 14x). A flat
//! message with one field repeated held 24x, a string of control
//! characters and packed bools 12x.

use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{JsonOptions, Registry};
use host_tests::amplification::{measure, requests, responses, Counting, PROTO};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SIZE: usize = 1 << 20;
const MAX_PER_BYTE: usize = 8;

#[test]
fn transcoding_holds_at_most_eight_bytes_per_input_byte() {
    let mut registry = Registry::new().unwrap();
    registry.add_sources([("amp.proto", PROTO)]).unwrap();
    let options = JsonOptions::default();
    for (name, type_name, json) in requests(SIZE) {
        let desc = registry.message(type_name).unwrap();
        let (peak, _, outcome) = measure(|| {
            json_to_protobuf(&desc, &json, &options)
                .map(|bytes| bytes.len())
                .map_err(|e| e.to_string())
        });
        assert!(outcome.ends_with("MiB out"), "{name}: {outcome}");
        assert!(
            peak <= MAX_PER_BYTE * json.len(),
            "{name}: {peak} bytes held for {} bytes of JSON",
            json.len()
        );
    }
    for (name, type_name, bytes) in responses(SIZE) {
        let desc = registry.message(type_name).unwrap();
        let (peak, _, outcome) = measure(|| {
            protobuf_to_json(&desc, &bytes, &options)
                .map(|json| json.len())
                .map_err(|e| e.to_string())
        });
        if !outcome.contains("its JSON passes") {
            assert!(outcome.ends_with("MiB out"), "{name}: {outcome}");
        }
        assert!(
            peak <= MAX_PER_BYTE * bytes.len(),
            "{name}: {peak} bytes held for {} bytes of protobuf",
            bytes.len()
        );
    }
}
