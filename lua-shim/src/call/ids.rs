//! The ids the shim hands out and is handed, one type each (as h2 has its
//! `StreamId`), so that one kind of id cannot be passed where another is
//! meant. Each is the `u32` the C ABI and the proxy-wasm ABI carry, and
//! converts to and from it only at those edges.

macro_rules! id {
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

id! {
    /// A connection the caller opened (`grpc.connect`); the module's calls
    /// name it as their upstream.
    ConnId
}

id! {
    /// A call the caller started: the id of the module's HTTP context that
    /// runs it.
    CallId
}

id! {
    /// A gRPC call the module opened on a connection (the token of
    /// `proxy_grpc_call` / `proxy_grpc_stream`).
    Token
}
