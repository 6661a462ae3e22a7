//! grpc-wasm's core: everything a gRPC client needs that is not transport.
//!
//! - [`descriptors`]: `.proto` sources compiled at run time, or descriptor sets;
//! - [`json`]: JSON ⇄ protobuf for any message;
//! - [`framing`]: the gRPC length-prefixed message framing, with gzip;
//! - [`status`], [`code`], [`details`]: call outcomes;
//! - [`metadata`], [`timeout`]: custom metadata and `grpc-timeout`;
//! - [`limits`]: the bounds put on everything a peer controls;
//! - [`reflection`]: descriptors asked of a server (gRPC server reflection);
//! - [`http_rule`], [`http_body`]: `google.api.http` bindings and `HttpBody`;
//! - [`openapi`]: an OpenAPI 3.1 document of the bindings; [`describe`]:
//!   what is loaded, as JSON;
//! - [`held`]: what all the calls of one module instance hold together;
//! - [`contract`]: what the proxy-wasm filter and its hosts agree on.
//!
//! The same code builds natively and for `wasm32-wasip1`; hosts reach it in
//! wasm through its own exports, `exports` (only on wasm32).

pub mod code;
pub mod contract;
pub mod describe;
pub mod descriptors;
pub mod details;
mod deterministic;
pub mod error;
pub mod framing;
pub mod held;
pub mod http_body;
pub mod http_rule;
pub mod json;
pub mod limits;
pub mod metadata;
pub mod openapi;
#[cfg(feature = "proxy-module")]
pub mod proxy;
pub mod reflection;
pub mod status;
pub mod timeout;
pub mod web;

#[cfg(all(target_arch = "wasm32", feature = "proxy-module"))]
pub mod exports;

/// The project's version: the workspace's, in every artifact (the
/// module, the shim, the Lua API, the npm package).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `user-agent` of every call the module makes, in gRPC's
/// `grpc-<implementation>/<version>` form.
pub const USER_AGENT: &str = concat!("grpc-wasm/", env!("CARGO_PKG_VERSION"));

pub use code::Code;
pub use descriptors::{Method, Registry, StreamingKind};
pub use deterministic::encode_deterministic;
pub use error::Error;
pub use framing::{Compression, FrameDecoder, FrameError};
pub use json::JsonOptions;
pub use metadata::{Metadata, MetadataValue};
pub use status::Status;
