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

/// What each host does that a filter must work around, by name: the
/// filter asks for a capability, never for a host.
impl HostKind {
    fn is_ngx_wasm_module(self) -> bool {
        self == HostKind::NgxWasmModule
    }

    /// Whether `proxy_grpc_call` does anything (ngx_wasm_module's does not).
    pub(super) fn has_grpc_calls(self) -> bool {
        !self.is_ngx_wasm_module()
    }

    /// Whether a transcoded request without a body (or with an HttpBody
    /// answer) becomes a call of the filter's own, through the loopback
    /// cluster (Envoy: no body can be added to such a request; the shim
    /// makes every call in callout mode; ngx_wasm_module has no calls).
    pub(super) fn calls_for_bodiless_requests(self) -> bool {
        self == HostKind::Other
    }

    /// Whether the host says why it made a response itself, in the property
    /// `response.code_details` (Envoy).
    pub(super) fn names_response_cause(self) -> bool {
        self == HostKind::Other
    }

    /// Whether the filter defines metrics here (see `metrics`).
    pub(super) fn defines_metrics(self) -> bool {
        !self.is_ngx_wasm_module()
    }

    /// Whether the host calls the filter with the response trailers.
    pub(super) fn calls_trailers(self) -> bool {
        !self.is_ngx_wasm_module()
    }

    /// Whether the upstream's trailers, which no callback hands over, are
    /// the host's variables by the end of the body (nginx:
    /// `$upstream_trailer_grpc_status`, read as `ngx.*` properties).
    pub(super) fn keeps_upstream_trailers_in_variables(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether a filter may give a request a body from its request
    /// headers callback (ngx_wasm_module allows `proxy_set_buffer_bytes`
    /// on the request body there; Envoy has no body buffer yet).
    pub(super) fn sets_request_body_at_headers(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether `:path` is the path decoded (ngx_wasm_module gives nginx's
    /// `$uri`: `%3A` is already `:`), the client's being the property
    /// `request.path` (`$request_uri`).
    pub(super) fn decodes_path(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether the upstream gets every copy of a request header, those the
    /// filter removed or replaced included (nginx): a header only the
    /// filter may set must be refused from clients there.
    pub(super) fn forwards_replaced_headers(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether a request body the filter replaces keeps its old
    /// `content-length` unless the filter sets the new one.
    pub(super) fn keeps_old_content_length(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether the host holds a response body once, in buffers of fixed
    /// size: a second chunk before the end means they are full (a second
    /// pause would be ignored, letting gRPC bytes through), so the filter
    /// cannot carry a large message itself either.
    pub(super) fn holds_body_in_fixed_buffers(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether the host says a body follows every request's headers, and
    /// then never calls the body callback when none does: the headers
    /// must tell.
    pub(super) fn announces_absent_bodies(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether a `:path` set without a query string keeps the old one (an
    /// empty query clears it).
    pub(super) fn keeps_query_of_new_path(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether a response chunk replaced by nothing is dropped together
    /// with its end-of-body mark, so that the response never ends.
    pub(super) fn drops_emptied_last_chunk(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether a local reply's details become the HTTP status line's
    /// reason phrase (ngx_wasm_module; Envoy logs them as response code
    /// details).
    pub(super) fn details_are_reason_phrase(self) -> bool {
        self.is_ngx_wasm_module()
    }

    /// Whether the response headers may wait for the body (Envoy: a paused
    /// header block still hands this filter the body; ngx_wasm_module
    /// takes a pause there for a local reply, and sends the headers on).
    pub(super) fn holds_response_headers(self) -> bool {
        !self.is_ngx_wasm_module()
    }

    /// Whether a local reply sent from the response-headers callback keeps
    /// the upstream's headers (and, after nginx's own error pages, sends
    /// nothing), so the filter must rewrite the headers and body instead.
    pub(super) fn replies_keep_response_headers(self) -> bool {
        self.is_ngx_wasm_module()
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

/// Whether the host has gRPC calls, asked while configuring, where
/// [`host_kind`] cannot tell ngx_wasm_module (it answers `ngx.*` only in a
/// request, and asking outside one would remember the wrong host for the
/// VM). Envoy answers `plugin_vm_id` everywhere; ngx_wasm_module does not
/// implement it, nor gRPC calls (its `proxy_grpc_stream` traps). Should a
/// later ngx_wasm_module answer it, the test in that host
/// (`test_reflection_is_refused_at_load_with_one_line`) fails.
pub(super) fn has_grpc_calls_while_configuring() -> bool {
    host::property(&["plugin_vm_id"]).is_some()
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

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::contract::{HOST_PROPERTY, SHIM_HOST};
    use crate::proxy::host::install;
    use crate::proxy::host::mock::MockHost;

    /// The host as the filter learns it, from a mock host with `property`.
    fn learnt(property: Option<(&[u8], &[u8])>) -> HostKind {
        let host = Rc::new(MockHost::default());
        if let Some((key, value)) = property {
            let mut state = host.state.borrow_mut();
            state.properties.insert(key.to_vec(), value.to_vec());
        }
        install(host);
        HOST_KIND.with(|k| k.set(None));
        host_is_shim();
        host_kind()
    }

    /// Every capability, in a fixed order, for a table per host.
    fn capabilities(kind: HostKind) -> [(&'static str, bool); 16] {
        [
            ("has_grpc_calls", kind.has_grpc_calls()),
            ("names_response_cause", kind.names_response_cause()),
            ("defines_metrics", kind.defines_metrics()),
            ("calls_trailers", kind.calls_trailers()),
            (
                "keeps_upstream_trailers_in_variables",
                kind.keeps_upstream_trailers_in_variables(),
            ),
            (
                "sets_request_body_at_headers",
                kind.sets_request_body_at_headers(),
            ),
            ("decodes_path", kind.decodes_path()),
            (
                "forwards_replaced_headers",
                kind.forwards_replaced_headers(),
            ),
            ("keeps_old_content_length", kind.keeps_old_content_length()),
            (
                "holds_body_in_fixed_buffers",
                kind.holds_body_in_fixed_buffers(),
            ),
            ("announces_absent_bodies", kind.announces_absent_bodies()),
            ("keeps_query_of_new_path", kind.keeps_query_of_new_path()),
            ("drops_emptied_last_chunk", kind.drops_emptied_last_chunk()),
            (
                "details_are_reason_phrase",
                kind.details_are_reason_phrase(),
            ),
            (
                "replies_keep_response_headers",
                kind.replies_keep_response_headers(),
            ),
            ("holds_response_headers", kind.holds_response_headers()),
        ]
    }

    #[test]
    fn each_host_is_learnt_from_its_properties_with_its_capabilities() {
        let envoy = learnt(None);
        assert_eq!(envoy, HostKind::Other);
        let ngx = learnt(Some((b"ngx\0hostname", b"test")));
        assert_eq!(ngx, HostKind::NgxWasmModule);
        let shim = learnt(Some((HOST_PROPERTY.as_bytes(), SHIM_HOST)));
        assert_eq!(shim, HostKind::Shim);
        for (name, has) in capabilities(envoy) {
            let expected = matches!(
                name,
                "has_grpc_calls"
                    | "calls_trailers"
                    | "defines_metrics"
                    | "names_response_cause"
                    | "holds_response_headers"
            );
            assert_eq!(has, expected, "Envoy: {name}");
        }
        for (shim, envoy) in capabilities(shim).iter().zip(capabilities(envoy)) {
            // The shim makes no responses of its own.
            if shim.0 != "names_response_cause" {
                assert_eq!(*shim, envoy);
            }
        }
        for (name, has) in capabilities(ngx) {
            let expected = !matches!(
                name,
                "has_grpc_calls"
                    | "calls_trailers"
                    | "defines_metrics"
                    | "names_response_cause"
                    | "holds_response_headers"
            );
            assert_eq!(has, expected, "ngx_wasm_module: {name}");
        }
    }
}
