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
//!
//! File names say the layer: `*_rules.rs` decide without a host (what a
//! request becomes, what an answer says: testable with plain values);
//! `filter/*_callbacks.rs` are the exported callbacks of one HTTP stream,
//! which apply those rules; `*_host.rs` and `fetch.rs` drive the host's own
//! calls (gRPC calls, HTTP calls) and take their callbacks on the root
//! context.

pub mod callout_rules;
pub mod config;
pub mod envoy_options;
pub mod http_body;
pub mod http_rule;
pub mod id_map;
pub mod transcode_rules;

mod callout_host;
mod fetch;
pub mod filter;
mod held;
pub mod host;
pub mod metrics;
