//! gRPC server reflection, as a client: what to ask a server for its
//! services and their `.proto` files, and the closed descriptor set its
//! answers make. The protocol without transport, so that every host
//! (the filter over `proxy_grpc_stream`, the shim and the npm package over
//! their own) loads descriptors the same way.

mod loader;
mod messages;

pub use loader::{Loader, Reflected, ReflectionError, Version, METHOD};
