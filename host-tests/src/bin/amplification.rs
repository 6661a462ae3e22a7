//! `make bench-amplification`: what the core's transcoding costs per input
//! byte on the inputs that cost the most, natively: the peak heap above
//! the input (a counting allocator) and the time, for protobuf -> JSON
//! (responses) and JSON -> protobuf (requests) of about 4 MiB each. wasm32
//! pointers are half as wide, so the module's memory is at most this.

use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{JsonOptions, Registry};
use host_tests::amplification::{measure, requests, responses, Counting, PROTO};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SIZE: usize = 4 << 20;

fn report(name: &str, input: usize, (peak, secs, outcome): (usize, f64, String)) {
    let mib = input as f64 / (1 << 20) as f64;
    println!(
        "{name:<30} {mib:>6.2} MiB  peak {:>7.1} MiB ({:>5.1}x)  {:>7.1} ms/MiB  {outcome}",
        peak as f64 / (1 << 20) as f64,
        peak as f64 / input as f64,
        secs * 1000.0 / mib
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `amplification Points` runs only the cases whose name holds "Points"
    // (for a profiler).
    let only = std::env::args().nth(1).unwrap_or_default();
    // `amplification Points 20` runs each 20 times, for a profiler.
    let times: usize = std::env::args()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let mut registry = Registry::new()?;
    registry.add_sources([("amp.proto", PROTO)])?;
    let options = JsonOptions::default();
    println!("protobuf -> JSON (responses)");
    for (name, type_name, bytes) in responses(SIZE) {
        if !name.contains(only.as_str()) {
            continue;
        }
        let desc = registry.message(type_name)?;
        for _ in 1..times {
            let _ = protobuf_to_json(&desc, &bytes, &options);
        }
        let cost = measure(|| {
            protobuf_to_json(&desc, &bytes, &options)
                .map(|json| json.len())
                .map_err(|e| e.to_string())
        });
        report(name, bytes.len(), cost);
    }
    println!("JSON -> protobuf (requests)");
    for (name, type_name, json) in requests(SIZE) {
        if !name.contains(only.as_str()) {
            continue;
        }
        let desc = registry.message(type_name)?;
        let cost = measure(|| {
            json_to_protobuf(&desc, &json, &options)
                .map(|bytes| bytes.len())
                .map_err(|e| e.to_string())
        });
        report(name, json.len(), cost);
    }
    Ok(())
}
