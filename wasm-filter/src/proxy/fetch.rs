//! A configuration completed by an HTTP fetch (`"fetch"` in the inline
//! configuration): the root context asks the host for the document from a
//! tick (ngx_wasm_module lets a root context call out only there), and
//! until it has a working configuration every request under that root gets
//! a 503 `UNAVAILABLE` naming why, never an untranscoded pass-through. A
//! failed fetch is retried, backing off from 1 s to 30 s.

use std::cell::RefCell;

use crate::code::Code;
use crate::status::Status;

use super::config::{Fetch, FilterConfig};
use super::host::{self, *};
use super::id_map::IdMap;
use super::reply::Reply;
use crate::contract::{BufferType, ContextId, LogLevel, MapType, Token};

use super::backoff::Backoff;
use crate::limits::MAX_DOCUMENT_BYTES;

struct Loading {
    inline: Vec<u8>,
    fetch: Fetch,
    /// The call in flight.
    token: Option<Token>,
    retry_at_ns: u64,
    backoff: Backoff,
}

thread_local! {
    static LOADING: RefCell<IdMap<ContextId, Loading>> = RefCell::new(IdMap::default());
    /// HTTP contexts created under a loading root, with that root's id.
    static WAITING: RefCell<IdMap<ContextId, ContextId>> = RefCell::new(IdMap::default());
}

/// Starts loading `root_id`'s configuration; the first try is at the next
/// tick.
pub fn start(root_id: ContextId, inline: Vec<u8>, fetch: Fetch) {
    LOADING.with(|l| {
        l.borrow_mut().insert(
            root_id,
            Loading {
                inline,
                fetch,
                token: None,
                retry_at_ns: 0,
                backoff: Backoff::default(),
            },
        )
    });
    if let Err(s) = host::ticks(root_id, true) {
        log(
            LogLevel::Error,
            &format!("grpc-wasm: the host refused a tick period (status {}); the configuration cannot be fetched", s.0),
        );
    }
}

fn source(fetch: &Fetch) -> String {
    format!(
        "http://{}{} (upstream {})",
        fetch.authority, fetch.path, fetch.upstream
    )
}

/// Is `root_id` loading? Then the HTTP context `context_id` waits on it.
pub fn adopt(context_id: ContextId, root_id: ContextId) -> bool {
    let loading = LOADING.with(|l| l.borrow().get(&root_id).is_some());
    if loading {
        WAITING.with(|w| w.borrow_mut().insert(context_id, root_id));
    }
    loading
}

/// The answer for a request under a root that has no configuration yet.
pub fn not_ready(context_id: ContextId) -> Option<Reply> {
    let root_id = WAITING.with(|w| w.borrow().get(&context_id).copied())?;
    // Why goes to the log only: the source's address is no client's business.
    let message = if LOADING.with(|l| l.borrow().contains_key(&root_id)) {
        "grpc-wasm: the filter's configuration is not loaded yet (the proxy's error log says why)"
    } else {
        "grpc-wasm: the filter's configuration was loaded after this request began; retry"
    };
    Some(Reply::bare_error(&Status::new(Code::Unavailable, message)))
}

pub fn forget(context_id: ContextId) {
    WAITING.with(|w| w.borrow_mut().remove(&context_id));
    LOADING.with(|l| l.borrow_mut().remove(&context_id));
}

/// A tick of `root_id`: starts the next try when one is due.
pub fn on_tick(root_id: ContextId) {
    LOADING.with(|l| {
        let mut loading = l.borrow_mut();
        let Some(state) = loading.get_mut(&root_id) else {
            return;
        };
        if state.token.is_some() || now_nanos() < state.retry_at_ns {
            return;
        }
        let f = &state.fetch;
        match host::http_get(&f.upstream, &f.authority, &f.path, f.timeout_ms) {
            Ok(token) => state.token = Some(token),
            Err(s) => {
                let reason = format!(
                    "the host refused the HTTP call to {} (status {})",
                    source(f),
                    s.0
                );
                failed(state, reason);
            }
        }
    });
}

/// The answer to a fetch: the finished configuration, or `None` (logged,
/// and retried later) when the answer does not make one.
pub fn on_response(
    root_id: ContextId,
    token: Token,
    body_size: usize,
    check: impl FnOnce(FilterConfig) -> Result<FilterConfig, String>,
) -> Option<FilterConfig> {
    LOADING.with(|l| {
        let mut loading = l.borrow_mut();
        let state = loading.get_mut(&root_id)?;
        if state.token != Some(token) {
            return None;
        }
        state.token = None;
        let checked = configuration(state, body_size)
            .and_then(|c| check(c).map_err(|e| format!("{}: {e}", source(&state.fetch))));
        match checked {
            Ok(config) => {
                log(
                    LogLevel::Info,
                    &format!("grpc-wasm: configured from {}", source(&state.fetch)),
                );
                loading.remove(&root_id);
                Some(config)
            }
            Err(reason) => {
                failed(state, reason);
                None
            }
        }
    })
}

fn configuration(state: &Loading, body_size: usize) -> Result<FilterConfig, String> {
    let from = source(&state.fetch);
    let headers = HeaderMap::read(MapType::HttpCallResponseHeaders);
    let status = headers.get(":status").unwrap_or_default();
    if status != "200" {
        // Hosts answer a failed call with no headers (Envoy) or with a
        // `:dispatch_status` of their own (ngx_wasm_module).
        let why = headers
            .get(":dispatch_status")
            .map(|d| format!("the call failed ({d})"))
            .unwrap_or_else(|| {
                if status.is_empty() {
                    "the call failed (no response)".into()
                } else {
                    format!("HTTP status {status}")
                }
            });
        return Err(format!("{from}: {why}"));
    }
    if body_size > MAX_DOCUMENT_BYTES {
        return Err(format!(
            "{from}: the document has {body_size} bytes, more than {MAX_DOCUMENT_BYTES}"
        ));
    }
    let body = host::buffer(BufferType::HttpCallResponseBody, 0, body_size)
        .map_err(|s| format!("{from}: cannot read the body (host status {})", s.0))?;
    if let Some(expected) = &state.fetch.sha256 {
        let actual = sha256_hex(&body);
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(format!(
                "{from}: the document's sha256 is {actual}, not the {expected} the configuration names"
            ));
        }
    }
    FilterConfig::with_fetched(&state.inline, &body).map_err(|e| format!("{from}: {e}"))
}

/// The SHA-256 of `bytes`, in lowercase hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn failed(state: &mut Loading, reason: String) {
    let delay = state.backoff.next_ms();
    log(
        LogLevel::Error,
        &format!("grpc-wasm: no configuration yet: {reason}; trying again in {delay} ms"),
    );
    state.retry_at_ns = now_nanos().saturating_add(delay * 1_000_000);
}
