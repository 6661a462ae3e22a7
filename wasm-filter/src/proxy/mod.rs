//! The proxy-wasm HTTP filter: JSON/REST ⇄ gRPC transcoding on the proxy's
//! own route.
//!
//! Everything builds and tests natively. The exported callbacks
//! ([`filter`]) reach the host only through the [`host::Host`] trait: in
//! the wasm32 build its implementation is the raw proxy-wasm 0.2.1 ABI
//! (the filter's own bindings rather than the Rust SDK, whose dispatcher
//! panics, a trap in wasm, on host answers it does not expect); natively,
//! tests drive the callbacks through [`host::mock::MockHost`] in the orders
//! Envoy and ngx_wasm_module call them. [`crate::contract`] holds what the filter
//! and the hosts must agree on.
//!
//! The rooms: [`transcode`] (a request turned into a gRPC call on the
//! proxy's own route, and the response back into JSON) and [`callout`]
//! (the module's own gRPC call, made through the host) are the two modes,
//! each with its host-free rules; [`messages`], [`reply`], the core's
//! [`crate::http_rule`] and [`crate::http_body`], and [`json_values`] are
//! what both use. [`filter`] holds
//! the exported callbacks of one HTTP stream, which apply those rules;
//! `callout::host`, `fetch` and `reflection` drive the host's own calls
//! (gRPC calls, HTTP calls, the reflection stream) and take their
//! callbacks on the root context.

pub mod callout;
pub mod config;
pub mod envoy_options;
pub mod id_map;
pub mod json_values;
pub mod messages;
pub mod reply;
pub mod transcode;

mod backoff;
mod fetch;
pub mod filter;
mod held;
pub mod host;
pub mod metrics;
mod reflection;
