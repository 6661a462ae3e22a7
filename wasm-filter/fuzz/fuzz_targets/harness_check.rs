//! Not a fuzz target: proof that the harness reports what it must.
//! `scripts/fuzz.sh` runs it on three inputs and fails unless each one
//! crashes: `panic` (a panic on the worker thread), `stack` (recursion past
//! the hosts' 512 KiB stack) and `alloc` (an allocation over 64 MiB).

#![no_main]

use std::hint::black_box;

use grpc_wasm_fuzz::on_host_stack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    match data {
        b"panic" => panic!("harness check: a panic"),
        b"stack" => {
            black_box(deep(1 << 20));
        }
        b"alloc" => {
            black_box(vec![0u8; 128 << 20]);
        }
        _ => {}
    }
}

/// 512 bytes of frame per level, so that the recursion overflows 512 KiB.
fn deep(levels: u64) -> u64 {
    let frame = black_box([levels; 64]);
    match levels {
        0 => 0,
        _ => deep(levels - 1) + frame[3],
    }
}
