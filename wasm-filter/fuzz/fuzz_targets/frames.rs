//! `FrameDecoder`, with and without gzip and a total budget: the same body
//! cut into chunks of any size yields the same messages and the same error
//! as the whole body at once, no message exceeds the size limit, and the
//! messages together never exceed the total budget.
//!
//! Input: `[flags, max_log2, total_log2, chunk]` then the body. Flag bit 0
//! is gzip, bit 1 sets a total budget.

#![no_main]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use grpc_wasm::{Compression, FrameDecoder};
use grpc_wasm_fuzz::{header, on_host_stack};
use libfuzzer_sys::fuzz_target;

struct Limits {
    encoding: Compression,
    max_message: usize,
    total: Option<usize>,
}

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let Some(([flags, max_log2, total_log2, chunk], body)) = header::<4>(data) else {
        return;
    };
    let limits = Limits {
        encoding: if flags & 1 != 0 {
            Compression::Gzip
        } else {
            Compression::Identity
        },
        max_message: 1 << (max_log2 % 21),
        total: (flags & 2 != 0).then(|| 1 << (total_log2 % 23)),
    };
    let whole = decode(body, body.len().max(1), &limits);
    let chunked = decode(body, usize::from(chunk).max(1), &limits);
    assert_eq!(whole, chunked, "chunk boundaries changed what was decoded");
}

/// Each message as (length, hash), then the error that ended the body.
fn decode(body: &[u8], chunk: usize, limits: &Limits) -> (Vec<(usize, u64)>, Option<String>) {
    let mut decoder = FrameDecoder::new(limits.max_message, limits.encoding);
    if let Some(total) = limits.total {
        decoder.limit_total(total);
    }
    let (mut messages, mut returned) = (Vec::new(), 0usize);
    for piece in body.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => {
                    assert!(
                        message.len() <= limits.max_message,
                        "a message over the limit"
                    );
                    returned += message.len();
                    if let Some(total) = limits.total {
                        assert!(returned <= total, "messages over the total budget");
                    }
                    let mut hasher = DefaultHasher::new();
                    message.hash(&mut hasher);
                    messages.push((message.len(), hasher.finish()));
                }
                Ok(None) => break,
                Err(e) => return (messages, Some(e.to_string())),
            }
        }
    }
    (messages, decoder.finish().err().map(|e| e.to_string()))
}
