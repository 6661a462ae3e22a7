//! `grpc_wasm::web::ResponseReader`, what the browser and Node package runs
//! on every answer: any protocol, status, headers and body. It never
//! panics; the same body in chunks of any size yields the same messages
//! and the same final status as the body at once; there is exactly one
//! end, last; no message is over the limit, and a single-message
//! response's messages are not over it together; no batch is far over it.
//!
//! Input: `[wire, http, headers, max_log2, chunk]` then the body. `wire`:
//! bits 0-1 the protocol (gRPC, gRPC-Web, text, Connect), bit 2 JSON, bits
//! 3-4 the method's kind. `http`: 200, or (bit 0) a status from a list.
//! `headers`: bit 0 the right content-type, bit 1 gzip, bit 2 a
//! trailers-only `grpc-status`, bit 3 trailers at the end (gRPC).

#![no_main]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use grpc_wasm::web::{Codec, Event, Protocol, ResponseReader, Wire};
use grpc_wasm::StreamingKind;
use grpc_wasm_fuzz::{header, on_host_stack};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

const KINDS: [StreamingKind; 4] = [
    StreamingKind::Unary,
    StreamingKind::ServerStreaming,
    StreamingKind::ClientStreaming,
    StreamingKind::Bidirectional,
];
const PROTOCOLS: [Protocol; 4] = [
    Protocol::Grpc,
    Protocol::GrpcWeb,
    Protocol::GrpcWebText,
    Protocol::Connect,
];
const STATUSES: [u16; 4] = [400, 404, 503, 204];

fn run(data: &[u8]) {
    let Some(([wire, http, flags, max_log2, chunk], body)) = header::<5>(data) else {
        return;
    };
    let codec = if wire & 4 != 0 {
        Codec::Json
    } else {
        Codec::Proto
    };
    let kind = KINDS[usize::from(wire >> 3) % 4];
    let wire = Wire::new(PROTOCOLS[usize::from(wire) % 4], codec, kind);
    let status = if http & 1 != 0 {
        STATUSES[usize::from(http >> 1) % 4]
    } else {
        200
    };
    let mut headers = Vec::new();
    if flags & 1 != 0 {
        headers.push(("content-type".to_string(), wire.content_type().to_string()));
    }
    if flags & 2 != 0 {
        headers.push(("grpc-encoding".to_string(), "gzip".to_string()));
        headers.push(("connect-content-encoding".to_string(), "gzip".to_string()));
    }
    if flags & 4 != 0 {
        headers.push(("grpc-status".to_string(), "5".to_string()));
    }
    let trailers = (flags & 8 != 0).then(|| vec![("grpc-status".to_string(), "0".to_string())]);
    let max = 1usize << (max_log2 % 20);
    let read = |chunk: usize| {
        let mut r = ResponseReader::new(wire, max);
        Outcome::of(
            &mut r,
            status,
            &headers,
            body,
            chunk,
            trailers.as_deref(),
            max,
        )
    };
    let whole = read(body.len().max(1));
    let chunked = read(usize::from(chunk).max(1));
    // Broken base64 is the one place where pieces differ by design: a
    // chunk's messages are read before the next chunk's bad quad is seen.
    if whole.end.contains("base64") || chunked.end.contains("base64") {
        return;
    }
    assert_eq!(whole, chunked, "chunk boundaries changed the answer");
}

/// Each message as (length, hash), then the final status's text.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    messages: Vec<(usize, u64)>,
    end: String,
}

impl Outcome {
    fn of(
        r: &mut ResponseReader,
        status: u16,
        headers: &[(String, String)],
        body: &[u8],
        chunk: usize,
        trailers: Option<&[(String, String)]>,
        max: usize,
    ) -> Outcome {
        let mut seen = Seen::new(max);
        seen.take(r.headers(status, headers));
        for piece in body.chunks(chunk) {
            seen.take(r.push(piece));
            while r.has_more() {
                seen.take(r.pull());
            }
        }
        seen.take(r.finish(trailers));
        assert!(r.ended(), "finish yields the end");
        let end = seen.end.expect("exactly one end");
        if r.ended() {
            assert!(r.push(b"more").is_empty(), "nothing after the end");
        }
        Outcome {
            messages: seen.messages,
            end,
        }
    }
}

struct Seen {
    max: usize,
    messages: Vec<(usize, u64)>,
    end: Option<String>,
}

impl Seen {
    fn new(max: usize) -> Seen {
        Seen {
            max,
            messages: Vec::new(),
            end: None,
        }
    }

    fn take(&mut self, events: Vec<Event>) {
        let mut batch = 0usize;
        for event in events {
            assert!(self.end.is_none(), "an event after the end");
            match event {
                Event::Message(m) => {
                    assert!(m.len() <= self.max, "a message over the limit");
                    // A batch stops once it reaches the limit: at most one
                    // message past it.
                    assert!(batch < self.max.max(1), "a batch past its budget");
                    batch += m.len().max(1);
                    let mut hasher = DefaultHasher::new();
                    m.hash(&mut hasher);
                    self.messages.push((m.len(), hasher.finish()));
                }
                Event::End(outcome) => {
                    self.end = Some(format!(
                        "{} {}",
                        outcome.status.code, outcome.status.message
                    ));
                }
            }
        }
    }
}
