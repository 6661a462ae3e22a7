//! The filter's callbacks in any order and with any contents, as
//! Envoy (and any proxy-wasm host with gRPC calls and trailers) would call them (see `grpc_wasm_fuzz::filter`).

#![no_main]

use grpc_wasm_fuzz::on_host_stack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    grpc_wasm_fuzz::filter::run(data, false);
}
