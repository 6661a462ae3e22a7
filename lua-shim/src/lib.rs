//! The native side of grpc-wasm for OpenResty.
//!
//! For now it holds the wasmtime host of the core module: the WASI subset a
//! proxy gives its modules ([`wasm::wasi`]) and a typed client of the core's
//! own exports ([`wasm::CoreModule`]). The Lua API and the HTTP/2 transport
//! come with their own issue.

pub mod wasm;

pub use wasm::{CoreModule, HostError};
