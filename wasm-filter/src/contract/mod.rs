//! What the filter and the hosts embedding it must agree on: the proxy-wasm
//! 0.2.1 numbers as Rust types, and the names (headers, foreign functions,
//! properties) that are this project's own. It builds for every target, so
//! the wasm32 filter and the OpenResty shim import it alike and no number
//! or name is written twice.
//!
//! The ABI passes each kind as a bare `u32`; converting at the boundary
//! (`as u32` out, `try_from` in) keeps a map kind from being passed where a
//! buffer kind is meant, and an unknown number from being taken for one.
//!
//! Outside the filter's feature gate: the shim reaches it without building
//! the filter or the `.proto` compiler.

pub mod pairs;

/// How many metrics a VM defines at most, which the hosts size their own
/// tables by. Each method has 7 metrics, one per gRPC code it ends with
/// and two failure causes: 4096 covers a hundred methods with every code.
/// Past it, new names are not defined (logged once) and the others go on
/// counting.
pub const MAX_METRICS: usize = 4096;

/// Defines a `#[repr(u32)]` enum of ABI numbers with a checked conversion
/// from the wire's `u32`, which answers `Err(n)` for any other number.
macro_rules! abi_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl TryFrom<u32> for $name {
            type Error = u32;

            fn try_from(value: u32) -> Result<Self, u32> {
                match value {
                    $($value => Ok(Self::$variant),)+
                    other => Err(other),
                }
            }
        }

        impl From<$name> for u32 {
            fn from(value: $name) -> u32 {
                value as u32
            }
        }
    };
}

/// Defines a typed id for a `u32` an ABI passes bare, so that one kind of
/// id cannot be given where another is meant; the shim defines its own
/// ids (connections, calls) with it too.
#[macro_export]
macro_rules! typed_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr(transparent)]
        pub struct $name(pub u32);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

typed_id! {
    /// A context the host created: a root (one per plugin configuration)
    /// or an HTTP stream.
    ContextId
}

typed_id! {
    /// A call the filter made through the host (`proxy_grpc_call`,
    /// `proxy_grpc_stream`, `proxy_http_call`): the host's token for it.
    Token
}

abi_enum! {
    /// What a host call answers (`proxy_status_t`).
    ProxyStatus {
        Ok = 0,
        NotFound = 1,
        BadArgument = 2,
        SerializationFailure = 3,
        ParseFailure = 4,
        InvalidMemoryAccess = 6,
        Empty = 7,
        CasMismatch = 8,
        InternalFailure = 10,
        Unimplemented = 12,
    }
}

abi_enum! {
    /// A header map the host keeps (`proxy_map_type_t`).
    MapType {
        HttpRequestHeaders = 0,
        HttpRequestTrailers = 1,
        HttpResponseHeaders = 2,
        HttpResponseTrailers = 3,
        GrpcReceiveInitialMetadata = 4,
        GrpcReceiveTrailingMetadata = 5,
        HttpCallResponseHeaders = 6,
        HttpCallResponseTrailers = 7,
    }
}

abi_enum! {
    /// A byte buffer the host keeps (`proxy_buffer_type_t`).
    BufferType {
        HttpRequestBody = 0,
        HttpResponseBody = 1,
        DownstreamData = 2,
        UpstreamData = 3,
        HttpCallResponseBody = 4,
        GrpcReceiveBuffer = 5,
        VmConfiguration = 6,
        PluginConfiguration = 7,
    }
}

abi_enum! {
    /// What an HTTP callback answers the host (`proxy_action_t`).
    Action {
        Continue = 0,
        Pause = 1,
    }
}

abi_enum! {
    /// `proxy_log`'s levels (`proxy_log_level_t`).
    LogLevel {
        Trace = 0,
        Debug = 1,
        Info = 2,
        Warn = 3,
        Error = 4,
        Critical = 5,
    }
}

abi_enum! {
    /// A metric's kind (`proxy_metric_type_t`).
    MetricType {
        Counter = 0,
        Gauge = 1,
        Histogram = 2,
    }
}

/// The shim's foreign function that hands a streamed message to its caller
/// (arguments: the HTTP context id, little-endian u32, then the JSON).
pub const DELIVER_FUNCTION: &str = "grpc_wasm.deliver";

/// A property that only the OpenResty shim answers, with [`SHIM_HOST`]. One
/// segment without a dot: ngx_wasm_module refuses (and logs) dotted
/// property paths outside a request, and this is read while configuring.
pub const HOST_PROPERTY: &str = "grpc_wasm_host";

/// The value of [`HOST_PROPERTY`] in the OpenResty shim.
pub const SHIM_HOST: &[u8] = b"lua-shim";

/// The request header with a callout request's JSON options (see
/// `proxy::messages::json_options_from`), honoured with `callout.upstream_header`.
pub const JSON_OPTIONS_HEADER: &str = "x-grpc-wasm-json-options";

/// Callout request headers with this prefix become call metadata
/// (grpc-gateway's convention, so clients of either carry metadata the same
/// way).
pub const METADATA_PREFIX: &str = "grpc-metadata-";

/// The request's own path, where the filter sent the gRPC path instead:
/// set only by the filter (a client's copy is dropped or refused).
pub const ORIGINAL_PATH_HEADER: &str = "x-grpc-wasm-original-path";

/// A callout's answer carries the call's trailing metadata as response
/// headers with this prefix (its initial metadata has [`METADATA_PREFIX`]).
pub const TRAILER_PREFIX: &str = "grpc-trailer-";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_numbers_convert_both_ways_and_refuse_the_rest() {
        assert_eq!(
            MapType::try_from(4),
            Ok(MapType::GrpcReceiveInitialMetadata)
        );
        assert_eq!(u32::from(BufferType::PluginConfiguration), 7);
        assert_eq!(ProxyStatus::try_from(12), Ok(ProxyStatus::Unimplemented));
        // 5 and 9 and 11 are holes in the spec's status numbers.
        assert_eq!(ProxyStatus::try_from(5), Err(5));
        assert_eq!(MapType::try_from(8), Err(8));
        assert_eq!(BufferType::try_from(u32::MAX), Err(u32::MAX));
        assert_eq!(LogLevel::try_from(3), Ok(LogLevel::Warn));
    }
}
