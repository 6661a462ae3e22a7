//! Running the grpc-wasm module under wasmtime.

#[cfg(feature = "core-module")]
mod core_module;
pub(crate) mod instance;
pub mod wasi;

#[cfg(feature = "core-module")]
pub use core_module::CoreModule;
pub use instance::HostError;
