//! The proxy-wasm HTTP filter: JSON/REST ⇄ gRPC transcoding on the proxy's
//! own route.
//!
//! The pure parts ([`config`], [`pairs`], [`transcoder`]) build and test
//! natively; the ABI bindings and the exported callbacks exist only in the
//! wasm32 build. The filter talks to the host through its own bindings to
//! the raw proxy-wasm 0.2.1 ABI rather than the Rust SDK, whose dispatcher
//! panics (a trap, in wasm) on host answers it does not expect.

pub mod callout;
pub mod config;
pub mod contract;
pub mod http_rule;
pub mod id_map;
pub mod pairs;
pub mod transcoder;

#[cfg(target_arch = "wasm32")]
mod callout_host;
#[cfg(target_arch = "wasm32")]
mod fetch;
#[cfg(target_arch = "wasm32")]
mod filter;
#[cfg(target_arch = "wasm32")]
mod host;
