//! A gRPC call as the module sees it, whichever transport carries it: what
//! the module asks for ([`GrpcTarget`]), what comes back ([`GrpcEvent`], in
//! Envoy's order, made by [`events`]), and the header maps both carry
//! ([`HeaderBlock`]). This layer depends on the core only; the transports
//! and the wasmtime host both build on it.

pub mod events;
pub mod header_block;
pub mod ids;

pub use grpc_wasm::framing::Compression;
pub use header_block::HeaderBlock;
pub use ids::{CallId, ConnId, Token};

/// A header map in arrival order; keys may repeat.
pub type Pairs = Vec<(String, Vec<u8>)>;

/// Where a call goes: the connection's name, the method, and the
/// metadata the module sends with it; and how its caller wants the request
/// messages compressed (a transport's concern, as in Envoy's gRPC client:
/// the module hands over messages, the transport frames them).
#[derive(Debug, Clone, Default)]
pub struct GrpcTarget {
    pub upstream: String,
    pub service: String,
    pub method: String,
    pub metadata: Pairs,
    pub compression: Compression,
}

/// A transport event for a call, delivered to the module as Envoy would.
#[derive(Debug)]
pub enum GrpcEvent {
    InitialMetadata(HeaderBlock),
    Message(Vec<u8>),
    TrailingMetadata(HeaderBlock),
    /// The call ended: status code and the raw (percent-encoded) message.
    Close(u32, Vec<u8>),
}

/// What a connection's calls produced at once: each call's token and its
/// events, in order.
pub type Produced = Vec<(Token, Vec<GrpcEvent>)>;
