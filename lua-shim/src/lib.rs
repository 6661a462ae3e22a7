//! The OpenResty host for the grpc-wasm core. Its wasmtime host, transport and
//! Lua API arrive with their own issue; the crate exists now so that the
//! workspace has its final shape.
