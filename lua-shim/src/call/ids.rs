//! The ids the shim hands out and is handed, one type each (as h2 has its
//! `StreamId`), so that one kind of id cannot be passed where another is
//! meant. Each is the `u32` the C ABI and the proxy-wasm ABI carry, and
//! converts to and from it only at those edges.

grpc_wasm::typed_id! {
    /// A connection the caller opened (`grpc.connect`); the module's calls
    /// name it as their upstream.
    ConnId
}

grpc_wasm::typed_id! {
    /// A call the caller started: the id of the module's HTTP context that
    /// runs it.
    CallId
}

/// A gRPC call the module opened on a connection: the core's type for
/// the token of `proxy_grpc_call` / `proxy_grpc_stream`.
pub use grpc_wasm::contract::Token;
