//! The native side of grpc-wasm for OpenResty.
//!
//! - [`host`]: a proxy-wasm host (wasmtime) that runs the grpc-wasm module
//!   in callout mode, exactly as Envoy would;
//! - [`transport`]: HTTP/2 with tonic and rustls;
//! - [`client`]: the two joined, with per-call event queues;
//! - [`ffi`]: the C ABI that `resty.ffi.grpc` calls through LuaJIT's FFI,
//!   and [`resty_ffi`]: the lua-resty-ffi runtime contract (`libffi_init`).
//! - [`wasm`]: the WASI subset and a typed client of the core's own exports.

pub mod client;
pub mod ffi;
pub mod host;
mod notify;
pub mod resty_ffi;
pub mod transport;
pub mod wasm;

pub use client::{CallOptions, Client, ClientError, Event};
pub use wasm::{CoreModule, HostError};
