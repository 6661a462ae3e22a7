//! The proxy-wasm HTTP filter: JSON/REST ⇄ gRPC transcoding on the proxy's
//! own route.
//!
//! Everything builds and tests natively. The exported callbacks
//! ([`filter`]) reach the host only through the [`host::Host`] trait: in
//! the wasm32 build its implementation is the raw proxy-wasm 0.2.1 ABI
//! (the filter's own bindings rather than the Rust SDK, whose dispatcher
//! panics, a trap in wasm, on host answers it does not expect); natively,
//! tests drive the callbacks through [`host::mock::MockHost`] in the orders
//! Envoy and ngx_wasm_module call them. [`contract`] holds what the filter
//! and the hosts must agree on.

pub mod callout;
pub mod config;
pub mod contract;
pub mod envoy_options;
pub mod http_body;
pub mod http_rule;
pub mod id_map;
pub mod pairs;
pub mod transcoder;

mod callout_host;
mod fetch;
pub mod filter;
mod held;
pub mod host;
