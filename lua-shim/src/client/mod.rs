//! The shim's engine: one proxy-wasm host (the module, in callout mode), a
//! tokio runtime for the transport, and per-call event queues that the Lua
//! side drains. A call is an HTTP context of the module; its events are
//! streamed messages and one final reply.
//!
//! Threads: Lua calls in from the nginx worker thread. On a tonic
//! connection, transport events arrive on the runtime's one worker thread;
//! both reach the module through one mutex, so a call costs two thread
//! hops: worker → runtime (the request leaves) and runtime → worker (the
//! wake-up). On a wire connection the caller moves the socket's bytes and
//! everything happens on its thread; only the module's ticks (deadlines)
//! run on the runtime.
//!
//! One concern per file: [`schema`] (`.proto` files and their imports,
//! descriptor sets, print options), [`conns`] (the connection registry),
//! [`sockets`] (connections whose socket the caller drives), [`calls`]
//! (starting, feeding and closing calls), [`reflect`] (server reflection
//! loads, beside the module's calls), [`queues`] (each call's events
//! and the backpressure both ways), [`module`] (driving the module:
//! events in, commands out, ticks) and [`recovery`] (a trap rebuilds the
//! instance). The client knows a connection only as a
//! [`CallTransport`].
//!
//! Lock order: `changing` → `host` → `reflections` → `calls` → a connection's own lock
//! (the wire transport's `Wire`) → that connection's inner locks and the
//! streams' gates. `conns`, `events`, `protos` and `loaded` are taken
//! alone or under `host` (`events` also under `reflections`), and nothing
//! is taken under them but a gate (`events` → gate). Nothing takes `host` while holding a connection: a socket's
//! step releases its `Wire` before its events enter the module.

mod calls;
mod conns;
mod module;
mod protos;
mod queues;
mod recovery;
mod reflect;
mod schema;
mod sockets;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap as HashMap;

use crate::call::{CallId, Compression, ConnId, HeaderBlock, Token};
use crate::host::{HostError, LocalReply, ProxyHost};
use crate::transport::{CallTransport, RunningCall, Sink, TransportError};
use module::sink;
use protos::ProtoSet;
use queues::Queue;
pub use recovery::panic_message;

/// The request header that names the connection (the module's
/// `callout.upstream_header`).
const UPSTREAM_HEADER: &str = "x-grpc-wasm-upstream";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("cannot read {0}: {1}")]
    Io(String, String),
    #[error("import '{0}' of {1} not found in {2:?}")]
    MissingImport(String, String, Vec<PathBuf>),
    #[error("unknown or closed connection")]
    UnknownConn,
    #[error("unknown or finished call")]
    UnknownCall,
    #[error("cannot start the runtime: {0}")]
    Runtime(String),
    #[error(transparent)]
    Metadata(#[from] grpc_wasm::metadata::MetadataError),
    #[error("'{0}' is not loaded")]
    NotLoaded(String),
    /// A reflection load that failed, or its set that did not load.
    #[error("{0}")]
    Reflection(String),
    /// A panic in the shim, contained (see `Client::after_panic`).
    #[error("internal error (panic): {0}")]
    Panicked(String),
}

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The deadline; the module's default (10 s) when absent.
    pub timeout_ms: Option<u64>,
    /// Request metadata; `-bin` values base64.
    pub metadata: Vec<(String, String)>,
    /// Headers of the request being served that the caller named to carry
    /// on (`grpc.init{propagate}`), as they came: those the core's rule
    /// lets go (`grpc_wasm::metadata::propagated`) join the metadata.
    pub propagated: Vec<(String, String)>,
    /// JSON options for this call, comma-separated (`emit_defaults,...`).
    pub json_options: Option<String>,
    /// How its request messages are compressed (`grpc-encoding`).
    pub compression: Compression,
}

/// The request compression a caller names: `gzip`, or `identity` (none).
pub fn compression_named(name: &str) -> Result<Compression, String> {
    match Compression::from_header(name) {
        Some(compression) if compression.name() == name => Ok(compression),
        _ => Err(format!(
            "unknown compression '{}': gzip or identity",
            name.escape_default()
        )),
    }
}

/// What a call has for its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One streamed response message, as JSON.
    Message(Vec<u8>),
    /// The end: the module's reply (JSON message or `google.rpc.Status`).
    End(LocalReply),
}

/// Called with a call id when that call has a new event.
pub type Wake = Arc<dyn Fn(CallId) + Send + Sync>;

/// A connection, as the client knows it: whichever transport carries it.
type Conn = Arc<dyn CallTransport + Send + Sync>;

struct Inner {
    host: Mutex<ProxyHost>,
    runtime: tokio::runtime::Runtime,
    conns: Mutex<HashMap<ConnId, Conn>>,
    next_conn: AtomicU32,
    /// The module's calls (by token) while their transport runs them.
    calls: Mutex<HashMap<Token, Box<dyn RunningCall>>>,
    events: Mutex<HashMap<CallId, Queue>>,
    /// Reflection loads by their caller's call (see [`reflect`]), and how
    /// many there are, read without the lock on every transport event.
    reflections: Mutex<HashMap<CallId, reflect::Reflection>>,
    reflecting: AtomicUsize,
    /// What the module is configured with (see [`ProtoSet`]).
    protos: Mutex<ProtoSet>,
    /// `protos` as a registry here, for `describe`; made again after a change.
    loaded: Mutex<Option<Arc<grpc_wasm::Registry>>>,
    /// Held through a change of `protos`, so that two changes do not each
    /// build on the set the other replaces. Never taken under `host`.
    changing: Mutex<()>,
    ticking: AtomicBool,
    wake: Wake,
    /// Where the runtime transport's calls report: made once, as every
    /// call takes it.
    sink: Sink,
    max_queued: AtomicUsize,
}

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Loads the module (compiled once into `cache_dir`) and starts the runtime.
    pub fn new(wasm: &[u8], cache_dir: Option<&Path>, wake: Wake) -> Result<Client, ClientError> {
        let host = ProxyHost::new(wasm, cache_dir)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("grpc-wasm")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        let client = Client {
            inner: Arc::new_cyclic(|weak| Inner {
                host: Mutex::new(host),
                runtime,
                conns: Mutex::new(HashMap::default()),
                next_conn: AtomicU32::new(1),
                calls: Mutex::new(HashMap::default()),
                events: Mutex::new(HashMap::default()),
                reflections: Mutex::new(HashMap::default()),
                reflecting: AtomicUsize::new(0),
                protos: Mutex::new(ProtoSet::default()),
                loaded: Mutex::new(None),
                changing: Mutex::new(()),
                ticking: AtomicBool::new(false),
                wake,
                max_queued: AtomicUsize::new(crate::limits::DEFAULT_MAX_QUEUED_BYTES),
                sink: sink(weak.clone()),
            }),
        };
        client.change_protos(|protos| Ok(protos.clone()))?;
        Ok(client)
    }

    /// Wakes the waiters of these calls; called with the module unlocked,
    /// so that a woken Lua thread never waits for the mutex.
    fn wake(&self, ids: Vec<CallId>) {
        for id in ids {
            (self.inner.wake)(id);
        }
    }
}

/// A call's end made by the client itself, as the module reports one:
/// `body` (JSON), the status headers, and the HTTP status of `code`.
fn local_reply(code: grpc_wasm::Code, body: String) -> LocalReply {
    let none: &[u8] = b"";
    let number = itoa::Buffer::new()
        .format(code.as_i32())
        .as_bytes()
        .to_vec();
    let headers = [
        (none, &b"grpc-status"[..], number.as_slice()),
        (none, b"grpc-status-name", code.name().as_bytes()),
        (none, b"content-type", b"application/json"),
    ];
    LocalReply {
        http_status: u32::from(code.to_http_status()),
        body: body.into_bytes(),
        headers: HeaderBlock::from_entries(|| headers.iter().copied()),
    }
}

/// A failed call's end: a `google.rpc.Status` body, as the module's.
fn status_reply(code: grpc_wasm::Code, message: &str) -> LocalReply {
    let body = serde_json::json!({"code": code.as_i32(), "message": message});
    local_reply(code, body.to_string())
}

/// Two lists of woken calls as one, each call once.
fn merge(mut woken: Vec<CallId>, more: Vec<CallId>) -> Vec<CallId> {
    for id in more {
        if !woken.contains(&id) {
            woken.push(id);
        }
    }
    woken
}

#[cfg(test)]
mod tests;
