//! `make bench-amplification`: what the core's transcoding costs per input
//! byte on the inputs that cost the most, natively: the peak heap above
//! the input (a counting allocator) and the time, for protobuf -> JSON
//! (responses) and JSON -> protobuf (requests) of about 4 MiB each. wasm32
//! pointers are half as wide, so the module's memory is at most this.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{JsonOptions, Registry};

/// The system allocator, counting what is live and its peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only counters are
// kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on to `System`.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout (the caller's
        // contract).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PROTO: &str = r#"syntax = "proto3";
package amp;
import "google/protobuf/timestamp.proto";
enum Long {
  LONG_ZERO_AND_A_NAME_THAT_GOES_ON_AND_ON_FOR_SIXTY_FOUR_CHARACTERS_ = 0;
  LONG_ONE_AND_A_NAME_THAT_GOES_ON_AND_ON_FOR_SIXTY_FOUR_CHARACTERS__ = 1;
}
message Point { int32 a = 1; int32 b = 2; }
message Small { int32 a = 1; }
message Lists {
  repeated Long enums = 1;
  repeated google.protobuf.Timestamp times = 2;
  repeated Point points = 3;
  repeated int32 ints = 4;
  repeated string words = 5;
}
"#;

const SIZE: usize = 4 << 20;

fn field(number: u32, wire: u8) -> u8 {
    ((number << 3) as u8) | wire
}

fn packed(number: u32, values: &[u8]) -> Vec<u8> {
    let mut out = vec![field(number, 2)];
    prost::encoding::encode_varint(values.len() as u64, &mut out);
    out.extend_from_slice(values);
    out
}

/// Protobuf inputs of about SIZE bytes: (name, type, bytes).
fn responses() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        (
            "unknown 2-byte fields",
            "amp.Small",
            [field(9, 0), 1].repeat(SIZE / 2),
        ),
        (
            "packed enum, 66-char names",
            "amp.Lists",
            packed(1, &vec![1; SIZE]),
        ),
        (
            "empty Timestamps",
            "amp.Lists",
            [field(2, 2), 0].repeat(SIZE / 2),
        ),
        (
            "Points of two small ints",
            "amp.Lists",
            [field(3, 2), 4, 0x08, 1, 0x10, 2].repeat(SIZE / 6),
        ),
        ("packed 1-byte ints", "amp.Lists", packed(4, &vec![1; SIZE])),
        (
            "1-char strings",
            "amp.Lists",
            [field(5, 2), 1, b'x'].repeat(SIZE / 3),
        ),
    ]
}

/// JSON inputs of about SIZE bytes.
fn requests() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let list = |item: &str| {
        let n = SIZE / (item.len() + 1);
        format!("[{}]", vec![item; n].join(","))
    };
    vec![
        (
            "ints [1,1,...]",
            "amp.Lists",
            format!("{{\"ints\":{}}}", list("1")).into_bytes(),
        ),
        (
            "points [{\"a\":1},...]",
            "amp.Lists",
            format!("{{\"points\":{}}}", list("{\"a\":1}")).into_bytes(),
        ),
        (
            "strings [\"x\",...]",
            "amp.Lists",
            format!("{{\"words\":{}}}", list("\"x\"")).into_bytes(),
        ),
    ]
}

/// Peak heap above what was live before, in bytes, the time, and the
/// outcome (output bytes, or the error).
fn measure(run: impl FnOnce() -> Result<usize, String>) -> (usize, f64, String) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let outcome = run();
    let secs = started.elapsed().as_secs_f64();
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let outcome = match outcome {
        Ok(bytes) => format!("{:.1} MiB out", bytes as f64 / (1 << 20) as f64),
        Err(e) => e.chars().take(70).collect(),
    };
    (peak, secs, outcome)
}

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
    let mut registry = Registry::new()?;
    registry.add_sources([("amp.proto", PROTO)])?;
    let options = JsonOptions::default();
    println!("protobuf -> JSON (responses)");
    for (name, type_name, bytes) in responses() {
        let desc = registry.message(type_name)?;
        let cost = measure(|| {
            protobuf_to_json(&desc, &bytes, &options)
                .map(|json| json.len())
                .map_err(|e| e.to_string())
        });
        report(name, bytes.len(), cost);
    }
    println!("JSON -> protobuf (requests)");
    for (name, type_name, json) in requests() {
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
