//! What a configuration holds when its descriptors came through
//! reflection, against the same files compiled from their `.proto`
//! sources: the filter keeps no more for the one than for the other.

use grpc_wasm::proxy::config::FilterConfig;
use host_tests::amplification::{live, Counting};
use host_tests::reflection::DESCRIPTOR_SET;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PROTOS: [(&str, &str); 5] = [
    (
        "helloworld.proto",
        include_str!("../../protos/helloworld.proto"),
    ),
    ("library.proto", include_str!("../../protos/library.proto")),
    (
        "route_guide.proto",
        include_str!("../../protos/route_guide.proto"),
    ),
    ("echo.proto", include_str!("../../protos/echo.proto")),
    ("testing.proto", include_str!("../../protos/testing.proto")),
];

/// The bytes a configuration keeps, once built.
fn held(build: impl FnOnce() -> FilterConfig) -> (usize, FilterConfig) {
    let before = live();
    let config = build();
    (live() - before, config)
}

#[test]
fn a_reflected_set_holds_no_more_than_the_same_files_compiled() {
    let protos: serde_json::Map<String, serde_json::Value> = PROTOS
        .iter()
        .map(|(name, text)| (name.to_string(), (*text).into()))
        .collect();
    let compiled = serde_json::json!({ "protos": protos }).to_string();
    // Once each first: what the first configuration of a process builds
    // once (the well-known types' pool) is held by neither.
    drop(FilterConfig::from_json(compiled.as_bytes()).unwrap());
    drop(FilterConfig::with_reflected(b"{}", DESCRIPTOR_SET).unwrap());
    let (from_protos, a) = held(|| FilterConfig::from_json(compiled.as_bytes()).unwrap());
    let (reflected, b) = held(|| FilterConfig::with_reflected(b"{}", DESCRIPTOR_SET).unwrap());
    assert_eq!(a.methods.len(), b.methods.len());
    println!("held: from .proto sources {from_protos} B, through reflection {reflected} B");
    assert!(
        reflected <= from_protos + from_protos / 10,
        "{reflected} B through reflection, {from_protos} B compiled"
    );
}
