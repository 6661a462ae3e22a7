//! `make bench`: the core's JSON → protobuf → JSON round trip natively and
//! inside the .wasm under wasmtime, side by side in one run.
//!
//! Rounds alternate native and wasm so that machine noise hits both; the
//! median round is reported. Usage: `core-bench [WASM_PATH]`

use std::time::{Duration, Instant};

use grpc_wasm::json::{json_to_protobuf, protobuf_to_json};
use grpc_wasm::{JsonOptions, Registry};
use lua_shim::CoreModule;

const PROTOS: [(&str, &str); 3] = [
    (
        "helloworld.proto",
        include_str!("../../../protos/helloworld.proto"),
    ),
    (
        "route_guide.proto",
        include_str!("../../../protos/route_guide.proto"),
    ),
    (
        "library.proto",
        include_str!("../../../protos/library.proto"),
    ),
];
const ROUNDS: usize = 7;

struct Case {
    name: &'static str,
    type_name: &'static str,
    json: Vec<u8>,
    iterations: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wasm_path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc_wasm.wasm").to_string()
    });
    let wasm =
        std::fs::read(&wasm_path).map_err(|e| format!("{wasm_path}: {e} (run `make wasm`)"))?;

    let mut registry = Registry::new()?;
    registry.add_sources(PROTOS)?;
    let mut core = CoreModule::new(&wasm)?;
    for (name, source) in PROTOS {
        core.load_proto(name, source)?;
    }

    println!("JSON -> protobuf -> JSON round trip, median of {ROUNDS} alternating rounds");
    println!(
        "{:<34} {:>12} {:>12} {:>11}",
        "message", "native µs/op", "wasm µs/op", "wasm/native"
    );
    for case in cases() {
        let desc = registry.message(case.type_name)?;
        let options = JsonOptions::default();
        // The wasm exports look the type up by name on every call; so does
        // the native side, so that both run the same code.
        let lookup = |name: &str| registry.message(name).map_err(|e| e.to_string());
        // Both sides must agree before their speed means anything.
        let native_out = protobuf_to_json(
            &desc,
            &json_to_protobuf(&desc, &case.json, &options)?,
            &options,
        )?;
        let wasm_bytes = core.json_to_proto(case.type_name, &case.json)?;
        let wasm_out = core.proto_to_json(case.type_name, &wasm_bytes)?;
        if native_out.as_bytes() != wasm_out.as_slice() {
            return Err(format!("{}: native and wasm outputs differ", case.name).into());
        }
        let mut native = Vec::new();
        let mut in_wasm = Vec::new();
        for _ in 0..ROUNDS {
            native.push(time(case.iterations, || {
                let bytes = json_to_protobuf(&lookup(case.type_name)?, &case.json, &options)
                    .map_err(|e| e.to_string())?;
                protobuf_to_json(&lookup(case.type_name)?, &bytes, &options)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?);
            in_wasm.push(time(case.iterations, || {
                let bytes = core
                    .json_to_proto(case.type_name, &case.json)
                    .map_err(|e| e.to_string())?;
                core.proto_to_json(case.type_name, &bytes)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?);
        }
        let (n, w) = (median(native), median(in_wasm));
        println!(
            "{:<34} {:>12.2} {:>12.2} {:>10.2}x",
            format!("{} ({} B JSON)", case.name, case.json.len()),
            n,
            w,
            w / n
        );
    }
    println!(
        "wasm module: {wasm_path}: {} bytes ({:.2} MiB)",
        wasm.len(),
        wasm.len() as f64 / 1048576.0
    );
    Ok(())
}

fn cases() -> Vec<Case> {
    let book = r#"{"name":"shelves/1/books/N","author":"Ursula K. Le Guin","title":"The Dispossessed","genre":"FICTION","tags":["classic","anarchism","space"],"pages":"387"}"#;
    let count = 1024 * 1024 / book.len();
    let books: Vec<String> = (0..count)
        .map(|i| book.replace("books/N", &format!("books/{i}")))
        .collect();
    vec![
        Case { name: "small HelloRequest", type_name: "helloworld.HelloRequest", json: br#"{"name":"foobar"}"#.to_vec(), iterations: 20_000 },
        Case {
            name: "medium routeguide Feature",
            type_name: "routeguide.Feature",
            json: br#"{"name":"Patriots Path, Mendham, NJ 07945, USA","location":{"latitude":407838351,"longitude":-746143763}}"#.to_vec(),
            iterations: 10_000,
        },
        Case {
            name: "large ListBooksResponse",
            type_name: "example.library.v1.ListBooksResponse",
            json: format!(r#"{{"books":[{}],"nextPageToken":"next"}}"#, books.join(",")).into_bytes(),
            iterations: 5,
        },
    ]
}

/// Microseconds per operation over `iterations` calls.
fn time(iterations: usize, mut op: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let start = Instant::now();
    for _ in 0..iterations {
        op()?;
    }
    let elapsed: Duration = start.elapsed();
    Ok(elapsed.as_secs_f64() * 1e6 / iterations as f64)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}
