//! A connection whose socket belongs to the caller: HTTP/2 (h2) and TLS
//! (rustls) run here, on the caller's thread, and the caller moves the
//! bytes (in nginx, a cosocket). Nothing waits on another thread, so a call
//! costs no thread hop; the tonic transport costs two (into its runtime and
//! back to nginx's event loop).
//!
//! h2 is driven by a small executor of our own: the connection and each
//! call are futures, polled when their waker fired. No runtime is needed:
//! h2 only reads and writes, and here reads come from [`Wire::input`] and
//! writes land in a buffer that [`Wire::take_output`] hands back.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use grpc_wasm::framing::{encode_frame, Compression, FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE};
use grpc_wasm::timeout::encode_timeout;
use grpc_wasm::{Code, Status};
use h2::client::SendRequest;
use h2::{Ping, PingPong};
use rustc_hash::FxHashMap as HashMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::gate::Gate;
use super::tls::ClientTls;
use super::{Keepalive, CONNECTION_WINDOW, REMEMBERED_RESETS};
use crate::call::events::{self, close, close_as};
use crate::call::{GrpcEvent, GrpcTarget, HeaderBlock};
use crate::sync::lock;

/// What a connection's calls produced: the call's token and its events.
pub type Produced = Vec<(u32, Vec<GrpcEvent>)>;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The id of the connection's own task; calls use their tokens.
const CONNECTION: u32 = 0;
/// Why a TLS connection fails when its server goes on after closing it.
const AFTER_CLOSE_NOTIFY: &str = "TLS: the server sent bytes after its close_notify";

/// The bytes between h2 and the socket, with TLS in between when enabled.
#[derive(Default)]
struct Pipe {
    tls: Option<rustls::ClientConnection>,
    /// Plaintext for h2 to read.
    inbound: BytesMut,
    /// Bytes for the socket.
    outbound: Vec<u8>,
    /// The socket is gone: h2 reads end-of-file.
    eof: bool,
    reader: Option<Waker>,
}

impl Pipe {
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        match &mut self.tls {
            None => self.inbound.extend_from_slice(bytes),
            Some(tls) => {
                while !bytes.is_empty() {
                    // After the peer's close_notify rustls takes nothing
                    // more (Ok(0)); looping on would spin the caller's
                    // thread forever.
                    if tls.read_tls(&mut bytes).map_err(|e| e.to_string())? == 0 {
                        return Err(AFTER_CLOSE_NOTIFY.into());
                    }
                    let state = tls.process_new_packets().map_err(|e| format!("TLS: {e}"))?;
                    let mut plain = [0u8; 16384];
                    loop {
                        match tls.reader().read(&mut plain) {
                            Ok(0) => break,
                            Ok(n) => self.inbound.extend_from_slice(&plain[..n]),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                            Err(e) => return Err(format!("TLS: {e}")),
                        }
                    }
                    if state.peer_has_closed() {
                        // A clean TLS end is the end of the stream for h2.
                        self.eof = true;
                        if !bytes.is_empty() {
                            return Err(AFTER_CLOSE_NOTIFY.into());
                        }
                    }
                }
                // Handshake answers, alerts.
                while tls.wants_write() {
                    tls.write_tls(&mut self.outbound)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        match &mut self.tls {
            None => self.outbound.extend_from_slice(data),
            Some(tls) => {
                // rustls holds plaintext written before the handshake ends.
                tls.writer().write_all(data)?;
                while tls.wants_write() {
                    tls.write_tls(&mut self.outbound)?;
                }
            }
        }
        Ok(())
    }
}

/// h2's end of the pipe.
#[derive(Clone)]
struct PipeIo(Arc<Mutex<Pipe>>);

impl AsyncRead for PipeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut pipe = lock(&self.0);
        if !pipe.inbound.is_empty() {
            let n = pipe.inbound.len().min(buf.remaining());
            buf.put_slice(&pipe.inbound[..n]);
            pipe.inbound.advance(n);
            return Poll::Ready(Ok(()));
        }
        if pipe.eof {
            return Poll::Ready(Ok(()));
        }
        pipe.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for PipeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(lock(&self.0).write(data).map(|()| data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Marks a task as ready to poll.
struct TaskWaker {
    id: u32,
    ready: Arc<Mutex<VecDeque<u32>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut ready = lock(&self.ready);
        if !ready.contains(&self.id) {
            ready.push_back(self.id);
        }
    }
}

/// A call's outgoing half, shared between [`Wire`]'s methods and its task.
#[derive(Default)]
struct Outbox {
    messages: VecDeque<Bytes>,
    closed: bool,
    task: Option<Waker>,
}

/// Events a task produced, taken out after each drive.
type Events = Arc<Mutex<Produced>>;

/// What the connection knows of its server being there (see [`Keepalive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    /// Our first PING, sent with the handshake, is not answered yet; the
    /// clock runs from the first tick (the socket is up).
    Handshake(Option<Instant>),
    /// Answered; the server was last heard from then.
    Heard(Instant),
    /// A keepalive PING is out since then.
    Pinging(Instant),
}

pub struct Wire {
    /// The scheme and authority of every request, parsed once.
    origin: Result<(http::uri::Scheme, http::uri::Authority), String>,
    tls: Option<ClientTls>,
    pipe: Arc<Mutex<Pipe>>,
    send: Option<SendRequest<Bytes>>,
    tasks: HashMap<u32, Task>,
    wakers: HashMap<u32, Waker>,
    ready: Arc<Mutex<VecDeque<u32>>>,
    outboxes: HashMap<u32, Arc<Mutex<Outbox>>>,
    events: Events,
    /// Why the HTTP/2 connection ended, once it has.
    ended: Arc<Mutex<Option<String>>>,
    keepalive: Keepalive,
    ping: Option<PingPong>,
    liveness: Liveness,
}

impl Wire {
    /// A connection to `authority` (host:port, as in the `:authority`
    /// header), with TLS when `tls` is given. Its first bytes (the HTTP/2
    /// preface, or the TLS hello) are ready in [`Wire::take_output`].
    pub fn new(authority: &str, tls: Option<ClientTls>) -> Result<Wire, String> {
        Wire::with_keepalive(authority, tls, Keepalive::default())
    }

    /// [`Wire::new`] with its own keepalive and handshake bounds, enforced by
    /// [`Wire::tick`].
    pub fn with_keepalive(
        authority: &str,
        tls: Option<ClientTls>,
        keepalive: Keepalive,
    ) -> Result<Wire, String> {
        let mut wire = Wire {
            origin: origin(authority, tls.is_some()),
            tls,
            pipe: Arc::default(),
            send: None,
            tasks: HashMap::default(),
            wakers: HashMap::default(),
            ready: Arc::default(),
            outboxes: HashMap::default(),
            events: Arc::default(),
            ended: Arc::default(),
            keepalive,
            ping: None,
            liveness: Liveness::Handshake(None),
        };
        wire.restart()?;
        // The handshake's PING leaves with the preface (nothing to report).
        let _ = wire.drive();
        Ok(wire)
    }

    /// A fresh HTTP/2 connection (the socket was replaced); calls that were
    /// running fail with UNAVAILABLE and `reason`.
    pub fn reset(&mut self, reason: &str) -> Result<Produced, String> {
        let mut produced = self.fail_all(reason);
        self.restart()?;
        produced.append(&mut self.drive());
        Ok(produced)
    }

    fn restart(&mut self) -> Result<(), String> {
        let mut pipe = Pipe::default();
        if let Some(tls) = &self.tls {
            pipe.tls = Some(tls.connection()?);
        }
        self.pipe = Arc::new(Mutex::new(pipe));
        let io = PipeIo(self.pipe.clone());
        // h2's budget for small DATA frames (against floods of them) is
        // left at its default, half the connection window, as hyper leaves
        // it under the runtime transport. h2 0.4.20 charges each small
        // frame that arrives for a stream this side has reset (a cancelled
        // call's frames in flight) and never refunds it, so any smaller
        // budget runs out over a connection's life: at 4 MiB, a busy conn
        // that cancelled streams ended itself (GOAWAY ENHANCE_YOUR_CALM)
        // within a minute. Memory stays bounded by each stream's window,
        // which a call's gate keeps closed while its caller holds messages.
        // Frames still in flight for a stream this side reset are ignored
        // while h2 remembers the reset; for a stream it forgot, each one
        // costs a RST_STREAM that counts against h2's lifetime limit of
        // 1,024 such resets, past which it ends the connection. h2
        // remembers 50 resets for a second by default, fewer than a busy
        // conn's cancels and deadlines make in a second.
        let mut handshake = Box::pin(
            h2::client::Builder::new()
                .max_concurrent_reset_streams(REMEMBERED_RESETS)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .handshake::<_, Bytes>(io),
        );
        // The client half of the handshake only writes, so it never waits.
        let waker = Waker::from(Arc::new(TaskWaker {
            id: CONNECTION,
            ready: self.ready.clone(),
        }));
        let (send, mut connection) = match handshake.as_mut().poll(&mut Context::from_waker(&waker))
        {
            Poll::Ready(Ok(pair)) => pair,
            Poll::Ready(Err(e)) => return Err(format!("HTTP/2 handshake: {e}")),
            Poll::Pending => return Err("HTTP/2 handshake did not complete".into()),
        };
        self.send = Some(send);
        // The server's answer to a PING sent now proves the handshake
        // done: HTTP/2 makes its SETTINGS the first frame it sends.
        self.ping = connection.ping_pong();
        if let Some(ping) = &mut self.ping {
            ping.send_ping(Ping::opaque())
                .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        }
        self.liveness = Liveness::Handshake(None);
        let ended = self.ended.clone();
        self.tasks.insert(
            CONNECTION,
            Box::pin(async move {
                let why = match connection.await {
                    Ok(()) => "the server closed the connection".to_string(),
                    Err(e) => format!("the connection failed: {e}"),
                };
                *lock(&ended) = Some(why);
            }),
        );
        self.wake(CONNECTION);
        Ok(())
    }

    /// Bytes from the socket.
    pub fn input(&mut self, bytes: &[u8]) -> Produced {
        if let Liveness::Heard(_) = self.liveness {
            self.liveness = Liveness::Heard(Instant::now());
        }
        let fed = lock(&self.pipe).feed(bytes);
        if let Err(reason) = fed {
            lock(&self.pipe).eof = true;
            let mut produced = self.fail_all(&reason);
            produced.append(&mut self.drive());
            return produced;
        }
        self.wake(CONNECTION);
        self.drive()
    }

    /// Bytes for the socket, taken.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut lock(&self.pipe).outbound)
    }

    /// [`Wire::take_output`] into `buffer` (emptied first): the two buffers
    /// trade places, so a steady caller allocates none.
    pub fn swap_output(&mut self, buffer: &mut Vec<u8>) {
        buffer.clear();
        std::mem::swap(&mut lock(&self.pipe).outbound, buffer);
    }

    pub fn has_output(&self) -> bool {
        !lock(&self.pipe).outbound.is_empty()
    }

    /// The HTTP/2 connection is over (the server closed it, or it broke):
    /// its socket should go, and [`Wire::reset`] start afresh.
    pub fn is_over(&self) -> bool {
        self.send.is_none()
    }

    /// A unary call: its one message, and its deadline, sent as
    /// `grpc-timeout` (the module enforces it, as with Envoy).
    pub fn unary(
        &mut self,
        token: u32,
        target: GrpcTarget,
        message: &[u8],
        timeout_ms: u32,
    ) -> Produced {
        self.start(token, target, Some(message), Some(timeout_ms), None)
    }

    /// A stream: messages follow with [`Wire::send`], the end with
    /// [`Wire::close_send`] (its deadline is in the module's metadata).
    /// The stream's response is read only while `gate` is open.
    pub fn stream(&mut self, token: u32, target: GrpcTarget, gate: Arc<Gate>) -> Produced {
        self.start(token, target, None, None, Some(gate))
    }

    fn start(
        &mut self,
        token: u32,
        target: GrpcTarget,
        message: Option<&[u8]>,
        timeout_ms: Option<u32>,
        gate: Option<Arc<Gate>>,
    ) -> Produced {
        let Some(send) = self.send.clone() else {
            return vec![(
                token,
                vec![close_as(Code::Unavailable, "the connection is closed")],
            )];
        };
        let request = match self.request(&target, timeout_ms) {
            Ok(request) => request,
            Err(e) => return vec![(token, vec![close_as(Code::Internal, &e)])],
        };
        let unary = message.is_some();
        let first = match message.map(frame).transpose() {
            Ok(first) => first,
            Err(e) => return vec![(token, vec![close_as(Code::Internal, &e)])],
        };
        let outbox = Arc::new(Mutex::new(Outbox {
            messages: first.into_iter().collect(),
            closed: unary,
            task: None,
        }));
        self.outboxes.insert(token, outbox.clone());
        let events = self.events.clone();
        self.tasks.insert(
            token,
            Box::pin(async move {
                let call = Call { token, unary, gate };
                let produced = run_call(send, request, outbox, &call, &events).await;
                lock(&events).push((token, produced));
            }),
        );
        self.wake(token);
        self.drive()
    }

    pub fn send(&mut self, token: u32, message: &[u8]) -> Produced {
        match frame(message) {
            Ok(framed) => self.outbox(token, |outbox| outbox.messages.push_back(framed)),
            Err(e) => {
                let mut produced = self.cancel(token);
                produced.push((token, vec![close_as(Code::Internal, &e)]));
                produced
            }
        }
    }

    pub fn close_send(&mut self, token: u32) -> Produced {
        self.outbox(token, |outbox| outbox.closed = true)
    }

    /// Ends a call at once; h2 resets its stream (RST_STREAM) as the
    /// call's halves drop.
    pub fn cancel(&mut self, token: u32) -> Produced {
        self.tasks.remove(&token);
        self.wakers.remove(&token);
        self.outboxes.remove(&token);
        self.wake(CONNECTION);
        self.drive()
    }

    pub fn is_running(&self, token: u32) -> bool {
        self.tasks.contains_key(&token)
    }

    /// Runs the tasks that are ready: after a call's gate opened.
    pub fn poll(&mut self) -> Produced {
        self.drive()
    }

    /// The keepalive's clock: sends a PING when due, and ends the
    /// connection (its calls fail UNAVAILABLE) when the server has not
    /// answered the handshake or a PING in time. Returns what that
    /// produced, and how soon to tick again (`None`: no need until a call
    /// starts or bytes come).
    pub fn tick(&mut self, now: Instant) -> (Produced, Option<Duration>) {
        if self.is_over() {
            return (Vec::new(), None);
        }
        let Keepalive {
            interval,
            timeout,
            handshake,
        } = self.keepalive;
        match self.liveness {
            Liveness::Handshake(None) => {
                self.liveness = Liveness::Handshake(Some(now));
                (Vec::new(), Some(handshake))
            }
            Liveness::Handshake(Some(since)) => match handshake.checked_sub(now - since) {
                Some(left) if !left.is_zero() => (Vec::new(), Some(left)),
                _ => (
                    self.dead(&unanswered("the HTTP/2 handshake", handshake)),
                    None,
                ),
            },
            Liveness::Pinging(sent) => match timeout.checked_sub(now - sent) {
                Some(left) if !left.is_zero() => (Vec::new(), Some(left)),
                _ => (self.dead(&unanswered("a keepalive PING", timeout)), None),
            },
            // No calls, no pings: the next call ticks at once.
            Liveness::Heard(_) if self.outboxes.is_empty() => (Vec::new(), None),
            Liveness::Heard(heard) => match interval.checked_sub(now - heard) {
                Some(left) if !left.is_zero() => (Vec::new(), Some(left)),
                _ => (self.send_ping(now), Some(timeout)),
            },
        }
    }

    fn send_ping(&mut self, now: Instant) -> Produced {
        // The only other PING of ours is the handshake's, answered by now.
        if let Some(ping) = &mut self.ping {
            if ping.send_ping(Ping::opaque()).is_ok() {
                self.liveness = Liveness::Pinging(now);
            }
        }
        self.wake(CONNECTION);
        self.drive()
    }

    /// The server is gone: the connection ends, as if it had closed.
    fn dead(&mut self, reason: &str) -> Produced {
        lock(&self.pipe).eof = true;
        self.fail_all(reason)
    }

    /// Notes the answer to our PING, if it came.
    fn poll_pong(&mut self) {
        if let Liveness::Heard(_) = self.liveness {
            return;
        }
        let Some(ping) = &mut self.ping else { return };
        // The connection's own waker: a pong arrives while it is polled.
        let waker = Waker::from(Arc::new(TaskWaker {
            id: CONNECTION,
            ready: self.ready.clone(),
        }));
        if let Poll::Ready(Ok(_)) = ping.poll_pong(&mut Context::from_waker(&waker)) {
            self.liveness = Liveness::Heard(Instant::now());
        }
    }

    fn outbox(&mut self, token: u32, f: impl FnOnce(&mut Outbox)) -> Produced {
        if let Some(outbox) = self.outboxes.get(&token) {
            let mut outbox = lock(outbox);
            f(&mut outbox);
            if let Some(waker) = outbox.task.take() {
                waker.wake();
            }
        }
        self.drive()
    }

    fn request(
        &self,
        target: &GrpcTarget,
        timeout_ms: Option<u32>,
    ) -> Result<http::Request<()>, String> {
        let (scheme, authority) = self.origin.clone()?;
        let mut path = String::with_capacity(2 + target.service.len() + target.method.len());
        path.push('/');
        path.push_str(&target.service);
        path.push('/');
        path.push_str(&target.method);
        let path = http::uri::PathAndQuery::try_from(path)
            .map_err(|e| format!("invalid method path: {e}"))?;
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(scheme);
        parts.authority = Some(authority);
        parts.path_and_query = Some(path);
        let uri = http::Uri::from_parts(parts).map_err(|e| format!("invalid method path: {e}"))?;
        let mut request = http::Request::new(());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
        headers.insert(http::header::TE, TRAILERS);
        if let Some(ms) = timeout_ms {
            let value = encode_timeout(std::time::Duration::from_millis(u64::from(ms.max(1))));
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                headers.insert(GRPC_TIMEOUT, value);
            }
        }
        events::append_metadata(headers, &target.metadata);
        Ok(request)
    }

    fn fail_all(&mut self, reason: &str) -> Produced {
        let tokens: Vec<u32> = self.outboxes.keys().copied().collect();
        self.tasks.clear();
        self.wakers.clear();
        self.outboxes.clear();
        self.send = None;
        self.ping = None;
        lock(&self.ready).clear();
        tokens
            .into_iter()
            .map(|token| (token, vec![close_as(Code::Unavailable, reason)]))
            .collect()
    }

    fn wake(&self, id: u32) {
        let mut ready = lock(&self.ready);
        if !ready.contains(&id) {
            ready.push_back(id);
        }
    }

    /// Polls every task whose waker fired, until none did.
    fn drive(&mut self) -> Produced {
        loop {
            let next = lock(&self.ready).pop_front();
            let Some(id) = next else { break };
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            // A task keeps its waker from poll to poll.
            let ready = &self.ready;
            let waker = self.wakers.entry(id).or_insert_with(|| {
                Waker::from(Arc::new(TaskWaker {
                    id,
                    ready: ready.clone(),
                }))
            });
            if task
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_ready()
            {
                self.tasks.remove(&id);
                self.wakers.remove(&id);
                self.outboxes.remove(&id);
                if id == CONNECTION {
                    let why = lock(&self.ended).take();
                    let why = why.unwrap_or_else(|| "the connection closed".into());
                    let mut produced = self.fail_all(&why);
                    produced.append(&mut std::mem::take(&mut *lock(&self.events)));
                    return produced;
                }
            }
        }
        self.poll_pong();
        std::mem::take(&mut *lock(&self.events))
    }
}

const APPLICATION_GRPC: http::HeaderValue = http::HeaderValue::from_static("application/grpc");
const TRAILERS: http::HeaderValue = http::HeaderValue::from_static("trailers");
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// The scheme and authority of a connection's requests; an address that is
/// no authority fails each call, as a bad method path does.
fn origin(authority: &str, tls: bool) -> Result<(http::uri::Scheme, http::uri::Authority), String> {
    let scheme = if tls {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    };
    let authority = http::uri::Authority::try_from(authority)
        .map_err(|e| format!("invalid address '{authority}': {e}"))?;
    Ok((scheme, authority))
}

fn unanswered(what: &str, within: Duration) -> String {
    format!(
        "the server did not answer {what} within {} ms",
        within.as_millis()
    )
}

/// One length-prefixed, uncompressed gRPC message, framed by the core.
fn frame(message: &[u8]) -> Result<Bytes, String> {
    encode_frame(message, Compression::Identity)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

fn pairs(headers: &http::HeaderMap) -> HeaderBlock {
    events::header_block(headers, None)
}

/// A call's request half: the messages its outbox gets, then the end.
struct Outgoing {
    body: h2::SendStream<Bytes>,
    outbox: Arc<Mutex<Outbox>>,
    sending: bool,
}

impl Outgoing {
    fn service(&mut self, cx: &mut Context<'_>) {
        if !self.sending {
            return;
        }
        let mut outbox = lock(&self.outbox);
        while let Some(message) = outbox.messages.pop_front() {
            if self.body.send_data(message, false).is_err() {
                // The stream is reset or gone: the response side reports why.
                self.sending = false;
                return;
            }
        }
        if outbox.closed {
            let _ = self.body.send_data(Bytes::new(), true);
            self.sending = false;
        } else {
            outbox.task = Some(cx.waker().clone());
        }
    }
}

/// What a call task needs besides its request.
struct Call {
    token: u32,
    unary: bool,
    /// A stream's backpressure: its data is taken only while this is open.
    gate: Option<Arc<Gate>>,
}

/// A call, in Envoy's order: initial metadata, then messages and trailing
/// metadata, then a close (a successful unary call: metadata, trailing
/// metadata, then its one message, and no close).
async fn run_call(
    mut send: SendRequest<Bytes>,
    request: http::Request<()>,
    outbox: Arc<Mutex<Outbox>>,
    call: &Call,
    events: &Events,
) -> Vec<GrpcEvent> {
    let Call { token, unary, .. } = *call;
    let failed = |e: h2::Error| vec![close(&super::h2_failure(&e))];
    if let Err(e) = std::future::poll_fn(|cx| send.poll_ready(cx)).await {
        return failed(e);
    }
    let (response, body) = match send.send_request(request, false) {
        Ok(pair) => pair,
        Err(e) => return failed(e),
    };
    // The request half runs beside the response, to the end of the call
    // (a bidi stream sends after the response has begun).
    let mut out = Outgoing {
        body,
        outbox,
        sending: true,
    };
    let mut response = Box::pin(response);
    let response = std::future::poll_fn(|cx| {
        out.service(cx);
        response.as_mut().poll(cx)
    });
    let response = match response.await {
        Ok(response) => response,
        Err(e) => return failed(e),
    };
    let (parts, mut recv) = response.into_parts();
    if let Some(status) = events::status_of(&parts.headers) {
        // Trailers-only: the status is all there is.
        let trailing = pairs(&parts.headers);
        if unary && status.is_ok() {
            return events::unary_answer(HeaderBlock::default(), trailing, Vec::new());
        }
        return events::ended(trailing, &status);
    }
    if parts.status != http::StatusCode::OK {
        return vec![close(&Status::from_http_status(parts.status.as_u16()))];
    }
    let initial = pairs(&parts.headers);
    let mut received = Vec::new();
    // We ask for no compression (no grpc-accept-encoding).
    let mut decoder = FrameDecoder::default();
    if unary {
        // A unary answer is one message; without a cap on the sum, a server
        // sending frame after frame would have them all held here until the
        // trailers, and the worker would run out of memory first.
        decoder.limit_total(DEFAULT_MAX_MESSAGE_SIZE);
    }
    let initial = if unary {
        Some(initial)
    } else {
        lock(events).push((token, vec![GrpcEvent::InitialMetadata(initial)]));
        None
    };
    while let Some(chunk) = std::future::poll_fn(|cx| {
        out.service(cx);
        // While the gate is closed the data stays in h2 unreleased, so the
        // server runs out of window and waits.
        if let Some(gate) = &call.gate {
            std::task::ready!(gate.poll_open(cx));
        }
        recv.poll_data(cx)
    })
    .await
    {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return failed(e),
        };
        // Taken, so given back: the gate bounds what the caller holds.
        let _ = recv.flow_control().release_capacity(chunk.len());
        decoder.push(&chunk);
        let mut complete = Vec::new();
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => complete.push(message),
                Ok(None) => break,
                // Too much (RESOURCE_EXHAUSTED) or a broken stream (INTERNAL).
                Err(e) => return vec![close(&Status::from(e))],
            }
        }
        if unary {
            received.extend(complete);
        } else if !complete.is_empty() {
            let delivered = complete.into_iter().map(GrpcEvent::Message).collect();
            lock(events).push((token, delivered));
        }
    }
    let trailers = std::future::poll_fn(|cx| {
        out.service(cx);
        recv.poll_trailers(cx)
    });
    let trailers = match trailers.await {
        Ok(trailers) => trailers.unwrap_or_default(),
        Err(e) => return failed(e),
    };
    if let Err(e) = decoder.finish() {
        return vec![close_as(Code::Internal, &e.to_string())];
    }
    let status = events::status_of(&trailers).unwrap_or_else(events::missing_status);
    let trailing = pairs(&trailers);
    if unary && status.is_ok() {
        return events::unary_answer(initial.unwrap_or_default(), trailing, received);
    }
    events::ended(trailing, &status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeter() -> GrpcTarget {
        GrpcTarget {
            upstream: "1".into(),
            service: "helloworld.Greeter".into(),
            method: "SayHello".into(),
            metadata: vec![],
        }
    }

    #[test]
    fn a_new_connection_starts_with_the_preface() {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        let out = wire.take_output();
        assert!(
            out.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            "{out:?}"
        );
        assert!(wire.take_output().is_empty());
    }

    #[test]
    fn swapped_output_is_the_same_bytes_in_a_reused_buffer() {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        let mut buffer = b"stale".to_vec();
        wire.swap_output(&mut buffer);
        assert!(buffer.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        let first = buffer.as_ptr();
        wire.swap_output(&mut buffer);
        assert!(buffer.is_empty());
        // The first buffer went back to the connection; the next swap
        // brings it back instead of allocating.
        wire.swap_output(&mut buffer);
        assert_eq!(buffer.as_ptr(), first);
    }

    #[test]
    fn a_server_that_speaks_no_http2_ends_the_connection_and_its_calls() {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        let target = greeter();
        assert!(wire.unary(3, target, b"", 500).is_empty());
        assert!(!wire.is_over());
        let produced = wire.input(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        assert!(wire.is_over());
        assert_eq!(produced.len(), 1, "{produced:?}");
        let (token, events) = &produced[0];
        assert_eq!(*token, 3);
        match &events[..] {
            [GrpcEvent::Close(14, message)] => {
                let message = String::from_utf8_lossy(message);
                assert!(message.starts_with("the connection failed: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_carry_the_deadline_and_the_metadata() {
        let wire = Wire::new("example.com:443", None).unwrap();
        let target = GrpcTarget {
            upstream: "1".into(),
            service: "pkg.Svc".into(),
            method: "Do".into(),
            metadata: vec![("x-id".into(), b"7".to_vec())],
        };
        let request = wire.request(&target, Some(250)).unwrap();
        assert_eq!(request.uri(), "http://example.com:443/pkg.Svc/Do");
        let header = |r: &http::Request<()>, name: &str| {
            r.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(header(&request, "grpc-timeout").as_deref(), Some("250000u"));
        assert_eq!(header(&request, "x-id").as_deref(), Some("7"));
        assert_eq!(header(&request, "te").as_deref(), Some("trailers"));
        let long = wire.request(&target, Some(200_000_000)).unwrap();
        assert_eq!(header(&long, "grpc-timeout").as_deref(), Some("200000S"));
        let stream = wire.request(&target, None).unwrap();
        assert_eq!(header(&stream, "grpc-timeout"), None);
    }

    #[test]
    fn a_reset_fails_running_calls() {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        let target = greeter();
        assert!(wire.unary(7, target, b"\x0a\x01x", 500).is_empty());
        assert!(wire.is_running(7));
        let produced = wire.reset("connect failed: refused").unwrap();
        assert_eq!(produced.len(), 1);
        assert_eq!(produced[0].0, 7);
        assert!(
            matches!(&produced[0].1[..], [GrpcEvent::Close(14, m)] if m == b"connect failed: refused")
        );
        assert!(!wire.is_running(7));
    }

    /// A tick's next due time, when it produced nothing.
    fn quiet((produced, next): (Produced, Option<Duration>)) -> Option<Duration> {
        assert!(produced.is_empty(), "{produced:?}");
        next
    }

    fn keepalive(interval: u64, timeout: u64, handshake: u64) -> Keepalive {
        Keepalive::from_ms(interval, timeout, handshake)
    }

    /// The frames of HTTP/2 bytes (the client preface skipped): type,
    /// flags, payload.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, Vec<u8>)> {
        if let Some(rest) = bytes.strip_prefix(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice()) {
            bytes = rest;
        }
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            out.push((bytes[3], bytes[4], bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    const PING: u8 = 6;

    /// A server's answer to what the wire sent: its SETTINGS first, then an
    /// ack of each PING.
    fn server_answer(sent: &[u8], settings: bool) -> Vec<u8> {
        let mut answer = Vec::new();
        if settings {
            answer.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        }
        for (kind, flags, payload) in frames(sent) {
            if kind == PING && flags & 1 == 0 {
                answer.extend_from_slice(&[0, 0, 8, PING, 1, 0, 0, 0, 0]);
                answer.extend_from_slice(&payload);
            }
        }
        answer
    }

    fn pings(sent: &[u8]) -> usize {
        frames(sent)
            .iter()
            .filter(|(kind, flags, _)| *kind == PING && flags & 1 == 0)
            .count()
    }

    #[test]
    fn a_server_that_never_answers_the_handshake_ends_the_connection_in_time() {
        let mut wire = Wire::with_keepalive("127.0.0.1:1", None, keepalive(0, 0, 300)).unwrap();
        // The handshake's PING leaves with the preface.
        assert_eq!(pings(&wire.take_output()), 1);
        assert!(wire.unary(3, greeter(), b"", 5000).is_empty());
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(quiet(wire.tick(t0)), Some(ms(300)));
        assert_eq!(quiet(wire.tick(t0 + ms(299))), Some(ms(1)));
        let (produced, next) = wire.tick(t0 + ms(300));
        assert_eq!(
            only_close(&produced, 3),
            (
                14,
                "the server did not answer the HTTP/2 handshake within 300 ms".to_string()
            )
        );
        assert_eq!(next, None);
        assert!(wire.is_over());
    }

    /// A wire whose server answered the handshake, with a unary call
    /// (token 3) in flight.
    fn answered(keepalive: Keepalive) -> Wire {
        let mut wire = Wire::with_keepalive("127.0.0.1:1", None, keepalive).unwrap();
        let _ = wire.tick(Instant::now());
        let sent = wire.take_output();
        assert!(wire.input(&server_answer(&sent, true)).is_empty());
        assert!(wire.unary(3, greeter(), b"", 60_000).is_empty());
        let _ = wire.take_output();
        wire
    }

    #[test]
    fn a_quiet_connection_with_calls_is_pinged_and_ends_when_the_ping_is_not_answered() {
        let mut wire = answered(keepalive(200, 300, 1000));
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // Heard just now: the PING is due an interval later.
        let (produced, next) = wire.tick(t0);
        assert!(produced.is_empty());
        assert!(
            next.is_some_and(|d| d <= ms(200) && d > ms(100)),
            "{next:?}"
        );
        assert_eq!(pings(&wire.take_output()), 0);
        assert_eq!(quiet(wire.tick(t0 + ms(200))), Some(ms(300)));
        assert_eq!(pings(&wire.take_output()), 1);
        assert_eq!(quiet(wire.tick(t0 + ms(450))), Some(ms(50)));
        let (produced, next) = wire.tick(t0 + ms(500));
        assert_eq!(
            only_close(&produced, 3),
            (
                14,
                "the server did not answer a keepalive PING within 300 ms".to_string()
            )
        );
        assert_eq!(next, None);
        assert!(wire.is_over());
    }

    #[test]
    fn an_answered_ping_keeps_the_connection() {
        let mut wire = answered(keepalive(200, 300, 1000));
        let ms = Duration::from_millis;
        let t0 = Instant::now() + ms(200);
        assert_eq!(quiet(wire.tick(t0)), Some(ms(300)));
        let sent = wire.take_output();
        assert_eq!(pings(&sent), 1);
        assert!(wire.input(&server_answer(&sent, false)).is_empty());
        // Heard from again: the next PING is an interval away, not a death.
        let (produced, next) = wire.tick(Instant::now());
        assert!(produced.is_empty());
        assert!(
            next.is_some_and(|d| d > ms(100) && d <= ms(200)),
            "{next:?}"
        );
        assert!(!wire.is_over());
    }

    #[test]
    fn a_connection_without_calls_is_not_pinged() {
        let mut wire = answered(keepalive(200, 300, 1000));
        let _ = wire.cancel(3);
        let _ = wire.take_output();
        let later = Instant::now() + Duration::from_secs(60);
        assert_eq!(quiet(wire.tick(later)), None);
        assert_eq!(pings(&wire.take_output()), 0);
        assert!(!wire.is_over());
    }

    /// A plaintext HTTP/2 server on loopback whose one answer is `frames`
    /// (a gRPC body, sent chunk by chunk) and grpc-status 0; the wire
    /// runs a unary call to it over a blocking socket from this thread
    /// until the call ends, and returns the call's events.
    fn unary_answered_with(frames: Vec<Bytes>) -> Vec<GrpcEvent> {
        unary_answered(Answer::Body(frames))
    }

    enum Answer {
        /// Headers, these DATA frames, then trailers with grpc-status 0.
        Body(Vec<Bytes>),
        /// One HEADERS frame that ends the stream with grpc-status 0.
        TrailersOnly,
    }

    fn unary_answered(answer: Answer) -> Vec<GrpcEvent> {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (socket, _) = listener.accept().unwrap();
                socket.set_nonblocking(true).unwrap();
                let socket = tokio::net::TcpStream::from_std(socket).unwrap();
                let mut conn = h2::server::handshake(socket).await.unwrap();
                let Some(Ok((_, mut respond))) = conn.accept().await else {
                    return;
                };
                // The connection's I/O runs while the answer is sent.
                let driver = tokio::spawn(async move { while conn.accept().await.is_some() {} });
                let response = http::Response::builder().header("content-type", "application/grpc");
                let frames = match answer {
                    Answer::Body(frames) => frames,
                    Answer::TrailersOnly => {
                        let response = response.header("grpc-status", "0").body(()).unwrap();
                        let _ = respond.send_response(response, true);
                        let _ = driver.await;
                        return;
                    }
                };
                let response = response.body(()).unwrap();
                let mut send = respond.send_response(response, false).unwrap();
                for frame in frames {
                    if send.send_data(frame, false).is_err() {
                        break;
                    }
                }
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                let _ = send.send_trailers(trailers);
                let _ = driver.await;
            });
        });
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut wire = Wire::new(&addr.to_string(), None).unwrap();
        let mut events: Vec<GrpcEvent> = Vec::new();
        let absorb = |produced: Produced, events: &mut Vec<GrpcEvent>| {
            for (token, mut list) in produced {
                assert_eq!(token, 5);
                events.append(&mut list);
            }
        };
        absorb(wire.unary(5, greeter(), b"", 10_000), &mut events);
        let mut buf = vec![0; 1 << 16];
        while !events
            .iter()
            .any(|e| matches!(e, GrpcEvent::Close(..) | GrpcEvent::Message(_)))
        {
            let out = wire.take_output();
            if !out.is_empty() {
                socket.write_all(&out).unwrap();
            }
            let n = socket.read(&mut buf).expect("the call did not end");
            assert!(n > 0, "the server closed the connection first");
            absorb(wire.input(&buf[..n]), &mut events);
        }
        events
    }

    fn grpc_frame(len: usize) -> Bytes {
        encode_frame(&vec![0x2a; len], Compression::Identity)
            .unwrap()
            .into()
    }

    #[test]
    fn a_unary_answer_may_hold_one_whole_message() {
        let events = unary_answered_with(vec![grpc_frame(3 << 20)]);
        match &events[..] {
            [GrpcEvent::InitialMetadata(_), GrpcEvent::TrailingMetadata(_), GrpcEvent::Message(m)] =>
            {
                assert_eq!(m.len(), 3 << 20)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_ok_unary_answer_without_a_message_ends_internal_and_alone() {
        // As the runtime transport (and `call::events::unary_answer`) has
        // it: the close alone, with no trailing metadata before it.
        for answer in [Answer::TrailersOnly, Answer::Body(Vec::new())] {
            match &unary_answered(answer)[..] {
                [GrpcEvent::Close(code, message)] => assert_eq!(
                    (*code, String::from_utf8_lossy(message).as_ref()),
                    (13, "expected one response message, got 0")
                ),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_unary_answer_of_many_messages_stops_at_the_total_cap() {
        // Ten 1 MiB messages: each within the message limit, together past
        // the 4 MiB a unary answer may hold.
        let events = unary_answered_with((0..10).map(|_| grpc_frame(1 << 20)).collect());
        match &events[..] {
            [GrpcEvent::Close(code, message)] => {
                assert_eq!(
                    (*code, String::from_utf8_lossy(message).as_ref()),
                    (
                        8,
                        "grpc: received messages larger than max in total (limit 4194304 bytes)"
                    )
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// A TLS server in this thread (rustls, a fresh self-signed
    /// certificate) and a wire connection to it, handshake done.
    fn tls_pair() -> (Wire, rustls::ServerConnection) {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(key.cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.signing_key.serialize_der())),
            )
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let mut server = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        let options = crate::transport::TlsOptions {
            ca: Some(key.cert.pem()),
            ..Default::default()
        };
        let tls = ClientTls::new("localhost", &options).unwrap();
        let mut wire = Wire::new("localhost:443", Some(tls)).unwrap();
        for _ in 0..10 {
            let out = wire.take_output();
            server.read_tls(&mut &out[..]).unwrap();
            server.process_new_packets().unwrap();
            let mut back = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut back).unwrap();
            }
            assert!(wire.input(&back).is_empty());
            if !server.is_handshaking() && !wire.has_output() {
                break;
            }
        }
        assert!(!server.is_handshaking());
        (wire, server)
    }

    /// `f` on another thread, which must end within 5 s.
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("the wire did not return (spinning)")
    }

    fn only_close(produced: &Produced, token: u32) -> (u32, String) {
        assert_eq!(produced.len(), 1, "{produced:?}");
        assert_eq!(produced[0].0, token);
        match &produced[0].1[..] {
            [GrpcEvent::Close(code, message)] => (*code, String::from_utf8_lossy(message).into()),
            other => panic!("{other:?}"),
        }
    }

    fn close_notify(server: &mut rustls::ServerConnection) -> Vec<u8> {
        server.send_close_notify();
        let mut bytes = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut bytes).unwrap();
        }
        bytes
    }

    #[test]
    fn a_tls_close_notify_ends_the_connection_and_its_calls() {
        let (mut wire, mut server) = tls_pair();
        assert!(wire.unary(3, greeter(), b"", 500).is_empty());
        let bytes = close_notify(&mut server);
        let (produced, over) = within_5s(move || {
            let produced = wire.input(&bytes);
            (produced, wire.is_over())
        });
        let closed = (14, "the server closed the connection".to_string());
        assert_eq!(only_close(&produced, 3), closed);
        assert!(over);
    }

    #[test]
    fn bytes_after_a_tls_close_notify_in_the_same_read_fail_the_connection() {
        let (mut wire, mut server) = tls_pair();
        assert!(wire.unary(3, greeter(), b"", 500).is_empty());
        // More than rustls takes in one read_tls.
        let mut bytes = close_notify(&mut server);
        bytes.extend(std::iter::repeat_n(0x17, 100_000));
        let (produced, over) = within_5s(move || {
            let produced = wire.input(&bytes);
            (produced, wire.is_over())
        });
        assert_eq!(
            only_close(&produced, 3),
            (14, AFTER_CLOSE_NOTIFY.to_string())
        );
        assert!(over);
    }

    #[test]
    fn bytes_after_a_tls_close_notify_in_a_later_read_return_at_once() {
        let (mut wire, mut server) = tls_pair();
        let bytes = close_notify(&mut server);
        assert!(wire.input(&bytes).is_empty());
        assert!(wire.is_over());
        let (produced, over) = within_5s(move || {
            let produced = wire.input(b"\x17\x03\x03\x00\x01x");
            (produced, wire.is_over())
        });
        assert!(produced.is_empty(), "{produced:?}");
        assert!(over);
    }
}
