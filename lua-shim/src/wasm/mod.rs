//! Running the grpc-wasm module under wasmtime.

mod core_module;
pub mod wasi;

pub use core_module::{CoreModule, HostError};
