//! The wire transport (`transport::wire::Wire`, HTTP/2 over a socket the
//! caller owns) with a hostile server: calls start, send, half-close, are
//! cancelled and have their gates shut and opened, while the server's side
//! sends well-formed frames with any contents (HEADERS with any fields,
//! DATA raw or as gRPC messages, RST_STREAM, GOAWAY, SETTINGS, PING,
//! WINDOW_UPDATE), raw bytes, and time passes. What must hold:
//!
//! - nothing panics;
//! - every call's events come in Envoy's order: nothing after its end (a
//!   close, or a unary call's message); a unary call's events come at once;
//!   a stream's messages only after its initial metadata, and trailing
//!   metadata only right before the close;
//! - a cancelled call hears nothing more;
//! - a close's code is a gRPC code and its message is `grpc-message` text;
//!   a unary call that ends with a close ends with an error (an OK answer
//!   is its message);
//! - when the socket goes (`Wire::reset`), every call still running ends
//!   with UNAVAILABLE, and none runs on.
//!
//! Input: a list of operations, each an opcode byte and its fields (see
//! `Op::read`); `make_seeds.py` writes the seeds in this format. The
//! server's SETTINGS frame goes first, as a server's preface does.

#![no_main]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use lua_shim::call::{GrpcEvent, GrpcTarget, Token};
use lua_shim::transport::gate::Gate;
use lua_shim::transport::wire::{Produced, Wire};

/// A server's first frame: empty SETTINGS.
const SERVER_PREFACE: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// At most this many calls per input: stream ids stay few, so that the
/// server's frames find them.
const MAX_CALLS: usize = 8;

fuzz_target!(|data: &[u8]| run(data));

/// The input, read front to back; reads past the end give zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        *first
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let len = len.min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        taken.to_vec()
    }

    fn short(&mut self) -> Vec<u8> {
        let len = self.u8();
        self.bytes(usize::from(len))
    }

    fn long(&mut self) -> Vec<u8> {
        let len = self.u16();
        self.bytes(usize::from(len))
    }
}

enum Op {
    Unary {
        message: Vec<u8>,
        timeout_ms: u16,
    },
    Stream,
    Send {
        call: u8,
        message: Vec<u8>,
    },
    CloseSend {
        call: u8,
    },
    Cancel {
        call: u8,
    },
    Gate {
        call: u8,
        open: bool,
    },
    /// Server bytes as they are.
    Raw(Vec<u8>),
    /// A server frame: type, flags, stream, payload.
    Frame(u8, u8, u32, Vec<u8>),
    Tick {
        ms: u16,
    },
    Reset,
}

/// Header names a gRPC response uses, picked by index; others are read.
const NAMES: [&[u8]; 8] = [
    b":status",
    b"content-type",
    b"grpc-status",
    b"grpc-message",
    b"grpc-status-details-bin",
    b"x-meta",
    b"x-meta-bin",
    b"grpc-encoding",
];

impl Op {
    fn read(input: &mut Input<'_>) -> Op {
        match input.u8() % 16 {
            0 => Op::Unary {
                timeout_ms: input.u16(),
                message: input.short(),
            },
            1 => Op::Stream,
            2 => Op::Send {
                call: input.u8(),
                message: input.short(),
            },
            3 => Op::CloseSend { call: input.u8() },
            4 => Op::Cancel { call: input.u8() },
            5 => Op::Gate {
                call: input.u8(),
                open: input.u8() & 1 == 1,
            },
            6 => Op::Raw(input.long()),
            7 => headers(input),
            8 => {
                let (flags, stream) = (input.u8(), stream_id(input.u8()));
                Op::Frame(0, flags & 1, stream, input.long())
            }
            9 => grpc_data(input),
            10 => Op::Frame(3, 0, stream_id(input.u8()), code(input.u8())),
            11 => {
                let last = stream_id(input.u8());
                let mut payload = last.to_be_bytes().to_vec();
                payload.extend(code(input.u8()));
                payload.extend(input.short());
                Op::Frame(7, 0, 0, payload)
            }
            12 => Op::Frame(4, input.u8() & 1, 0, input.short()),
            13 => Op::Frame(6, input.u8() & 1, 0, input.bytes(8)),
            14 => {
                let stream = stream_id(input.u8());
                let increment = u32::from(input.u16()) << (input.u8() % 16);
                Op::Frame(8, 0, stream, increment.to_be_bytes().to_vec())
            }
            _ if input.u8() & 1 == 1 => Op::Reset,
            _ => Op::Tick { ms: input.u16() },
        }
    }
}

/// 0 is the connection; calls have the odd ids a client opens, in order.
fn stream_id(n: u8) -> u32 {
    match n % 12 {
        0 => 0,
        n => 2 * u32::from(n) - 1,
    }
}

fn code(n: u8) -> Vec<u8> {
    u32::from(n % 16).to_be_bytes().to_vec()
}

/// A HEADERS frame of literal fields (HPACK without indexing or Huffman),
/// maybe with END_STREAM; flag bit 1 splits it with a CONTINUATION.
fn headers(input: &mut Input<'_>) -> Op {
    let (flags, stream, count) = (input.u8(), stream_id(input.u8()), input.u8() % 8);
    let mut block = Vec::new();
    for _ in 0..count {
        let pick = input.u8();
        let name = match NAMES.get(usize::from(pick)) {
            Some(name) => name.to_vec(),
            None => input.short(),
        };
        let value = input.short();
        literal(&mut block, &name, &value);
    }
    let end_stream = flags & 1;
    if flags & 2 == 0 || block.len() < 2 {
        return Op::Frame(1, end_stream | 4, stream, block);
    }
    let tail = block.split_off(block.len() / 2);
    let mut frames = frame(1, end_stream, stream, &block);
    frames.extend(frame(9, 4, stream, &tail));
    Op::Raw(frames)
}

/// DATA made of gRPC messages; flag bit 1 marks them compressed, and the
/// last byte may be cut off (a partial frame).
fn grpc_data(input: &mut Input<'_>) -> Op {
    let (flags, stream, count) = (input.u8(), stream_id(input.u8()), input.u8() % 4);
    let mut payload = Vec::new();
    for _ in 0..count {
        let message = input.short();
        payload.push(u8::from(flags & 2 != 0));
        payload.extend((message.len() as u32).to_be_bytes());
        payload.extend(message);
    }
    if flags & 4 != 0 {
        payload.pop();
    }
    Op::Frame(0, flags & 1, stream, payload)
}

fn literal(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0);
    for text in [name, value] {
        integer(block, text.len());
        block.extend_from_slice(text);
    }
}

/// HPACK's integer with a 7-bit prefix (RFC 7541, 5.1), H bit clear.
/// Written here because the h2 crate keeps its encoder private.
fn integer(block: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        block.push(n as u8);
        return;
    }
    block.push(127);
    n -= 127;
    while n >= 128 {
        block.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    block.push(n as u8);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len().min(0xff_ffff) as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(&payload[..len as usize]);
    out
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Unary,
    Stream { initial: bool, trailing: bool },
    Ended,
    Cancelled,
}

/// What the calls have been told so far, checked event by event.
#[derive(Default)]
struct Calls {
    states: HashMap<Token, State>,
    gates: HashMap<Token, Arc<Gate>>,
    order: Vec<Token>,
}

impl Calls {
    fn pick(&self, n: u8) -> Option<Token> {
        let n = usize::from(n) % self.order.len().max(1);
        self.order.get(n).copied()
    }

    fn check(&mut self, produced: Produced) {
        for (token, events) in produced {
            let state = self.states.get(&token).copied();
            let Some(state) = state else {
                panic!("events for call {token}, which never started");
            };
            let next = match state {
                State::Unary => unary(&events),
                State::Stream { initial, trailing } => stream(initial, trailing, &events),
                State::Ended => panic!("events for call {token} after its end: {events:?}"),
                State::Cancelled => panic!("events for cancelled call {token}: {events:?}"),
            };
            self.states.insert(token, next);
        }
    }

    fn running(&self) -> Vec<Token> {
        let running = |s: &State| matches!(s, State::Unary | State::Stream { .. });
        let mut tokens: Vec<Token> = self
            .states
            .iter()
            .filter(|(_, s)| running(s))
            .map(|(t, _)| *t)
            .collect();
        tokens.sort_unstable();
        tokens
    }
}

/// A unary call hears once: its answer (initial, trailing, message), or
/// its end (maybe after trailing metadata).
fn unary(events: &[GrpcEvent]) -> State {
    match events {
        [GrpcEvent::InitialMetadata(_), GrpcEvent::TrailingMetadata(_), GrpcEvent::Message(_)]
        | [GrpcEvent::TrailingMetadata(_), GrpcEvent::Close(..)] => {}
        [GrpcEvent::Close(..)] => {}
        other => panic!("a unary call's events out of order: {other:?}"),
    }
    if let Some(close @ GrpcEvent::Close(code, _)) = events.last() {
        check_close(close);
        assert_ne!(*code, 0, "a unary call closed OK without its message");
    }
    State::Ended
}

fn stream(mut initial: bool, mut trailing: bool, events: &[GrpcEvent]) -> State {
    for (i, event) in events.iter().enumerate() {
        assert!(
            !trailing || matches!(event, GrpcEvent::Close(..)),
            "an event after trailing metadata: {events:?}"
        );
        match event {
            GrpcEvent::InitialMetadata(_) => {
                assert!(!initial, "initial metadata twice: {events:?}");
                initial = true;
            }
            GrpcEvent::Message(_) => assert!(initial, "a message before initial metadata"),
            GrpcEvent::TrailingMetadata(_) => trailing = true,
            GrpcEvent::Close(..) => {
                check_close(event);
                assert_eq!(i + 1, events.len(), "events after a close: {events:?}");
                return State::Ended;
            }
        }
    }
    State::Stream { initial, trailing }
}

fn check_close(event: &GrpcEvent) {
    if let GrpcEvent::Close(code, message) = event {
        assert!(*code <= 16, "close with code {code}");
        assert!(
            message.iter().all(|b| (0x20..=0x7e).contains(b)),
            "a close message that is no grpc-message text: {message:?}"
        );
    }
}

fn target(service: &str) -> GrpcTarget {
    GrpcTarget {
        upstream: "fuzz".into(),
        service: service.into(),
        method: "Call".into(),
        metadata: vec![("x-call".into(), b"1".to_vec())],
        compression: Default::default(),
    }
}

fn run(data: &[u8]) {
    let Ok(mut wire) = Wire::new("fuzz.test:443", None) else {
        panic!("a connection to a valid authority");
    };
    let mut calls = Calls::default();
    let mut now = Instant::now();
    let mut input = Input(data);
    calls.check(wire.input(&SERVER_PREFACE));
    while !input.0.is_empty() {
        let produced = match Op::read(&mut input) {
            Op::Unary {
                message,
                timeout_ms,
            } => start(&mut calls, State::Unary, |token, _| {
                wire.unary(token, target("fuzz.Unary"), &message, u32::from(timeout_ms))
            }),
            Op::Stream => {
                let initial = State::Stream {
                    initial: false,
                    trailing: false,
                };
                start(&mut calls, initial, |token, gate| {
                    wire.stream(token, target("fuzz.Stream"), gate)
                })
            }
            Op::Send { call, message } => with(&calls, call, |t| wire.send(t, &message, true)),
            Op::CloseSend { call } => with(&calls, call, |t| wire.close_send(t)),
            Op::Cancel { call } => {
                let produced = with(&calls, call, |t| wire.cancel(t));
                if let Some(token) = calls.pick(call) {
                    if calls.states.get(&token) != Some(&State::Ended) {
                        calls.states.insert(token, State::Cancelled);
                    }
                }
                produced
            }
            Op::Gate { call, open } => {
                let gate = calls.pick(call).and_then(|t| calls.gates.get(&t));
                match gate {
                    Some(gate) if open => {
                        gate.open();
                        wire.poll()
                    }
                    Some(gate) => {
                        gate.close();
                        Vec::new()
                    }
                    None => Vec::new(),
                }
            }
            Op::Raw(bytes) => wire.input(&bytes),
            Op::Frame(kind, flags, stream, payload) => {
                wire.input(&frame(kind, flags, stream, &payload))
            }
            Op::Tick { ms } => {
                now += Duration::from_millis(u64::from(ms));
                wire.tick(now).0
            }
            Op::Reset => reset(&mut wire, &mut calls),
        };
        calls.check(produced);
        // The socket's owner takes what h2 wrote; the server here reads none.
        drop(wire.take_output());
    }
    let produced = reset(&mut wire, &mut calls);
    calls.check(produced);
    assert!(
        calls.running().is_empty(),
        "calls left running: {:?}",
        calls.running()
    );
}

/// Starts a call on a fresh token, as the client does: tokens are never
/// reused.
fn start(
    calls: &mut Calls,
    state: State,
    call: impl FnOnce(Token, Arc<Gate>) -> Produced,
) -> Produced {
    if calls.order.len() == MAX_CALLS {
        return Vec::new();
    }
    let token = Token(calls.order.len() as u32 + 1);
    let gate = Arc::new(Gate::default());
    calls.order.push(token);
    calls.states.insert(token, state);
    calls.gates.insert(token, gate.clone());
    call(token, gate)
}

fn with(calls: &Calls, call: u8, f: impl FnOnce(Token) -> Produced) -> Produced {
    calls.pick(call).map(f).unwrap_or_default()
}

/// The socket went: every call still running must end now, UNAVAILABLE.
/// The new connection's server greets it as the first one's did.
fn reset(wire: &mut Wire, calls: &mut Calls) -> Produced {
    let running = calls.running();
    let (mut produced, restarted) = wire.reset("the fuzz server went away");
    assert!(restarted.is_ok(), "a fresh connection after a reset");
    for token in running {
        let ends = produced
            .iter()
            .filter(|(t, events)| {
                *t == token && matches!(events.last(), Some(GrpcEvent::Close(14, _)))
            })
            .count();
        assert_eq!(
            ends, 1,
            "call {token} did not end once at a reset: {produced:?}"
        );
    }
    produced.extend(wire.input(&SERVER_PREFACE));
    produced
}
