//! The native side of grpc-wasm for OpenResty, in layers that import
//! downward only:
//!
//! - [`call`]: a gRPC call as the module sees it (target, events, header
//!   maps), whichever transport carries it;
//! - [`host`]: a proxy-wasm host (wasmtime) that runs the grpc-wasm module
//!   in callout mode, exactly as Envoy would;
//! - [`transport`]: HTTP/2 with tonic and rustls;
//! - [`client`]: the two joined, with per-call event queues;
//! - [`ffi`]: the C ABI that `resty.ffi.grpc` calls through LuaJIT's FFI,
//!   and [`resty_ffi`]: the lua-resty-ffi runtime contract (`libffi_init`).
//! - [`wasm`]: the WASI subset and a typed client of the core's own exports.

pub mod call;
pub mod limits;
mod sync;
pub mod transport;

#[cfg(feature = "host")]
pub mod client;
#[cfg(feature = "host")]
pub mod ffi;
#[cfg(feature = "host")]
pub mod host;
#[cfg(feature = "host")]
mod notify;
#[cfg(feature = "host")]
pub mod resty_ffi;
#[cfg(feature = "host")]
pub mod wasm;

#[cfg(feature = "host")]
pub use client::{compression_named, CallOptions, Client, ClientError, Event};
#[cfg(feature = "core-module")]
pub use wasm::CoreModule;
#[cfg(feature = "host")]
pub use wasm::HostError;
