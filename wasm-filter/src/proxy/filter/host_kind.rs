//! Which proxy-wasm host runs the filter, learnt once per VM: what it
//! lacks decides how the filter degrades.

use std::cell::Cell;

use super::super::config::FilterConfig;
use super::super::host;

/// What the filter must know about its host, learnt once per VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostKind {
    /// The OpenResty shim: its callers are trusted, and it has a delivery
    /// function for streamed messages.
    Shim,
    /// Kong's ngx_wasm_module: no gRPC calls (they do nothing), no trailers
    /// callback, and a local reply from the response-headers callback keeps
    /// the upstream's headers.
    NgxWasmModule,
    /// Envoy and other proxy-wasm hosts.
    Other,
}

impl HostKind {
    pub(super) fn has_grpc_calls(self) -> bool {
        self != HostKind::NgxWasmModule
    }

    pub(super) fn calls_trailers(self) -> bool {
        self != HostKind::NgxWasmModule
    }

    /// Whether a filter may give a request a body from its request
    /// headers callback (ngx_wasm_module allows `proxy_set_buffer_bytes`
    /// on the request body there; Envoy has no body buffer yet).
    pub(super) fn sets_request_body_at_headers(self) -> bool {
        self == HostKind::NgxWasmModule
    }

    /// Whether `:path` is the path decoded (ngx_wasm_module gives nginx's
    /// `$uri`: `%3A` is already `:`), the client's being the property
    /// `request.path` (`$request_uri`).
    pub(super) fn decodes_path(self) -> bool {
        self == HostKind::NgxWasmModule
    }
}

thread_local! {
    static HOST_KIND: Cell<Option<HostKind>> = const { Cell::new(None) };
}

/// Whether the host is the shim (see `host::is_shim`), remembered.
pub(super) fn host_is_shim() -> bool {
    let shim = host::is_shim();
    if shim {
        HOST_KIND.with(|k| k.set(Some(HostKind::Shim)));
    }
    shim
}

/// The host, from inside a request: ngx_wasm_module answers its `ngx.*`
/// properties (nginx variables) only there, so it cannot be recognised
/// while configuring.
pub(super) fn host_kind() -> HostKind {
    if let Some(kind) = HOST_KIND.with(Cell::get) {
        return kind;
    }
    let kind = if host::property(&["ngx", "hostname"]).is_some() {
        HostKind::NgxWasmModule
    } else {
        HostKind::Other
    };
    HOST_KIND.with(|k| k.set(Some(kind)));
    kind
}

/// `upstream_header` lets the caller pick the upstream: only the shim's
/// callers (Lua code) are trusted with that.
pub(super) fn check_host(config: FilterConfig) -> Result<FilterConfig, String> {
    let picks_upstream = config
        .callout
        .as_ref()
        .is_some_and(|c| c.upstream_header.is_some());
    if picks_upstream && !host_is_shim() {
        return Err("callout.upstream_header: only for the OpenResty shim, whose callers are trusted; in this host any HTTP client could pick the upstream cluster".into());
    }
    Ok(config)
}
