//! Descriptors asked of the upstream (`"reflection"` in the configuration):
//! the root context runs the core's reflection [`Loader`] over a
//! `proxy_grpc_stream` from its ticks, installs the configuration the
//! answers make, and loads again every `refresh_s`. A new set replaces the
//! old one for new requests only (each stream keeps the configuration it
//! began with); a failed load keeps what was installed and is tried again,
//! backing off from 1 s to 30 s. Until the first load succeeds, transcoded
//! requests get 503 `UNAVAILABLE` and native gRPC passes through.

use std::cell::RefCell;

use crate::code::Code;
use crate::reflection::{Loader, Reflected, Version, METHOD};
use crate::status::Status;
use crate::Registry;

use super::config::{FilterConfig, Reflection};
use super::host::{self, *};
use super::id_map::IdMap;
use super::reply::Reply;
use crate::contract::{BufferType, ContextId, LogLevel, Token};

use super::backoff::Backoff;
use crate::limits::MAX_REFLECTED_BYTES;

struct Loading {
    inline: Vec<u8>,
    reflection: Reflection,
    /// The load in flight, its stream and when it must end.
    loader: Option<Loader>,
    token: Option<Token>,
    deadline_ns: u64,
    /// When the next load starts (a refresh, or a retry).
    next_ns: u64,
    backoff: Backoff,
    /// The version the server answered last: asked first next time.
    version: Version,
    /// A configuration from a load is installed.
    installed: bool,
}

thread_local! {
    static LOADS: RefCell<IdMap<ContextId, Loading>> = RefCell::new(IdMap::default());
    /// HTTP contexts created before their root's first load, with the root.
    static WAITING: RefCell<IdMap<ContextId, ContextId>> = RefCell::new(IdMap::default());
}

/// Starts loading `root_id`'s descriptors at its next tick.
pub fn start(root_id: ContextId, inline: Vec<u8>, reflection: Reflection) {
    let loading = Loading {
        inline,
        reflection,
        loader: None,
        token: None,
        deadline_ns: 0,
        next_ns: 0,
        backoff: Backoff::default(),
        version: Version::V1,
        installed: false,
    };
    LOADS.with(|l| l.borrow_mut().insert(root_id, loading));
    if let Err(s) = host::ticks(root_id, true) {
        log(
            LogLevel::Error,
            &format!("grpc-wasm: the host refused a tick period (status {}); descriptors cannot be loaded through reflection", s.0),
        );
    }
}

/// Whether `root_id` loads through reflection (its ticks must go on).
pub fn loads(root_id: ContextId) -> bool {
    LOADS.with(|l| l.borrow().contains_key(&root_id))
}

/// Is `root_id` still before its first load? Then the HTTP context
/// `context_id` waits on it.
pub fn adopt(context_id: ContextId, root_id: ContextId) -> bool {
    let waiting = LOADS.with(|l| l.borrow().get(&root_id).is_some_and(|s| !s.installed));
    if waiting {
        WAITING.with(|w| w.borrow_mut().insert(context_id, root_id));
    }
    waiting
}

/// The answer for a request that came before its root's first load:
/// `None` for native gRPC, which passes through.
pub fn not_ready(context_id: ContextId) -> Option<Reply> {
    let root_id = WAITING.with(|w| w.borrow().get(&context_id).copied())?;
    let headers = HeaderMap::read(crate::contract::MapType::HttpRequestHeaders);
    if super::transcode::is_native_grpc(headers.get("content-type")) {
        return None;
    }
    // Why goes to the log only: the upstream's name is no client's business.
    let message = if LOADS.with(|l| l.borrow().get(&root_id).is_some_and(|s| s.installed)) {
        "grpc-wasm: descriptors were loaded after this request began; retry"
    } else {
        "grpc-wasm: descriptors not loaded yet (the proxy's log says why)"
    };
    Some(Reply::bare_error(&Status::new(Code::Unavailable, message)))
}

pub fn forget(context_id: ContextId) {
    WAITING.with(|w| w.borrow_mut().remove(&context_id));
    let gone = LOADS.with(|l| l.borrow_mut().remove(&context_id));
    // A root that goes mid-load leaves no stream open.
    if let Some(token) = gone.and_then(|state| state.token) {
        let _ = host::grpc_cancel(token);
    }
}

/// Whether a gRPC callback's `token` is a reflection stream's.
pub fn owns(token: Token) -> bool {
    LOADS.with(|l| l.borrow().values().any(|s| s.token == Some(token)))
}

/// A tick of `root_id`: starts a load when one is due, ends one that ran
/// out of time.
pub fn on_tick(root_id: ContextId) {
    LOADS.with(|l| {
        let mut loads = l.borrow_mut();
        let Some(state) = loads.get_mut(&root_id) else {
            return;
        };
        let now = now_nanos();
        if let Some(token) = state.token {
            if now >= state.deadline_ns {
                let _ = host::grpc_cancel(token);
                let waiting = waiting_for(state);
                let why = format!(
                    "the load did not end within timeout_ms ({} ms), waiting for {waiting}",
                    state.reflection.timeout_ms
                );
                failed(state, why);
            }
            return;
        }
        if now < state.next_ns || (state.installed && state.reflection.refresh_s == 0) {
            return;
        }
        let loader = Loader::new(
            state.version,
            state.reflection.services.as_deref(),
            Registry::bundled_files(),
        );
        state.deadline_ns =
            now.saturating_add(state.reflection.timeout_ms.saturating_mul(1_000_000));
        state.loader = Some(loader);
        open(state);
    });
}

/// Opens the stream for the loader's version and sends what it asks.
fn open(state: &mut Loading) {
    let Some(loader) = state.loader.as_mut() else {
        return;
    };
    let target = GrpcTarget {
        upstream: &state.reflection.upstream,
        service: loader.version().service(),
        method: METHOD,
        metadata: &[],
    };
    match host::grpc_stream(&target) {
        Ok(token) => {
            let requests = loader.requests();
            state.token = Some(token);
            send(state, token, requests);
        }
        Err(s) => failed(
            state,
            format!("the host refused the stream (status {})", s.0),
        ),
    }
}

fn send(state: &mut Loading, token: Token, requests: Vec<Vec<u8>>) {
    for request in requests {
        if let Err(s) = host::grpc_send(token, &request) {
            let _ = host::grpc_cancel(token);
            return failed(
                state,
                format!("the host refused a message (status {})", s.0),
            );
        }
    }
}

/// A message on a reflection stream. The configuration it completes, to
/// install.
pub fn on_receive(token: Token, size: usize) -> Option<(ContextId, FilterConfig)> {
    // Refused before it is copied into the module: no answer may hold more
    // than a whole set.
    let message = if size <= MAX_REFLECTED_BYTES {
        host::buffer(BufferType::GrpcReceiveBuffer, 0, size).unwrap_or_default()
    } else {
        Vec::new()
    };
    with_load(token, |root_id, state| {
        if size > MAX_REFLECTED_BYTES {
            let _ = host::grpc_cancel(token);
            let waiting = waiting_for(state);
            failed(
                state,
                format!("the answer to {waiting} has {size} bytes, over the limit of {MAX_REFLECTED_BYTES}"),
            );
            return None;
        }
        match state.loader.as_mut()?.on_answer(&message) {
            Err(e) => {
                let _ = host::grpc_cancel(token);
                failed(state, e.to_string());
                return None;
            }
            Ok(Some(requests)) => {
                send(state, token, requests);
                return None;
            }
            Ok(None) => {}
        }
        // Everything asked was answered: the stream has done its work.
        let _ = host::grpc_cancel(token);
        state.token = None;
        finish(root_id, state)
    })
}

/// The end of a reflection stream.
pub fn on_close(token: Token, status_code: u32) -> Option<(ContextId, FilterConfig)> {
    let (_, message) = host::grpc_status();
    with_load(token, |root_id, state| {
        state.token = None;
        let loader = state.loader.as_mut()?;
        let code = Code::from_i32(i32::try_from(status_code).unwrap_or(2));
        match loader.on_close(code, &message) {
            Ok(Some(_)) => {
                open(state);
                None
            }
            Ok(None) => finish(root_id, state),
            Err(e) => {
                failed(state, e.to_string());
                None
            }
        }
    })
}

/// What a load in flight waits for, for the message that ends it.
fn waiting_for(state: &Loading) -> String {
    state
        .loader
        .as_ref()
        .map(Loader::waiting_for)
        .unwrap_or_default()
}

fn with_load<T>(token: Token, f: impl FnOnce(ContextId, &mut Loading) -> Option<T>) -> Option<T> {
    LOADS.with(|l| {
        let mut loads = l.borrow_mut();
        let (root_id, state) = loads.iter_mut().find(|(_, s)| s.token == Some(token))?;
        f(*root_id, state)
    })
}

/// The configuration a complete load makes, or `None` (logged; the
/// installed one stays).
fn finish(root_id: ContextId, state: &mut Loading) -> Option<(ContextId, FilterConfig)> {
    let loader = state.loader.take()?;
    let built = loader
        .finish()
        .map_err(|e| e.to_string())
        .and_then(|reflected| {
            let config = FilterConfig::with_reflected(&state.inline, &reflected.descriptor_set)?;
            // An answer may hold any file: the services asked for must be in it.
            let pool = config.registry.pool();
            let missing = reflected
                .services
                .iter()
                .find(|s| pool.get_service_by_name(s).is_none());
            if let Some(missing) = missing {
                return Err(format!(
                    "service '{missing}': the server's files do not define it"
                ));
            }
            Ok((reflected, config))
        });
    match built {
        Ok((reflected, config)) => {
            loaded(state, &reflected);
            Some((root_id, config))
        }
        Err(why) => {
            failed(state, why);
            None
        }
    }
}

fn loaded(state: &mut Loading, reflected: &Reflected) {
    log(
        LogLevel::Info,
        &format!(
            "grpc-wasm: descriptors loaded through reflection ({}): {} services, {} files",
            reflected.version.service(),
            reflected.services.len(),
            reflected.files
        ),
    );
    state.version = reflected.version;
    state.backoff.reset();
    state.next_ns =
        now_nanos().saturating_add(state.reflection.refresh_s.saturating_mul(1_000_000_000));
}

/// The configuration a load made is `root_id`'s now: requests no longer
/// wait for one.
pub fn installed(root_id: ContextId) {
    LOADS.with(|l| {
        if let Some(state) = l.borrow_mut().get_mut(&root_id) {
            state.installed = true;
        }
    });
}

/// Logs why a load failed and when the next one starts.
fn failed(state: &mut Loading, why: String) {
    state.token = None;
    state.loader = None;
    let kept = if state.installed {
        "the descriptors loaded before stay"
    } else {
        "transcoded requests get 503 until a load succeeds"
    };
    let delay = state.backoff.next_ms();
    log(
        LogLevel::Error,
        &format!("grpc-wasm: reflection: {why}; {kept}; trying again in {delay} ms"),
    );
    state.next_ns = now_nanos().saturating_add(delay * 1_000_000);
}
