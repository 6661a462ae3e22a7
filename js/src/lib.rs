//! The core's wasm-bindgen host: what the npm package `grpc-wasm` calls.
//!
//! - [`Schema`]: `.proto` files (with the `compiler` feature) or descriptor
//!   sets; descriptions of services, methods and messages; JSON ⇄ protobuf.
//! - [`Call`]: one call's request headers and messages, and its response
//!   read into messages and a final status, for gRPC, gRPC-Web and Connect.
//!
//! Everything that is a rule of protobuf or of a protocol is the core's
//! (`grpc_wasm::web`, `grpc_wasm::json`, ...); this crate converts values at
//! the boundary. Structured results cross it as JSON text, which the
//! JavaScript side parses once, rather than as many small JS objects built
//! from Rust: fewer boundary crossings, and no serde-wasm-bindgen.

mod call;
mod held;
mod outcome;
mod reflection;
mod schema;

pub use call::Call;
pub use reflection::Reflection;
pub use schema::Schema;

use wasm_bindgen::prelude::*;

/// The canonical names of the gRPC codes, indexed by code.
#[wasm_bindgen(js_name = codeNames)]
pub fn code_names() -> Vec<String> {
    (0..=16)
        .map(|i| grpc_wasm::Code::from_i32(i).name().to_string())
        .collect()
}

/// The JSON options as the core's bit set (`JsonOptions::bits`).
#[wasm_bindgen(js_name = jsonOptions)]
pub fn json_options(
    emit_defaults: bool,
    enums_as_numbers: bool,
    proto_field_names: bool,
    ignore_unknown_fields: bool,
) -> u32 {
    grpc_wasm::JsonOptions {
        emit_defaults,
        enums_as_numbers,
        proto_field_names,
        ignore_unknown_fields,
        int64_as_number: false,
    }
    .bits()
}
