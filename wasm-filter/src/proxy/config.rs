//! The plugin configuration: a JSON document given to the filter by the
//! proxy (Envoy: `configuration` as a `google.protobuf.StringValue`).
//!
//! ```json
//! {
//!   "protos": {"helloworld.proto": "syntax = \"proto3\"; ..."},
//!   "descriptor_set": "<base64 FileDescriptorSet>",
//!   "services": ["helloworld.Greeter"],
//!   "print_options": {"emit_defaults": false, "int64_as_number": false,
//!                     "enums_as_numbers": false, "proto_field_names": false},
//!   "ignore_unknown_fields": false,
//!   "reject_unknown_methods": true,
//!   "query_param_unescape_plus": false,
//!   "max_request_bytes": 4194304,
//!   "max_response_bytes": 4194304,
//!   "max_held_response_bytes": 134217728,
//!   "stream_format": "ndjson",
//!   "callout": {"upstream": "greeter_cluster", "timeout_ms": 10000,
//!               "metadata": {"x-origin": "proxy"}}
//! }
//! ```
//!
//! `"fetch": {"upstream", "path", "authority", "timeout_ms"}` takes the rest
//! of the configuration from an HTTP server (the host's HTTP call): for
//! hosts whose configuration string is short (nginx caps a directive's
//! parameter at 4 KB). The fetched document is a JSON object of the same
//! keys; a key may be given inline or fetched, not both.
//!
//! `"reflection": {"upstream": "<cluster>" | "grpc_service": "<base64>",
//! "services": [...], "refresh_s": 300, "timeout_ms": 5000}` asks the
//! upstream for its descriptors (gRPC server reflection, `v1` then
//! `v1alpha`), alone or beside `protos` and `descriptor_set` (a file given
//! inline wins over the server's file of the same name); the root context
//! loads them and loads them again every `refresh_s` (0: never).
//!
//! With `callout`, the filter answers transcoded requests itself by calling
//! the method through the host (`proxy_grpc_call` / `proxy_grpc_stream`);
//! the request never goes to the route's upstream.
//!
//! `"loopback_cluster"` names the cluster of an Envoy internal listener whose
//! filter chain and routes are this listener's: where a transcoded request
//! cannot go on as itself (no body to carry its message, an `HttpBody`
//! answer), the filter's own call goes back through that chain, so the
//! filters after this one and the route see it as a gRPC request.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Deserialize;

use crate::descriptors::Method;
pub use crate::http_rule::StreamFormat;
use crate::http_rule::{collect_bindings, declares_bindings, Binding, UrlUnescape};
use crate::json::JsonOptions;
use crate::{Metadata, MetadataValue, Registry};

use crate::limits::{DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_TIMEOUT_MS, DEFAULT_TIMEOUT_MS};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    protos: BTreeMap<String, String>,
    #[serde(default)]
    descriptor_set: Option<String>,
    #[serde(default)]
    services: Option<Vec<String>>,
    #[serde(default)]
    print_options: crate::json::PrintOptions,
    #[serde(default)]
    ignore_unknown_fields: bool,
    #[serde(default = "yes")]
    reject_unknown_methods: bool,
    #[serde(default)]
    query_param_unescape_plus: bool,
    #[serde(default)]
    url_unescape_spec: UrlUnescape,
    #[serde(default = "default_max_body")]
    max_request_bytes: usize,
    #[serde(default = "default_max_body")]
    max_response_bytes: usize,
    #[serde(default)]
    max_held_response_bytes: Option<usize>,
    #[serde(default)]
    callout: Option<RawCallout>,
    #[serde(default)]
    loopback_cluster: Option<String>,
    #[serde(default)]
    stream_format: StreamFormat,
    #[serde(default)]
    openapi: Option<RawOpenApi>,
}

/// `"openapi"`: where the filter serves the OpenAPI document of what it
/// transcodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOpenApi {
    path: String,
    #[serde(default = "default_openapi_title")]
    title: String,
}

fn default_openapi_title() -> String {
    "grpc-wasm".into()
}

/// The OpenAPI document the filter serves, built with its configuration.
#[derive(Debug)]
pub struct OpenApi {
    /// The request path (query aside) that `GET` answers with it.
    pub path: String,
    pub document: String,
}

/// Where the rest of the configuration is fetched from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fetch {
    /// The host's name for the server: an Envoy cluster, or `host:port`
    /// for ngx_wasm_module.
    pub upstream: String,
    pub path: String,
    #[serde(default = "default_authority")]
    pub authority: String,
    #[serde(default = "default_fetch_timeout_ms")]
    pub timeout_ms: u32,
    /// The document's SHA-256 (hex): a document that does not match is
    /// refused, as whoever can change it can change every limit.
    #[serde(default)]
    pub sha256: Option<String>,
}

fn default_authority() -> String {
    "localhost".into()
}

fn default_fetch_timeout_ms() -> u32 {
    5_000
}

/// Where the descriptors are asked for (gRPC server reflection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reflection {
    /// A cluster name or a serialized `GrpcService`, as a callout's.
    pub upstream: Vec<u8>,
    /// The services to load; `None` loads every service the server lists.
    pub services: Option<Vec<String>>,
    /// Seconds between loads once one succeeded; 0 loads once.
    pub refresh_s: u64,
    /// The most one load may take, every request of it included.
    pub timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReflection {
    #[serde(default)]
    upstream: Option<String>,
    #[serde(default)]
    grpc_service: Option<String>,
    #[serde(default)]
    services: Option<Vec<String>>,
    #[serde(default = "default_refresh_s")]
    refresh_s: u64,
    #[serde(default = "default_reflection_timeout_ms")]
    timeout_ms: u64,
}

fn default_refresh_s() -> u64 {
    300
}

fn default_reflection_timeout_ms() -> u64 {
    5_000
}

fn check_reflection(raw: RawReflection) -> Result<Reflection, String> {
    let upstream = grpc_upstream("reflection", raw.upstream, raw.grpc_service)?
        .ok_or_else(|| no_grpc_upstream("reflection"))?;
    if raw.timeout_ms == 0 {
        return Err("reflection.timeout_ms: must be at least 1".into());
    }
    if raw.services.as_ref().is_some_and(Vec::is_empty) {
        return Err(
            "reflection.services: name at least one service, or leave it out to load every service"
                .into(),
        );
    }
    Ok(Reflection {
        upstream,
        services: raw.services,
        refresh_s: raw.refresh_s,
        timeout_ms: raw.timeout_ms,
    })
}

/// A configuration as the host gave it: complete, or to be completed by a
/// fetch or by the upstream's reflection service.
#[derive(Debug)]
pub enum Loaded {
    Ready(Box<FilterConfig>),
    Fetch(Fetch),
    Reflect(Reflection),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCallout {
    #[serde(default)]
    upstream: Option<String>,
    /// A serialized `envoy.config.core.v3.GrpcService`, base64.
    #[serde(default)]
    grpc_service: Option<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    upstream_header: Option<String>,
    #[serde(default = "default_max_timeout_ms")]
    max_timeout_ms: u64,
    #[serde(default)]
    forward_metadata: Option<Vec<String>>,
    #[serde(default)]
    propagate: Option<Vec<String>>,
}

/// The request headers a call carries on as metadata by default: W3C trace
/// context, which Envoy does not put on the calls a filter makes.
pub const DEFAULT_PROPAGATE: [&str; 2] = ["traceparent", "tracestate"];

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

fn default_max_timeout_ms() -> u64 {
    DEFAULT_MAX_TIMEOUT_MS
}

/// How the filter calls the method itself instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    /// The `upstream` argument of `proxy_grpc_call`: a cluster name or a
    /// serialized `GrpcService`.
    pub upstream: Vec<u8>,
    /// The deadline when the request carries no `grpc-timeout`.
    pub timeout_ms: u64,
    /// Metadata added to every call.
    pub metadata: Vec<(String, String)>,
    /// A request header that names the upstream instead. Only for embedders
    /// whose clients are trusted (the OpenResty shim): an HTTP client must
    /// not pick clusters.
    pub upstream_header: Option<String>,
    /// The cap on a request's `grpc-timeout`; longer ones are cut to it.
    pub max_timeout_ms: u64,
    /// The `grpc-metadata-<key>` keys a client may send (lower case); `None`
    /// forwards every key the metadata rules allow.
    pub forward_metadata: Option<Vec<String>>,
    /// Request headers (lower case) that the call carries on as metadata
    /// under their own names: trace context (`traceparent`, `b3`,
    /// `x-request-id`).
    pub propagate: Vec<String>,
    /// Whether the request's own headers become the call's metadata, as
    /// they would reach the upstream if the request went on (the calls of
    /// bodiless requests in transcoding mode; see [`Callout::to_loopback`]).
    pub forward_request_headers: bool,
}

impl Callout {
    /// The call a transcoded request makes when it cannot go on as itself
    /// (Envoy lets no filter add a body to a request that has none): to
    /// the loopback cluster, under the request's own authority so that the
    /// chain behind it picks the same virtual host; the defaults of a
    /// configured callout.
    /// `original_path` goes as `x-grpc-wasm-original-path`, as it goes on
    /// a request that carries a body.
    pub fn to_loopback(cluster: &str, authority: &[u8], original_path: &str) -> Callout {
        let original = (
            crate::contract::ORIGINAL_PATH_HEADER.to_string(),
            original_path.to_string(),
        );
        Callout {
            upstream: super::callout::envoy_grpc_service(cluster, authority),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            metadata: vec![original],
            upstream_header: None,
            max_timeout_ms: DEFAULT_MAX_TIMEOUT_MS,
            forward_metadata: None,
            propagate: Vec::new(),
            forward_request_headers: true,
        }
    }
}

fn yes() -> bool {
    true
}

fn default_max_body() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}

/// A checked configuration, ready for requests.
#[derive(Debug)]
pub struct FilterConfig {
    pub registry: Registry,
    /// `/pkg.Service/Method` to its method: one hash per request instead
    /// of a service lookup, a method scan and a formatted path.
    pub methods: FxHashMap<Box<str>, Method>,
    pub json: JsonOptions,
    /// Exposed services; `None` exposes all.
    pub services: Option<Vec<String>>,
    pub reject_unknown_methods: bool,
    /// A `+` in a query string is a space (HTML forms), not a literal
    /// `+` (RFC 3986, Envoy's default); Envoy's option of the same name.
    pub query_param_unescape_plus: bool,
    /// Which escapes a path variable of several segments keeps; Envoy's
    /// option of the same name.
    pub url_unescape_spec: UrlUnescape,
    pub max_request_bytes: usize,
    pub max_response_bytes: usize,
    /// What the module may hold of responses for all the streams of its VM
    /// together (see `proxy::held`).
    pub max_held_response_bytes: usize,
    /// The `google.api.http` bindings of the exposed methods.
    pub bindings: Vec<Binding>,
    /// The paths (`/pkg.Service/Method`) of the methods that declare
    /// bindings (usable or not): Envoy's `auto_mapping` binds the others to
    /// `POST` at their path.
    pub bound_paths: FxHashSet<Box<str>>,
    /// Bindings left out, each with why (logged when the configuration is
    /// installed; the rest are served).
    pub left_out: Vec<String>,
    pub callout: Option<Callout>,
    /// The cluster the filter's own calls in transcoding mode go to (see the
    /// module's documentation); `None` refuses the requests that need one.
    pub loopback_cluster: Option<String>,
    pub stream_format: StreamFormat,
    pub openapi: Option<OpenApi>,
}

/// A replaced configuration's schema leaves with it: the printer's kept
/// layouts would otherwise hold its pool (`json::forget_layouts`).
impl Drop for FilterConfig {
    fn drop(&mut self) {
        crate::json::forget_layouts(self.registry.pool());
    }
}

impl FilterConfig {
    /// Parses and checks a complete configuration. The error is one line
    /// that names the problem: the JSON position, the `.proto` file and
    /// line, or the unknown service.
    pub fn from_json(bytes: &[u8]) -> Result<FilterConfig, String> {
        match FilterConfig::load(bytes)? {
            Loaded::Ready(config) => Ok(*config),
            Loaded::Fetch(_) => Err(
                "fetch: only a proxy-wasm host with HTTP calls can fetch a configuration".into(),
            ),
            Loaded::Reflect(_) => Err(
                "reflection: only a proxy-wasm host with gRPC calls can ask a server for its descriptors".into(),
            ),
        }
    }

    /// The host's configuration: complete, or naming what to fetch.
    pub fn load(bytes: &[u8]) -> Result<Loaded, String> {
        let mut doc = object(bytes).map_err(|e| format!("invalid plugin configuration: {e}"))?;
        if let Some(reflection) = doc.remove("reflection") {
            if doc.contains_key("fetch") {
                return Err("reflection: give it or \"fetch\", not both".into());
            }
            let raw: RawReflection =
                serde_json::from_value(reflection).map_err(|e| format!("reflection: {e}"))?;
            let reflection = check_reflection(raw)?;
            // What is given inline must stand on its own: checked now, so that
            // a mistake in it is not reported only after every load.
            FilterConfig::from_object(doc, Some(&[]))?;
            return Ok(Loaded::Reflect(reflection));
        }
        match doc.remove("fetch") {
            None => FilterConfig::from_object(doc, None).map(|c| Loaded::Ready(Box::new(c))),
            Some(fetch) => {
                let fetch: Fetch =
                    serde_json::from_value(fetch).map_err(|e| format!("fetch: {e}"))?;
                if !fetch.path.starts_with('/')
                    || fetch.upstream.is_empty()
                    || fetch.timeout_ms == 0
                {
                    return Err("fetch: give \"upstream\", a \"path\" starting with '/', and a timeout_ms of at least 1".into());
                }
                if fetch
                    .sha256
                    .as_deref()
                    .is_some_and(|h| h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    return Err(
                        "fetch: sha256: give the document's SHA-256 as 64 hex digits".into(),
                    );
                }
                Ok(Loaded::Fetch(fetch))
            }
        }
    }

    /// The inline configuration completed by the fetched document.
    pub fn with_fetched(inline: &[u8], fetched: &[u8]) -> Result<FilterConfig, String> {
        let mut doc = object(inline).map_err(|e| format!("invalid plugin configuration: {e}"))?;
        doc.remove("fetch");
        let more = object(fetched).map_err(|e| format!("fetched configuration: {e}"))?;
        for (key, value) in more {
            if doc.contains_key(&key) {
                return Err(format!(
                    "fetched configuration: \"{key}\" is given inline too"
                ));
            }
            doc.insert(key, value);
        }
        FilterConfig::from_object(doc, None)
    }

    /// The inline configuration with the files a reflection load gave
    /// (an encoded `FileDescriptorSet`).
    pub fn with_reflected(inline: &[u8], reflected: &[u8]) -> Result<FilterConfig, String> {
        let mut doc = object(inline).map_err(|e| format!("invalid plugin configuration: {e}"))?;
        doc.remove("reflection");
        FilterConfig::from_object(doc, Some(reflected))
    }

    /// `reflected`: the files a reflection load gave, after the inline
    /// ones (a file of a name already loaded is skipped).
    fn from_object(
        mut doc: serde_json::Map<String, serde_json::Value>,
        reflected: Option<&[u8]>,
    ) -> Result<FilterConfig, String> {
        super::envoy_options::translate(&mut doc)?;
        let raw: RawConfig = serde_json::from_value(serde_json::Value::Object(doc))
            .map_err(|e| format!("invalid plugin configuration: {e}"))?;
        let mut registry = Registry::new().map_err(|e| e.to_string())?;
        if let Some(set) = &raw.descriptor_set {
            let bytes = STANDARD
                .decode(set.trim())
                .map_err(|e| format!("descriptor_set: not valid base64: {e}"))?;
            registry
                .add_descriptor_set(&bytes)
                .map_err(|e| format!("descriptor_set: {e}"))?;
        }
        if !raw.protos.is_empty() {
            add_protos(&mut registry, &raw.protos)?;
        }
        if let Some(set) = reflected {
            registry
                .add_descriptor_set(set)
                .map_err(|e| format!("reflection: the server's files: {e}"))?;
        }
        if raw.protos.is_empty() && raw.descriptor_set.is_none() && reflected.is_none() {
            return Err(
                "invalid plugin configuration: give \"protos\", \"descriptor_set\" or \"reflection\"".into(),
            );
        }
        // Before a load, the server's services are not known yet.
        let loaded = reflected.is_none_or(|set| !set.is_empty());
        for service in raw.services.iter().flatten().filter(|_| loaded) {
            if registry.pool().get_service_by_name(service).is_none() {
                return Err(format!("services: unknown service '{service}'"));
            }
        }
        check_body_limit("max_request_bytes", raw.max_request_bytes)?;
        check_body_limit("max_response_bytes", raw.max_response_bytes)?;
        // Unset, the budget holds two responses of the largest size at
        // least: a streamed one holds a whole frame and the next chunk.
        let max_held_response_bytes = raw.max_held_response_bytes.unwrap_or(
            crate::limits::DEFAULT_HELD_BYTES.max(raw.max_response_bytes.saturating_mul(2)),
        );
        check_held_limit(max_held_response_bytes, raw.max_response_bytes)?;
        let (bindings, left_out) = collect_bindings(&registry, raw.services.as_deref())?;
        let callout = raw.callout.map(check_callout).transpose()?;
        let loopback_cluster = check_loopback(raw.loopback_cluster, callout.is_some())?;
        let p = raw.print_options;
        let bound_paths = registry
            .methods_by_path()
            .into_iter()
            .filter(|(_, method)| declares_bindings(method))
            .map(|(path, _)| path)
            .collect();
        let json = p.json_options(raw.ignore_unknown_fields);
        let openapi = raw
            .openapi
            .map(|o| {
                build_openapi(
                    o,
                    &registry,
                    raw.services.as_deref(),
                    &json,
                    raw.stream_format,
                )
            })
            .transpose()?;
        Ok(FilterConfig {
            methods: registry.methods_by_path(),
            registry,
            json,
            services: raw.services,
            reject_unknown_methods: raw.reject_unknown_methods,
            query_param_unescape_plus: raw.query_param_unescape_plus,
            url_unescape_spec: raw.url_unescape_spec,
            max_request_bytes: raw.max_request_bytes,
            max_response_bytes: raw.max_response_bytes,
            max_held_response_bytes,
            bound_paths,
            bindings,
            left_out,
            callout,
            loopback_cluster,
            stream_format: raw.stream_format,
            openapi,
        })
    }

    pub fn exposes(&self, service: &str) -> bool {
        self.services
            .as_ref()
            .is_none_or(|list| list.iter().any(|s| s == service))
    }
}

/// The document of the exposed methods and their bindings.
fn build_openapi(
    raw: RawOpenApi,
    registry: &Registry,
    services: Option<&[String]>,
    json: &JsonOptions,
    stream_format: StreamFormat,
) -> Result<OpenApi, String> {
    if !raw.path.starts_with('/') || raw.path.contains(['?', '#']) {
        return Err(format!(
            "openapi.path must be a path such as /openapi.json, not '{}'",
            raw.path.escape_default()
        ));
    }
    let options = crate::openapi::Options {
        json,
        stream_format,
        title: &raw.title,
    };
    let document = crate::openapi::document_of(registry, services, &options)
        .map_err(|e| format!("openapi: {e}"))?;
    Ok(OpenApi {
        path: raw.path,
        // The core writes JSON text: UTF-8 always.
        document: String::from_utf8_lossy(&document).into_owned(),
    })
}

fn object(bytes: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_slice(bytes) {
        Ok(serde_json::Value::Object(doc)) => Ok(doc),
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn check_body_limit(name: &str, limit: usize) -> Result<(), String> {
    if limit > crate::limits::MAX_BODY_LIMIT {
        return Err(format!(
            "{name}: {limit} is above the largest limit, {} bytes",
            crate::limits::MAX_BODY_LIMIT
        ));
    }
    Ok(())
}

/// The VM's budget must hold one whole response, and stay within what a
/// wasm32 module can spare.
fn check_held_limit(held: usize, response: usize) -> Result<(), String> {
    if held > crate::limits::MAX_HELD_LIMIT {
        return Err(format!(
            "max_held_response_bytes: {held} is above the largest limit, {} bytes",
            crate::limits::MAX_HELD_LIMIT
        ));
    }
    if held < response {
        return Err(format!(
            "max_held_response_bytes: {held} is below max_response_bytes ({response}): no response of that size could be held"
        ));
    }
    Ok(())
}

/// Callout mode makes every call to `callout.upstream`, so a loopback
/// cluster beside it would be ignored: refused, naming the way that works.
fn check_loopback(cluster: Option<String>, callout: bool) -> Result<Option<String>, String> {
    match cluster {
        Some(name) if name.is_empty() => {
            Err("loopback_cluster: give the name of a cluster".into())
        }
        Some(_) if callout => Err(
            "loopback_cluster: callout mode calls callout.upstream for every request; name the loopback cluster there instead"
                .into(),
        ),
        cluster => Ok(cluster),
    }
}

/// The `upstream` argument of the host's gRPC calls from `<key>.upstream`
/// (a cluster name) or `<key>.grpc_service` (a serialized `GrpcService`,
/// base64); `None` when neither is given.
fn grpc_upstream(
    key: &str,
    upstream: Option<String>,
    grpc_service: Option<String>,
) -> Result<Option<Vec<u8>>, String> {
    match (upstream, grpc_service) {
        (Some(name), None) if !name.is_empty() => Ok(Some(name.into_bytes())),
        (None, Some(service)) => STANDARD
            .decode(service.trim())
            .map(Some)
            .map_err(|e| format!("{key}.grpc_service: not valid base64: {e}")),
        (None, None) => Ok(None),
        _ => Err(no_grpc_upstream(key)),
    }
}

fn no_grpc_upstream(key: &str) -> String {
    format!("{key}: give exactly one of \"upstream\" (a cluster name) or \"grpc_service\"")
}

fn check_callout(raw: RawCallout) -> Result<Callout, String> {
    let upstream = match grpc_upstream("callout", raw.upstream, raw.grpc_service)? {
        Some(upstream) => upstream,
        None if raw.upstream_header.is_some() => Vec::new(),
        None => return Err(no_grpc_upstream("callout")),
    };
    if raw.timeout_ms == 0 {
        // Envoy fails a call with timeout 0 at once.
        return Err("callout.timeout_ms: must be at least 1".into());
    }
    if raw.max_timeout_ms < raw.timeout_ms {
        return Err(format!(
            "callout.max_timeout_ms: must be at least timeout_ms ({})",
            raw.timeout_ms
        ));
    }
    let mut checked = Metadata::new();
    for (key, value) in &raw.metadata {
        checked
            .append(key, MetadataValue::Ascii(value.clone()))
            .map_err(|e| format!("callout.metadata: {e}"))?;
    }
    let propagate = raw
        .propagate
        .unwrap_or_else(|| DEFAULT_PROPAGATE.map(String::from).to_vec())
        .iter()
        .map(|name| crate::metadata::check_propagated(name))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("callout.propagate: {e}"))?;
    Ok(Callout {
        upstream,
        timeout_ms: raw.timeout_ms,
        metadata: checked.to_headers(),
        upstream_header: raw.upstream_header.map(|h| h.to_ascii_lowercase()),
        max_timeout_ms: raw.max_timeout_ms,
        forward_metadata: raw
            .forward_metadata
            .map(|keys| keys.iter().map(|k| k.to_ascii_lowercase()).collect()),
        propagate,
        forward_request_headers: false,
    })
}

/// Compiles the configuration's `.proto` sources into `registry`.
#[cfg(feature = "compiler")]
fn add_protos(registry: &mut Registry, protos: &BTreeMap<String, String>) -> Result<(), String> {
    registry
        .add_sources(protos.iter().map(|(n, s)| (n.as_str(), s.as_str())))
        .map_err(|e| format!("protos: {e}"))
}

/// A module built without the `.proto` compiler (grpc_wasm_lite.wasm)
/// takes descriptor sets (given, or from reflection) only, and says so
/// rather than ignoring `protos`.
#[cfg(not(feature = "compiler"))]
fn add_protos(_: &mut Registry, _: &BTreeMap<String, String>) -> Result<(), String> {
    Err(
        "protos: this module is built without the .proto compiler (grpc_wasm_lite.wasm): \
         give \"descriptor_set\" (protoc --include_imports -o) or \"reflection\", or load grpc_wasm.wasm"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> String {
        serde_json::json!({"protos": {"helloworld.proto": include_str!("../../../protos/helloworld.proto")}}).to_string()
    }

    #[test]
    fn a_dropped_configuration_lets_its_schema_go() {
        let c = FilterConfig::from_json(hello().as_bytes()).unwrap();
        let desc = c.registry.message("helloworld.HelloReply").unwrap();
        // A message printed from the wire (not flat: an unknown field).
        let reply = [0x0a, 0x01, b'x', 0x7a, 0x00];
        crate::json::protobuf_to_json(&desc, &reply, &JsonOptions::default()).unwrap();
        let kept = crate::json::kept_pool_count();
        drop(desc);
        drop(c);
        assert_eq!(crate::json::kept_pool_count(), kept - 1);
    }

    #[test]
    fn defaults() {
        let c = FilterConfig::from_json(hello().as_bytes()).unwrap();
        assert!(c.reject_unknown_methods);
        assert_eq!(c.max_request_bytes, 4 * 1024 * 1024);
        assert!(c.exposes("helloworld.Greeter"));
        assert_eq!(c.json, JsonOptions::default());
    }

    #[test]
    fn envoys_option_names_are_read_as_ours() {
        let cfg = serde_json::json!({
            "protos": {"helloworld.proto": include_str!("../../../protos/helloworld.proto")},
            "max_response_body_size": 1000,
            "print_options": {"always_print_primitive_fields": true, "stream_newline_delimited": true},
            "request_validation_options": {"reject_unknown_method": false},
            "auto_mapping": true
        });
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        assert_eq!(c.max_response_bytes, 1000);
        assert!(c.json.emit_defaults);
        assert!(!c.reject_unknown_methods);
        assert_eq!(c.stream_format, StreamFormat::Ndjson);
    }

    #[test]
    fn errors_name_the_problem() {
        let err = FilterConfig::from_json(br#"{"protoz": {}}"#).unwrap_err();
        assert!(
            err.starts_with("invalid plugin configuration: unknown field `protoz`"),
            "{err}"
        );
        let err = FilterConfig::from_json(
            br#"{"protos": {"a.proto": "syntax = \"proto3\";\nmessage {"}}"#,
        )
        .unwrap_err();
        assert!(err.starts_with("protos: a.proto:2:9: "), "{err}");
        let cfg = serde_json::json!({"protos": {"h.proto": include_str!("../../../protos/helloworld.proto")}, "services": ["x.Nope"]});
        assert_eq!(
            FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap_err(),
            "services: unknown service 'x.Nope'"
        );
        assert_eq!(
            FilterConfig::from_json(b"{}").unwrap_err(),
            "invalid plugin configuration: give \"protos\", \"descriptor_set\" or \"reflection\""
        );
        assert!(FilterConfig::from_json(b"not json")
            .unwrap_err()
            .starts_with("invalid plugin configuration: expected"));
    }

    #[test]
    fn openapi_is_built_with_the_configuration_and_a_bad_path_refused() {
        let protos =
            serde_json::json!({"h.proto": include_str!("../../../protos/helloworld.proto")});
        let cfg = serde_json::json!({"protos": protos, "openapi": {"path": "/openapi.json"}});
        let c = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap();
        let openapi = c.openapi.as_ref().unwrap();
        assert_eq!(openapi.path, "/openapi.json");
        let doc: serde_json::Value = serde_json::from_str(&openapi.document).unwrap();
        assert_eq!(doc["info"]["title"], "grpc-wasm");
        assert!(doc["paths"]["/helloworld.Greeter/SayHello"]["post"].is_object());
        for path in ["openapi.json", "/a?b", "/a#b"] {
            let cfg = serde_json::json!({"protos": protos, "openapi": {"path": path}});
            assert_eq!(
                FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap_err(),
                format!("openapi.path must be a path such as /openapi.json, not '{path}'")
            );
        }
        let cfg = serde_json::json!({"protos": protos, "openapi": {"path": "/a", "pretty": true}});
        let err = FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap_err();
        assert!(err.contains("unknown field `pretty`"), "{err}");
    }

    #[test]
    fn the_vm_budget_holds_one_whole_response_and_stays_within_a_gib() {
        let base = serde_json::json!({"protos": {"h.proto": include_str!("../../../protos/helloworld.proto")}});
        let load = |extra: serde_json::Value| {
            let mut cfg = base.clone();
            cfg.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            FilterConfig::from_json(cfg.to_string().as_bytes())
        };
        assert_eq!(
            load(serde_json::json!({})).unwrap().max_held_response_bytes,
            128 << 20
        );
        let big = load(serde_json::json!({"max_response_bytes": 200 << 20})).unwrap();
        assert_eq!(big.max_held_response_bytes, 400 << 20);
        assert_eq!(
            load(serde_json::json!({"max_held_response_bytes": 1000})).unwrap_err(),
            "max_held_response_bytes: 1000 is below max_response_bytes (4194304): no response of that size could be held"
        );
        assert_eq!(
            load(serde_json::json!({"max_held_response_bytes": (1u64 << 30) + 1})).unwrap_err(),
            "max_held_response_bytes: 1073741825 is above the largest limit, 1073741824 bytes"
        );
    }

    #[test]
    fn a_body_limit_past_what_the_module_can_hold_is_refused() {
        // A frame header declaring 0xffffffff under this limit wrapped the
        // frame's length in wasm32 and trapped the module.
        let mut cfg: serde_json::Value = serde_json::from_str(&hello()).unwrap();
        cfg["max_response_bytes"] = 4294967295u32.into();
        assert_eq!(
            FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap_err(),
            "max_response_bytes: 4294967295 is above the largest limit, 268435456 bytes"
        );
        cfg["max_response_bytes"] = (256u32 << 20).into();
        cfg["max_request_bytes"] = ((256u32 << 20) + 1).into();
        assert_eq!(
            FilterConfig::from_json(cfg.to_string().as_bytes()).unwrap_err(),
            "max_request_bytes: 268435457 is above the largest limit, 268435456 bytes"
        );
    }

    #[test]
    fn a_fetched_document_completes_the_inline_one() {
        let inline = br#"{"fetch": {"upstream": "127.0.0.1:8099", "path": "/grpc-wasm.json"}, "max_request_bytes": 10}"#;
        let Loaded::Fetch(fetch) = FilterConfig::load(inline).unwrap() else {
            panic!("expected a fetch");
        };
        assert_eq!(
            fetch,
            Fetch {
                upstream: "127.0.0.1:8099".into(),
                path: "/grpc-wasm.json".into(),
                authority: "localhost".into(),
                timeout_ms: 5000,
                sha256: None,
            }
        );
        let bad = br#"{"fetch": {"upstream": "u", "path": "/c.json", "sha256": "abc"}}"#;
        assert_eq!(
            FilterConfig::load(bad).unwrap_err(),
            "fetch: sha256: give the document's SHA-256 as 64 hex digits"
        );
        let c = FilterConfig::with_fetched(inline, hello().as_bytes()).unwrap();
        assert_eq!(c.max_request_bytes, 10);
        assert!(c.exposes("helloworld.Greeter"));
        assert_eq!(
            FilterConfig::with_fetched(inline, br#"{"max_request_bytes": 5}"#).unwrap_err(),
            "fetched configuration: \"max_request_bytes\" is given inline too"
        );
        assert_eq!(
            FilterConfig::with_fetched(inline, b"[]").unwrap_err(),
            "fetched configuration: expected a JSON object"
        );
        assert_eq!(
            FilterConfig::from_json(inline).unwrap_err(),
            "fetch: only a proxy-wasm host with HTTP calls can fetch a configuration"
        );
        assert_eq!(
            FilterConfig::load(br#"{"fetch": {"upstream": "a", "path": "x"}}"#).unwrap_err(),
            "fetch: give \"upstream\", a \"path\" starting with '/', and a timeout_ms of at least 1"
        );
        assert!(FilterConfig::load(br#"{"fetch": {"upstream": "a"}}"#)
            .unwrap_err()
            .starts_with("fetch: missing field `path`"));
    }

    fn with_callout(callout: serde_json::Value) -> Result<FilterConfig, String> {
        let cfg = serde_json::json!({"protos": {"h.proto": include_str!("../../../protos/helloworld.proto")}, "callout": callout});
        FilterConfig::from_json(cfg.to_string().as_bytes())
    }

    #[test]
    fn a_loopback_cluster_is_a_name_and_never_beside_a_callout() {
        let hello = include_str!("../../../protos/helloworld.proto");
        let load = |extra: serde_json::Value| {
            let mut cfg = serde_json::json!({"protos": {"h.proto": hello}});
            cfg.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            FilterConfig::from_json(cfg.to_string().as_bytes())
        };
        let c = load(serde_json::json!({"loopback_cluster": "inner"})).unwrap();
        assert_eq!(c.loopback_cluster.as_deref(), Some("inner"));
        assert_eq!(load(serde_json::json!({})).unwrap().loopback_cluster, None);
        assert_eq!(
            load(serde_json::json!({"loopback_cluster": ""})).unwrap_err(),
            "loopback_cluster: give the name of a cluster"
        );
        assert_eq!(
            load(serde_json::json!({"loopback_cluster": "inner", "callout": {"upstream": "a"}}))
                .unwrap_err(),
            "loopback_cluster: callout mode calls callout.upstream for every request; name the loopback cluster there instead"
        );
    }

    #[test]
    fn callouts() {
        let c = with_callout(
            serde_json::json!({"upstream": "greeter", "metadata": {"X-Origin": "proxy"}}),
        )
        .unwrap();
        let callout = c.callout.as_ref().unwrap();
        assert_eq!(callout.upstream, b"greeter");
        assert_eq!(callout.timeout_ms, 10_000);
        assert_eq!(
            callout.metadata,
            vec![("x-origin".to_string(), "proxy".to_string())]
        );
        let c = with_callout(serde_json::json!({"grpc_service": "CgQKAmdy"})).unwrap();
        assert_eq!(c.callout.as_ref().unwrap().upstream, b"\n\x04\n\x02gr");
        let one_of =
            "callout: give exactly one of \"upstream\" (a cluster name) or \"grpc_service\"";
        assert_eq!(with_callout(serde_json::json!({})).unwrap_err(), one_of);
        assert_eq!(
            with_callout(serde_json::json!({"upstream": "a", "grpc_service": "CgA="})).unwrap_err(),
            one_of
        );
        assert_eq!(
            with_callout(serde_json::json!({"upstream": "a", "timeout_ms": 0})).unwrap_err(),
            "callout.timeout_ms: must be at least 1"
        );
        let err =
            with_callout(serde_json::json!({"upstream": "a", "metadata": {"grpc-timeout": "1S"}}))
                .unwrap_err();
        assert!(err.starts_with("callout.metadata: "), "{err}");
        let c = with_callout(serde_json::json!({"upstream": "a"})).unwrap();
        assert_eq!(
            c.callout.as_ref().unwrap().propagate,
            ["traceparent", "tracestate"]
        );
        let c = with_callout(serde_json::json!({"upstream": "a", "propagate": ["X-B3-TraceId"]}))
            .unwrap();
        assert_eq!(c.callout.as_ref().unwrap().propagate, ["x-b3-traceid"]);
        for (name, why) in [
            (
                "x-envoy-retry-on",
                "x-envoy-retry-on is the HTTP/2, gRPC or proxy's own, not metadata a call can carry",
            ),
            (
                "grpc-timeout",
                "grpc-timeout is the HTTP/2, gRPC or proxy's own, not metadata a call can carry",
            ),
            (
                "a b",
                "invalid metadata key 'a b': only letters, digits, '-', '_' and '.'",
            ),
        ] {
            let err = with_callout(serde_json::json!({"upstream": "a", "propagate": [name]}))
                .unwrap_err();
            assert_eq!(err, format!("callout.propagate: {why}"));
        }
    }
}
