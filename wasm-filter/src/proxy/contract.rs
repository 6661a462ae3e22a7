//! Names that the filter and the hosts embedding it must spell alike. The
//! OpenResty shim imports these instead of repeating them.

/// The shim's foreign function that hands a streamed message to its caller
/// (arguments: the HTTP context id, little-endian u32, then the JSON).
pub const DELIVER_FUNCTION: &str = "grpc_wasm.deliver";

/// A property that only the OpenResty shim answers, with [`SHIM_HOST`]. One
/// segment without a dot: ngx_wasm_module refuses (and logs) dotted
/// property paths outside a request, and this is read while configuring.
pub const HOST_PROPERTY: &str = "grpc_wasm_host";

/// The value of [`HOST_PROPERTY`] in the OpenResty shim.
pub const SHIM_HOST: &[u8] = b"lua-shim";
