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

mod protos;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_wasm::proxy::contract::{JSON_OPTIONS_HEADER, METADATA_PREFIX};
use grpc_wasm::timeout::encode_timeout;
use rustc_hash::FxHashMap as HashMap;

use crate::call::events;
use crate::call::{Compression, GrpcEvent, GrpcTarget, HeaderBlock, Produced};
use crate::host::{GrpcCommand, HostError, LocalReply, Outputs, ProxyHost};
use crate::sync::lock;
use crate::transport::runtime::{self, Upstream};
use crate::transport::tls::ClientTls;
use crate::transport::wire::Wire;
use crate::transport::{
    CallTransport, Gate, Keepalive, NewCall, RunningCall, Sink, Started, TlsOptions, TransportError,
};
use protos::ProtoSet;

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
}

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The deadline; the module's default (10 s) when absent.
    pub timeout_ms: Option<u64>,
    /// Request metadata; `-bin` values base64.
    pub metadata: Vec<(String, String)>,
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
pub type Wake = Arc<dyn Fn(u32) + Send + Sync>;

/// A connection: a tonic channel on the runtime, or a [`Wire`] whose
/// socket the caller drives (a cosocket).
#[derive(Clone)]
enum Conn {
    Tonic(Upstream),
    Wire(Arc<Mutex<Wire>>),
}

impl Conn {
    fn transport(&self) -> &dyn CallTransport {
        match self {
            Conn::Tonic(upstream) => upstream,
            Conn::Wire(wire) => wire,
        }
    }
}

struct Inner {
    host: Mutex<ProxyHost>,
    runtime: tokio::runtime::Runtime,
    conns: Mutex<HashMap<u32, Conn>>,
    next_conn: AtomicU32,
    /// The module's calls (by token) while their transport runs them.
    calls: Mutex<HashMap<u32, Box<dyn RunningCall>>>,
    events: Mutex<HashMap<u32, Queue>>,
    /// What the module is configured with (see [`ProtoSet`]).
    protos: Mutex<ProtoSet>,
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

/// A call's events not yet taken, and whether its end is among them (then
/// the module has already finished the call).
#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    ended: bool,
    /// The bytes of the messages in `events`.
    bytes: usize,
    /// Its stream's backpressure, closed while `bytes` is at the cap.
    gate: Option<Arc<Gate>>,
    /// The wire connection its stream runs on, driven when the gate opens.
    wire: Option<u32>,
    /// How its caller wants the request compressed.
    compression: Compression,
}

impl Queue {
    fn push(&mut self, event: Event, cap: usize) {
        self.ended |= matches!(event, Event::End(_));
        if let Event::Message(json) = &event {
            self.bytes += json.len();
        }
        if self.bytes >= cap {
            if let Some(gate) = &self.gate {
                gate.close();
            }
        }
        self.events.push_back(event);
    }

    /// The next event, and whether taking it opened the stream's gate.
    fn pop(&mut self, cap: usize) -> (Option<Event>, bool) {
        let event = self.events.pop_front();
        if let Some(Event::Message(json)) = &event {
            self.bytes -= json.len();
        }
        let opened = self.bytes < cap && self.gate.as_ref().is_some_and(|g| g.open());
        (event, opened)
    }
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
                protos: Mutex::new(ProtoSet::default()),
                changing: Mutex::new(()),
                ticking: AtomicBool::new(false),
                wake,
                max_queued: AtomicUsize::new(crate::limits::DEFAULT_MAX_QUEUED_BYTES),
                sink: sink(weak.clone()),
            }),
        };
        client.change_protos(ProtoSet::clone)?;
        Ok(client)
    }

    /// Loads a `.proto` file and, recursively, the files it imports, found
    /// in the file's own directory and then `include`. google/api,
    /// google/rpc and the well-known types are bundled in the module.
    pub fn load_file(&self, path: &Path, include: &[PathBuf]) -> Result<(), ClientError> {
        let mut dirs: Vec<PathBuf> = include.to_vec();
        if let Some(parent) = path.parent() {
            dirs.insert(
                0,
                if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                },
            );
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _changing = lock(&self.inner.changing);
        let mut found = BTreeMap::new();
        self.collect(&name, path, &dirs, &mut found)?;
        // A file that parses but does not compile must not stay loaded: it
        // would fail every later load, and shadow a fixed file of the same
        // name.
        self.change_protos(|protos| protos.with_files(found))
    }

    fn collect(
        &self,
        name: &str,
        path: &Path,
        dirs: &[PathBuf],
        found: &mut BTreeMap<String, String>,
    ) -> Result<(), ClientError> {
        if found.contains_key(name) || lock(&self.inner.protos).has_file(name) {
            return Ok(());
        }
        let source = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Io(path.display().to_string(), e.to_string()))?;
        let (imports, woken) = {
            let mut host = lock(&self.inner.host);
            let imports = host.proto_imports(name, &source);
            self.checked(&mut host, imports)
        };
        self.wake(woken);
        let imports = imports?;
        found.insert(name.to_string(), source);
        for import in imports {
            match dirs.iter().map(|d| d.join(&import)).find(|p| p.is_file()) {
                Some(p) => self.collect(&import, &p, dirs, found)?,
                None if import.starts_with("google/") => {}
                None => {
                    return Err(ClientError::MissingImport(
                        import,
                        name.to_string(),
                        dirs.to_vec(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Adds a serialized `FileDescriptorSet` (sets concatenate into one).
    pub fn load_descriptor_set(&self, bytes: &[u8]) -> Result<(), ClientError> {
        let _changing = lock(&self.inner.changing);
        self.change_protos(|protos| protos.with_descriptor_set(bytes))
    }

    /// Sets the module's JSON print options (`emit_defaults`, ...).
    pub fn set_print_options(
        &self,
        options: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ClientError> {
        let _changing = lock(&self.inner.changing);
        self.change_protos(|protos| protos.with_print_options(options))
    }

    /// Configures the module with the set `change` makes of the current
    /// one, and keeps it only if the module took it. A refusal leaves the
    /// module as it was; a trap rebuilds it (`recover`) with the current
    /// set, which never held the change. The caller holds `changing`.
    fn change_protos(&self, change: impl FnOnce(&ProtoSet) -> ProtoSet) -> Result<(), ClientError> {
        let next = change(&lock(&self.inner.protos));
        let config = next.config(UPSTREAM_HEADER);
        let (result, woken) = {
            let mut host = lock(&self.inner.host);
            let result = host.configure(config.as_bytes());
            let (result, woken) = self.checked(&mut host, result);
            if result.is_ok() {
                // Kept while the module is still locked: a trap on another
                // thread (a tick, a transport event) rebuilds the instance
                // with the set it was configured with, never the one before.
                *lock(&self.inner.protos) = next;
            }
            (result, woken)
        };
        self.wake(woken);
        Ok(result?)
    }

    /// The module's configuration for what is loaded now.
    fn config(&self) -> String {
        lock(&self.inner.protos).config(UPSTREAM_HEADER)
    }

    /// The cap on what each call holds for its caller (at least 1 byte).
    pub fn set_max_queued_bytes(&self, bytes: usize) {
        self.inner.max_queued.store(bytes.max(1), Ordering::Relaxed);
    }

    fn max_queued(&self) -> usize {
        self.inner.max_queued.load(Ordering::Relaxed)
    }

    pub fn connect(
        &self,
        addr: &str,
        tls: &TlsOptions,
        keepalive: &Keepalive,
    ) -> Result<u32, ClientError> {
        let _guard = self.inner.runtime.enter();
        let upstream = runtime::connect(addr, tls, keepalive)?;
        let id = self.inner.next_conn.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.conns).insert(id, Conn::Tonic(upstream));
        Ok(id)
    }

    /// A connection whose socket the caller owns and drives with
    /// [`Client::wire_input`] and [`Client::wire_output`]: calls on it run
    /// on the caller's thread, and [`Client::wire_tick`] keeps it honest.
    pub fn connect_wire(
        &self,
        addr: &str,
        tls: &TlsOptions,
        keepalive: &Keepalive,
    ) -> Result<u32, ClientError> {
        let host = match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
            _ => {
                return Err(
                    TransportError::Address(addr.to_string(), "expected host:port".into()).into(),
                )
            }
        };
        let tls = if tls.enabled() {
            Some(ClientTls::new(host, tls)?)
        } else {
            None
        };
        let wire = Wire::with_keepalive(addr, tls, *keepalive)?;
        let id = self.inner.next_conn.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.conns).insert(id, Conn::Wire(Arc::new(Mutex::new(wire))));
        Ok(id)
    }

    pub fn close_conn(&self, conn: u32) {
        let removed = lock(&self.inner.conns).remove(&conn);
        if let Some(Conn::Wire(wire)) = removed {
            let produced = lock(&wire).close(events::CONNECTION_CLOSED);
            let woken = self.produced(produced);
            self.wake(woken);
        }
    }

    fn wire(&self, conn: u32) -> Result<Arc<Mutex<Wire>>, ClientError> {
        match lock(&self.inner.conns).get(&conn) {
            Some(Conn::Wire(wire)) => Ok(wire.clone()),
            _ => Err(ClientError::UnknownConn),
        }
    }

    /// Bytes from a wire connection's socket; returns the calls that got
    /// events (their waiters are the caller's to wake).
    pub fn wire_input(&self, conn: u32, bytes: &[u8]) -> Result<Vec<u32>, ClientError> {
        let wire = self.wire(conn)?;
        let produced = lock(&wire).input(bytes);
        Ok(self.produced(produced))
    }

    /// Bytes for a wire connection's socket, swapped into `buffer` (emptied
    /// first): the connection keeps `buffer`'s allocation for its next
    /// bytes, so a steady caller allocates none.
    pub fn wire_output(&self, conn: u32, buffer: &mut Vec<u8>) -> Result<(), ClientError> {
        let wire = self.wire(conn)?;
        lock(&wire).swap_output(buffer);
        Ok(())
    }

    /// A wire connection's state for its socket's owner: whether it has
    /// bytes to send, and whether its HTTP/2 connection is over.
    pub fn wire_state(&self, conn: u32) -> Result<(bool, bool), ClientError> {
        let wire = self.wire(conn)?;
        let wire = lock(&wire);
        Ok((wire.has_output(), wire.is_over()))
    }

    /// The keepalive's clock (see [`Wire::tick`]): returns the calls woken
    /// and how many ms until the next tick is due (`None`: not before a
    /// call starts).
    pub fn wire_tick(&self, conn: u32) -> Result<(Vec<u32>, Option<u64>), ClientError> {
        let wire = self.wire(conn)?;
        let (produced, next) = lock(&wire).tick(std::time::Instant::now());
        // Rounded up, so that the next tick does not come before it is due.
        let next = next.map(|d| d.as_nanos().div_ceil(1_000_000) as u64);
        Ok((self.produced(produced), next))
    }

    /// The wire connection's socket is gone (`reason`): its calls fail with
    /// UNAVAILABLE, and a fresh HTTP/2 connection waits for a new socket.
    pub fn wire_reset(&self, conn: u32, reason: &str) -> Result<Vec<u32>, ClientError> {
        let wire = self.wire(conn)?;
        let (produced, restarted) = lock(&wire).reset(reason);
        let woken = self.produced(produced);
        if let Err(e) = restarted {
            // The caller gets the error, not the calls to wake.
            self.wake(woken);
            return Err(e.into());
        }
        Ok(woken)
    }

    /// Transport events into the module; returns the calls woken.
    fn produced(&self, produced: Produced) -> Vec<u32> {
        if produced.is_empty() {
            return Vec::new();
        }
        let mut host = lock(&self.inner.host);
        let mut woken = Vec::new();
        for (token, events) in produced {
            self.transport_over(token, &events);
            let delivered = events
                .into_iter()
                .try_for_each(|event| host.grpc_event(token, event));
            let ids = match delivered {
                Ok(()) => self.run(&mut host),
                // The rest are events of the old instance's calls, all failed.
                Err(e) => return merge(woken, self.recover(&mut host, &e)),
            };
            woken = merge(woken, ids);
        }
        woken
    }

    /// Forgets a call the transport has finished: after a close, or after
    /// the one message of a unary call.
    fn transport_over(&self, token: u32, events: &[GrpcEvent]) {
        let mut calls = lock(&self.inner.calls);
        let over = events.iter().any(|e| matches!(e, GrpcEvent::Close(..)))
            || (events.iter().any(|e| matches!(e, GrpcEvent::Message(_)))
                && calls.get(&token).is_some_and(|call| call.is_unary()));
        if over {
            calls.remove(&token);
        }
    }

    /// Starts a call on `path` (`/pkg.Service/Method`). With `body`, the
    /// request is complete (unary and server streaming); without, messages
    /// follow with [`Client::send`]. Returns the call id.
    pub fn start(
        &self,
        conn: u32,
        path: &str,
        body: Option<&[u8]>,
        options: &CallOptions,
    ) -> Result<u32, ClientError> {
        if !lock(&self.inner.conns).contains_key(&conn) {
            return Err(ClientError::UnknownConn);
        }
        check_metadata(&options.metadata)?;
        let mut conn_id = itoa::Buffer::new();
        let timeout = options
            .timeout_ms
            .map(|ms| encode_timeout(Duration::from_millis(ms.max(1))));
        let none: &[u8] = b"";
        let fixed = [
            (none, &b":method"[..], &b"POST"[..]),
            (none, b":path", path.as_bytes()),
            (none, b"content-type", b"application/json"),
            (
                none,
                UPSTREAM_HEADER.as_bytes(),
                conn_id.format(conn).as_bytes(),
            ),
        ];
        let optional = [
            timeout
                .as_deref()
                .map(|t| (none, &b"grpc-timeout"[..], t.as_bytes())),
            options
                .json_options
                .as_deref()
                .map(|j| (none, JSON_OPTIONS_HEADER.as_bytes(), j.as_bytes())),
        ];
        let metadata = options
            .metadata
            .iter()
            .map(|(k, v)| (METADATA_PREFIX.as_bytes(), k.as_bytes(), v.as_bytes()));
        let headers = HeaderBlock::from_entries(|| {
            fixed
                .iter()
                .copied()
                .chain(optional.iter().flatten().copied())
                .chain(metadata.clone())
        });
        let (id, woken) = {
            let mut host = lock(&self.inner.host);
            let id = {
                // An id Lua still holds (its end not yet closed) is busy
                // even when the module is done with it.
                let mut events = lock(&self.inner.events);
                let id = host.reserve_id(|id| events.contains_key(&id))?;
                let queue = Queue {
                    compression: options.compression,
                    ..Queue::default()
                };
                events.insert(id, queue);
                id
            };
            match host.open(id, headers, body) {
                Ok(()) => (id, self.run(&mut host)),
                // The call is among those the rebuilt instance failed.
                Err(e @ HostError::Trap(_)) => (id, self.recover(&mut host, &e)),
                Err(e) => {
                    lock(&self.inner.events).remove(&id);
                    return Err(e.into());
                }
            }
        };
        self.wake(woken);
        Ok(id)
    }

    /// One more request message (JSON) for a streaming call; `compress:
    /// false` sends it uncompressed in a compressed call.
    pub fn send(&self, id: u32, json: &[u8], compress: bool) -> Result<(), ClientError> {
        self.feed(id, json, false, compress)
    }

    /// No more request messages.
    pub fn close_send(&self, id: u32) -> Result<(), ClientError> {
        self.feed(id, b"", true, true)
    }

    fn feed(&self, id: u32, bytes: &[u8], end: bool, compress: bool) -> Result<(), ClientError> {
        if !lock(&self.inner.events).contains_key(&id) {
            return Err(ClientError::UnknownCall);
        }
        let mut framed = Vec::with_capacity(bytes.len() + 1);
        framed.extend_from_slice(bytes);
        if !end {
            // Messages are newline-delimited in the request body.
            framed.push(b'\n');
        }
        let (woken, result) = {
            let mut host = lock(&self.inner.host);
            host.send_uncompressed(!compress);
            let fed = host.body(id, &framed, end);
            host.send_uncompressed(false);
            match fed {
                Ok(()) => (self.run(&mut host), Ok(())),
                Err(e) => (self.recover(&mut host, &e), Err(e.into())),
            }
        };
        self.wake(woken);
        result
    }

    /// Whether call `id` is known (started and not closed).
    /// The request bytes a stream's transport holds that have not left for
    /// the server, when they pass `max_queued_bytes` (the bound each way):
    /// the caller waits before its next send. On a wire connection they
    /// include what waits for the socket, so that a caller sending faster
    /// than its socket writes yields to the writer (the connection's own
    /// bound, `pipe::MAX_UNSENT`, is for servers that read nothing).
    /// `Some(0)` when it may go on; `None` for a call that is over or
    /// unknown.
    pub fn send_backlog(&self, id: u32) -> Option<usize> {
        let (gate, wire) = {
            let events = lock(&self.inner.events);
            let queue = events.get(&id).filter(|q| !q.ended)?;
            (queue.gate.clone(), queue.wire)
        };
        let mut unsent = gate.map_or(0, |gate| gate.unsent());
        // Taken apart from the events lock: the wire's drive takes that.
        if let Some(Conn::Wire(wire)) =
            wire.and_then(|conn| lock(&self.inner.conns).get(&conn).cloned())
        {
            unsent = unsent.saturating_add(lock(&wire).output_len());
        }
        Some(if unsent > self.max_queued() {
            unsent
        } else {
            0
        })
    }

    pub fn has_call(&self, id: u32) -> bool {
        lock(&self.inner.events).contains_key(&id)
    }

    /// The call's next event, if one has arrived.
    pub fn next_event(&self, id: u32) -> Option<Event> {
        self.take_event(id).0
    }

    /// [`Client::next_event`], and the wire connection that taking it set
    /// going again (its socket may have bytes to send: window updates).
    pub fn take_event(&self, id: u32) -> (Option<Event>, Option<u32>) {
        let cap = self.max_queued();
        let (event, wire) = {
            let mut events = lock(&self.inner.events);
            let Some(queue) = events.get_mut(&id) else {
                return (None, None);
            };
            match queue.pop(cap) {
                (event, true) => (event, queue.wire),
                (event, false) => (event, None),
            }
        };
        if let Some(conn) = wire {
            self.resume_wire(conn);
        }
        (event, wire)
    }

    /// Runs a wire connection's tasks after a gate opened (the tonic
    /// transport's tasks are woken on the runtime by the gate itself).
    fn resume_wire(&self, conn: u32) {
        let Ok(wire) = self.wire(conn) else { return };
        let produced = lock(&wire).poll();
        let woken = self.produced(produced);
        self.wake(woken);
    }

    /// Ends a call early or forgets a finished one; the module cancels
    /// whatever still runs.
    pub fn close(&self, id: u32) {
        match lock(&self.inner.events).remove(&id) {
            // Unknown, or the module finished it already: nothing to cancel.
            None | Some(Queue { ended: true, .. }) => return,
            Some(_) => {}
        }
        let woken = {
            let mut host = lock(&self.inner.host);
            match host.finish(id) {
                Ok(()) => self.run(&mut host),
                Err(e) => self.recover(&mut host, &e),
            }
        };
        self.wake(woken);
    }

    /// Wakes the waiters of these calls; called with the module unlocked,
    /// so that a woken Lua thread never waits for the mutex.
    fn wake(&self, ids: Vec<u32>) {
        for id in ids {
            (self.inner.wake)(id);
        }
    }

    /// Carries out what the module asked for, until it asks for nothing
    /// more; returns the calls that got events.
    fn run(&self, host: &mut ProxyHost) -> Vec<u32> {
        let mut outputs = host.take_outputs();
        let mut pending: VecDeque<(u32, GrpcEvent)> = VecDeque::new();
        let mut woken = Vec::new();
        loop {
            if let Err(e) = self.deliver(host, &mut outputs, &mut woken) {
                return merge(woken, self.recover(host, &e));
            }
            for command in std::mem::take(&mut outputs.commands) {
                self.command(command, &mut pending);
            }
            let Some((token, event)) = pending.pop_front() else {
                break;
            };
            // A wire call may have ended as it started (its connection
            // is over): forgotten here, as the runtime's are by `produced`.
            self.transport_over(token, std::slice::from_ref(&event));
            match host.grpc_event(token, event) {
                Ok(()) => outputs = host.take_outputs(),
                Err(e) => return merge(woken, self.recover(host, &e)),
            }
        }
        self.start_ticks(host.tick_ms());
        woken
    }

    fn deliver(
        &self,
        host: &mut ProxyHost,
        outputs: &mut Outputs,
        woken: &mut Vec<u32>,
    ) -> Result<(), HostError> {
        for (id, json) in std::mem::take(&mut outputs.messages) {
            self.push(id, Event::Message(json), woken);
        }
        for (id, reply) in std::mem::take(&mut outputs.replies) {
            self.push(id, Event::End(reply), woken);
            // The exchange is over, as after a local reply in Envoy.
            host.finish(id)?;
            let more = host.take_outputs();
            outputs.commands.extend(more.commands);
        }
        Ok(())
    }

    /// `result`, after rebuilding the instance if it was a trap, and the
    /// calls that rebuilding woke: the caller wakes them once the module
    /// is unlocked, so that no woken thread waits for it.
    fn checked<T>(
        &self,
        host: &mut ProxyHost,
        result: Result<T, HostError>,
    ) -> (Result<T, HostError>, Vec<u32>) {
        let woken = match &result {
            Err(e @ HostError::Trap(_)) => self.recover(host, e),
            _ => Vec::new(),
        };
        (result, woken)
    }

    /// A trap leaves the instance in a state nothing can trust (a borrow
    /// held, a map half written), so every later call would fail: it is
    /// replaced by a fresh instance with the same configuration, and every
    /// call it was running ends with INTERNAL. Returns the calls woken.
    fn recover(&self, host: &mut ProxyHost, error: &HostError) -> Vec<u32> {
        eprintln!(
            "[grpc-wasm] {error}; the module instance is rebuilt and its calls fail with INTERNAL"
        );
        self.abandon_transports();
        let restarted = host.restart().and_then(|()| {
            let config = self.config();
            host.configure(config.as_bytes())
        });
        if let Err(e) = restarted {
            eprintln!("[grpc-wasm] the rebuilt module instance failed: {e}");
        }
        let reply = trapped(error);
        let mut woken = Vec::new();
        for (id, queue) in lock(&self.inner.events).iter_mut() {
            if !queue.ended {
                queue.ended = true;
                queue.events.push_back(Event::End(reply.clone()));
                woken.push(*id);
            }
        }
        woken
    }

    /// Stops the transport side of every call: their tokens belonged to
    /// the old instance.
    fn abandon_transports(&self) {
        let calls: Vec<Box<dyn RunningCall>> = lock(&self.inner.calls)
            .drain()
            .map(|(_, call)| call)
            .collect();
        for call in calls {
            // Whatever else it produced belongs to failed calls too.
            let _ = call.cancel();
        }
    }

    fn push(&self, id: u32, event: Event, woken: &mut Vec<u32>) {
        let cap = self.max_queued();
        if let Some(queue) = lock(&self.inner.events).get_mut(&id) {
            queue.push(event, cap);
            if !woken.contains(&id) {
                woken.push(id);
            }
        }
    }

    fn command(&self, command: GrpcCommand, pending: &mut VecDeque<(u32, GrpcEvent)>) {
        let produced = match command {
            GrpcCommand::Call {
                token,
                mut target,
                message,
                timeout_ms,
                context,
            } => {
                target.compression = self.compression_of(context);
                self.start_call(token, target, |conn, call| {
                    conn.transport().unary(call, message, timeout_ms)
                })
            }
            GrpcCommand::Stream {
                token,
                mut target,
                context,
            } => {
                target.compression = self.compression_of(context);
                let conn_id = target.upstream.parse().ok();
                self.start_call(token, target, |conn, call| {
                    // A wire's tasks run when the caller drives them, so
                    // the one whose gate opens is driven then.
                    let wire = matches!(conn, Conn::Wire(_)).then_some(conn_id).flatten();
                    conn.transport().stream(call, self.gate(context, wire))
                })
            }
            GrpcCommand::Send {
                token,
                message,
                compress,
            } => self.on_call(token, |c| c.send(message, compress)),
            GrpcCommand::Close { token } => self.on_call(token, |c| c.close_send()),
            GrpcCommand::Cancel { token } => match lock(&self.inner.calls).remove(&token) {
                Some(call) => call.cancel(),
                None => Vec::new(),
            },
        };
        queue(produced, pending);
    }

    /// Starts call `token` on its target's connection with `start`; a
    /// connection that is gone ends the call UNAVAILABLE.
    fn start_call(
        &self,
        token: u32,
        target: GrpcTarget,
        start: impl FnOnce(&Conn, NewCall<'_>) -> Started,
    ) -> Produced {
        let Some(conn) = self.conn(&target.upstream) else {
            return vec![(token, vec![events::connection_closed()])];
        };
        let call = NewCall {
            token,
            target,
            runtime: self.inner.runtime.handle(),
            sink: &self.inner.sink,
        };
        let (running, produced) = start(&conn, call);
        lock(&self.inner.calls).insert(token, running);
        produced
    }

    /// `f` on a running call; a call its transport finished has nothing
    /// more to do.
    fn on_call(&self, token: u32, f: impl FnOnce(&mut dyn RunningCall) -> Produced) -> Produced {
        match lock(&self.inner.calls).get_mut(&token) {
            Some(call) => f(call.as_mut()),
            None => Vec::new(),
        }
    }

    /// The gate of the stream that call `context` opened (a fresh one that
    /// nothing closes if the call is gone).
    fn gate(&self, context: u32, wire: Option<u32>) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        if let Some(queue) = lock(&self.inner.events).get_mut(&context) {
            queue.gate = Some(gate.clone());
            queue.wire = wire;
        }
        gate
    }

    /// How call `context`'s caller wants its request compressed.
    fn compression_of(&self, context: u32) -> Compression {
        lock(&self.inner.events)
            .get(&context)
            .map(|queue| queue.compression)
            .unwrap_or_default()
    }

    fn conn(&self, upstream: &str) -> Option<Conn> {
        let id: u32 = upstream.parse().ok()?;
        lock(&self.inner.conns).get(&id).cloned()
    }

    /// The module's ticks (stream deadlines), once it asks for them.
    fn start_ticks(&self, period_ms: u32) {
        if period_ms == 0 || self.inner.ticking.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        self.inner.runtime.spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(u64::from(period_ms)));
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                let woken = {
                    let mut host = lock(&client.inner.host);
                    match host.tick() {
                        Ok(()) => client.run(&mut host),
                        Err(e) => client.recover(&mut host, &e),
                    }
                };
                client.wake(woken);
            }
        });
    }
}

/// Transport events, on the runtime thread: into the module, then out. It
/// holds the client weakly, so that calls still running never keep a
/// dropped client alive.
fn sink(weak: std::sync::Weak<Inner>) -> Sink {
    Arc::new(move |token, events: Vec<GrpcEvent>| {
        let Some(inner) = weak.upgrade() else { return };
        let client = Client { inner };
        let woken = client.produced(vec![(token, events)]);
        client.wake(woken);
    })
}

/// Events a wire connection produced while the module was running: they
/// enter it in order, after the command that caused them.
fn queue(produced: Produced, pending: &mut VecDeque<(u32, GrpcEvent)>) {
    for (token, events) in produced {
        pending.extend(events.into_iter().map(|event| (token, event)));
    }
}

/// Metadata by the core's one rule (`grpc_wasm::metadata::check_entry`),
/// for every caller, `resty.ffi.grpc` included: it checks only types.
fn check_metadata(metadata: &[(String, String)]) -> Result<(), ClientError> {
    for (key, value) in metadata {
        grpc_wasm::metadata::check_entry(key, value.as_bytes())?;
    }
    Ok(())
}

/// Two lists of woken calls as one, each call once.
fn merge(mut woken: Vec<u32>, more: Vec<u32>) -> Vec<u32> {
    for id in more {
        if !woken.contains(&id) {
            woken.push(id);
        }
    }
    woken
}

/// The end of a call whose instance trapped, as the module itself reports
/// failures: a `google.rpc.Status` body and the status headers.
fn trapped(error: &HostError) -> LocalReply {
    let message = format!(
        "the grpc-wasm module failed ({}); its instance was rebuilt and this call was lost",
        error.to_string().lines().next().unwrap_or_default()
    );
    let body = serde_json::json!({"code": 13, "message": message}).to_string();
    let none: &[u8] = b"";
    let headers = [
        (none, &b"grpc-status"[..], &b"13"[..]),
        (none, b"grpc-status-name", b"INTERNAL"),
        (none, b"content-type", b"application/json"),
    ];
    LocalReply {
        http_status: 500,
        body: body.into_bytes(),
        headers: HeaderBlock::from_entries(|| headers.iter().copied()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of the real module with helloworld.proto loaded: the
    /// module named by `GRPC_WASM_MODULE` (as `make unit` sets it), else
    /// `make wasm`'s. No module fails the test: it never passes untested.
    pub(crate) fn client() -> Client {
        let path = std::env::var("GRPC_WASM_MODULE").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc_wasm.wasm").to_string()
        });
        let wasm = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("cannot read the module {path} ({e}): run `make wasm`, or set GRPC_WASM_MODULE")
        });
        let cache = crate::host::cache::default_dir();
        let client = Client::new(&wasm, Some(&cache), Arc::new(|_| {})).expect("the module loads");
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/helloworld.proto");
        client
            .load_file(&proto, &[])
            .expect("helloworld.proto loads");
        client
    }

    /// A call that stays in flight: a stream on a connection no socket feeds.
    fn in_flight(client: &Client, conn: u32) -> u32 {
        client
            .start(
                conn,
                "/helloworld.Greeter/SayHello",
                None,
                &CallOptions::default(),
            )
            .expect("the call starts")
    }

    #[test]
    fn call_ids_stay_positive_and_never_reuse_a_held_id_across_the_wrap() {
        let client = client();
        let conn = dead_conn(&client);
        let max = i32::MAX as u32;
        lock(&client.inner.host).set_last_id(max - 2);
        let ids: Vec<u32> = (0..4).map(|_| in_flight(&client, conn)).collect();
        assert_eq!(ids, [max - 1, max, 2, 3]);
        // Counting over ids still held skips them.
        lock(&client.inner.host).set_last_id(max - 2);
        assert_eq!(in_flight(&client, conn), 4);
        // A closed call's id is free again.
        client.close(ids[0]);
        lock(&client.inner.host).set_last_id(max - 2);
        assert_eq!(in_flight(&client, conn), max - 1);
    }

    /// The call's end: its grpc-status and its status message.
    fn end(client: &Client, id: u32) -> (String, String) {
        match client.next_event(id) {
            Some(Event::End(reply)) => {
                let code = reply
                    .headers
                    .get("grpc-status")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
                let message = body["message"].as_str().unwrap_or_default().to_string();
                (code, message)
            }
            other => panic!("expected the end of call {id}, got {other:?}"),
        }
    }

    const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";
    const LOST: &str = "the grpc-wasm module failed (the wasm module trapped: wasm trap: wasm \
                        `unreachable` instruction executed); its instance was rebuilt and this \
                        call was lost";

    /// Runs `f` with the module's memory capped at its size: whatever
    /// must grow it fails, and the module aborts (a trap), as on any
    /// allocation failure.
    fn with_memory_capped<T>(client: &Client, f: impl FnOnce() -> T) -> T {
        {
            let mut host = lock(&client.inner.host);
            let size = host.memory_size();
            host.limit_memory(Some(size));
        }
        let result = f();
        lock(&client.inner.host).limit_memory(None);
        result
    }

    /// A connection whose socket nobody drives: its calls stay in flight.
    fn dead_conn(client: &Client) -> u32 {
        client
            .connect_wire("127.0.0.1:1", &TlsOptions::default(), &Keepalive::default())
            .unwrap()
    }

    /// Starts a call the module cannot take: its body must grow the
    /// capped memory.
    fn trapping_call(client: &Client, conn: u32) -> u32 {
        let big = format!(r#"{{"name":"{}"}}"#, "x".repeat(2 << 20));
        let options = CallOptions::default();
        with_memory_capped(client, || {
            client.start(conn, SAY_HELLO, Some(big.as_bytes()), &options)
        })
        .unwrap()
    }

    /// The fresh instance has the protos: the module itself checks this.
    fn assert_serving(client: &Client, conn: u32) {
        let later = client
            .start(
                conn,
                SAY_HELLO,
                Some(br#"{"name":5}"#),
                &CallOptions::default(),
            )
            .unwrap();
        let refused = "name: expected string, got number";
        assert_eq!(end(client, later), ("3".to_string(), refused.to_string()));
        client.close(later);
    }

    #[test]
    fn calls_on_a_connection_that_is_over_end_unavailable_and_leave_nothing_behind() {
        let client = client();
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/route_guide.proto");
        client.load_file(&proto, &[]).unwrap();
        let conn = dead_conn(&client);
        // A server that speaks no HTTP/2 ends the connection.
        client
            .wire_input(conn, b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .unwrap();
        assert!(client.wire_state(conn).unwrap().1, "the connection is over");
        let calls = [
            (SAY_HELLO, Some(&br#"{"name":"a"}"#[..])),
            ("/routeguide.RouteGuide/RouteChat", None),
        ];
        for (path, body) in calls {
            let id = client
                .start(conn, path, body, &CallOptions::default())
                .unwrap();
            let closed = ("14".to_string(), events::CONNECTION_CLOSED.to_string());
            assert_eq!(end(&client, id), closed, "{path}");
            client.close(id);
        }
        // Their transport ended them as they started: nothing of theirs
        // stays behind, however many such calls come.
        assert_eq!(lock(&client.inner.calls).len(), 0);
    }

    #[test]
    fn calls_that_end_leave_no_token_behind() {
        let client = client();
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/route_guide.proto");
        client.load_file(&proto, &[]).unwrap();
        let conn = dead_conn(&client);
        let options = CallOptions::default();
        let id = client
            .start(conn, SAY_HELLO, Some(br#"{"name":"a"}"#), &options)
            .unwrap();
        let stream = client
            .start(conn, "/routeguide.RouteGuide/RouteChat", None, &options)
            .unwrap();
        let tokens: Vec<u32> = lock(&client.inner.calls)
            .iter()
            .filter(|(_, call)| call.is_unary())
            .map(|(token, _)| *token)
            .collect();
        assert_eq!(tokens.len(), 1);
        assert_eq!(lock(&client.inner.host).live_tokens(), 2);
        // A unary call that succeeds ends with its message, no close after
        // it (Envoy's order): every such call held its token for good, and
        // the host's set of them grew for the worker's life (make soak).
        let reply = b"\x0a\x05hi a!".to_vec();
        let woken = client.produced(
            tokens
                .iter()
                .map(|&token| {
                    let answer = events::unary_answer(
                        HeaderBlock::default(),
                        HeaderBlock::default(),
                        vec![reply.clone()],
                    );
                    (token, answer)
                })
                .collect(),
        );
        assert!(woken.contains(&id), "{woken:?}");
        assert_eq!(end(&client, id), ("0".to_string(), "hi a!".to_string()));
        client.close(id);
        // The stream has not ended: its token stays held.
        assert_eq!(lock(&client.inner.host).live_tokens(), 1);
        client.close(stream);
        assert_eq!(lock(&client.inner.host).live_tokens(), 0);
    }

    #[test]
    fn closing_a_connection_ends_its_calls_unavailable_and_later_ones_too() {
        let client = client();
        let conn = dead_conn(&client);
        let running = in_flight(&client, conn);
        client.send(running, br#"{"name":"a"}"#, true).unwrap();
        client.close_send(running).unwrap();
        assert_eq!(lock(&client.inner.calls).len(), 1);
        client.close_conn(conn);
        let closed = ("14".to_string(), events::CONNECTION_CLOSED.to_string());
        assert_eq!(end(&client, running), closed);
        assert_eq!(lock(&client.inner.calls).len(), 0);
        assert!(matches!(
            client.start(conn, SAY_HELLO, Some(b"{}"), &CallOptions::default()),
            Err(ClientError::UnknownConn)
        ));
        client.close(running);
    }

    #[test]
    fn a_trap_rebuilds_the_instance_and_fails_its_calls_with_internal() {
        let client = client();
        let conn = dead_conn(&client);
        let waiting = in_flight(&client, conn);
        let id = trapping_call(&client, conn);
        assert_eq!(end(&client, id), ("13".to_string(), LOST.to_string()));
        assert_eq!(end(&client, waiting), ("13".to_string(), LOST.to_string()));
        assert_eq!(client.next_event(waiting), None);
        assert_serving(&client, conn);
        client.close(id);
        client.close(waiting);
    }

    #[test]
    fn a_load_that_traps_the_module_leaves_what_was_loaded_as_it_was() {
        let client = client();
        let conn = dead_conn(&client);
        // The configuration must grow the module's memory; it cannot.
        let result =
            with_memory_capped(&client, || client.load_descriptor_set(&vec![0x0a; 2 << 20]));
        assert!(
            matches!(result, Err(ClientError::Host(HostError::Trap(_)))),
            "{result:?}"
        );
        // The rebuilt instance took the set from before the load: it
        // serves the files loaded then.
        assert_serving(&client, conn);
    }

    #[test]
    fn a_refused_load_leaves_the_module_serving_what_was_loaded() {
        let client = client();
        let conn = dead_conn(&client);
        let result = client.load_descriptor_set(b"\xff");
        assert!(matches!(result, Err(ClientError::Host(_))), "{result:?}");
        assert_serving(&client, conn);
        // Nothing of the refused set is kept: the next load does not carry it.
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protos/helloworld.proto");
        client.load_file(&proto, &[]).unwrap();
        assert_serving(&client, conn);
    }

    #[test]
    fn traps_under_load_end_every_call_in_flight_and_the_instance_keeps_serving() {
        let client = client();
        let conn = dead_conn(&client);
        for _ in 0..10 {
            let waiting: Vec<u32> = (0..200).map(|_| in_flight(&client, conn)).collect();
            let id = trapping_call(&client, conn);
            for &call in waiting.iter().chain([&id]) {
                assert_eq!(end(&client, call), ("13".to_string(), LOST.to_string()));
                assert_eq!(client.next_event(call), None);
                client.close(call);
            }
            assert_serving(&client, conn);
        }
        // Ten traps leave nothing behind on the host's side either.
        assert!(lock(&client.inner.events).is_empty());
        assert!(lock(&client.inner.calls).is_empty());
    }

    #[test]
    fn a_queue_at_its_cap_closes_its_gate_and_taking_below_it_opens_it() {
        let gate = Arc::new(Gate::default());
        let mut queue = Queue {
            gate: Some(gate.clone()),
            ..Queue::default()
        };
        queue.push(Event::Message(vec![b'x'; 6]), 10);
        assert!(!gate.is_closed());
        queue.push(Event::Message(vec![b'y'; 6]), 10);
        assert!(gate.is_closed());
        assert_eq!(queue.bytes, 12);
        assert_eq!(queue.pop(10), (Some(Event::Message(vec![b'x'; 6])), true));
        assert!(!gate.is_closed());
        // Already open: nothing to resume.
        assert_eq!(queue.pop(10), (Some(Event::Message(vec![b'y'; 6])), false));
        assert_eq!((queue.bytes, queue.pop(10)), (0, (None, false)));
    }

    #[test]
    fn metadata_that_could_smuggle_entries_is_refused() {
        let ok = [("x-id".to_string(), "7".to_string())];
        assert!(check_metadata(&ok).is_ok());
        let nul = [("a".to_string(), "x\0authorization\0Bearer x".to_string())];
        let crlf = [("a".to_string(), "x\r\nauthorization: Bearer x".to_string())];
        let key = [("a\0b".to_string(), "x".to_string())];
        let message = |m: &[(String, String)]| check_metadata(m).unwrap_err().to_string();
        let control = "metadata value of 'a' is not printable ASCII (0x20-0x7E: no NUL, CR, LF or other control character); binary values need a key ending in -bin";
        assert_eq!(message(&nul), control);
        assert_eq!(message(&crlf), control);
        assert_eq!(
            message(&key),
            "invalid metadata key 'a?b': only letters, digits, '-', '_' and '.'"
        );
    }
}
