//! Running the grpc-wasm module under wasmtime.

mod core_module;
pub(crate) mod instance;
pub mod wasi;

pub use core_module::CoreModule;
pub use instance::HostError;
