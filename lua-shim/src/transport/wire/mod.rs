//! A connection whose socket belongs to the caller: HTTP/2 (h2) and TLS
//! (rustls) run here, on the caller's thread, and the caller moves the
//! bytes (in nginx, a cosocket). Nothing waits on another thread, so a call
//! costs no thread hop; the tonic transport costs two (into its runtime and
//! back to nginx's event loop).
//!
//! Three parts, each in its module: the [`pipe`] between h2 and the
//! socket (with TLS), the [`executor`] that polls the connection's futures
//! on the caller's thread, and each [`call`]'s task. This module is the
//! connection: its handshake, keepalive, and the calls it runs.

mod call;
mod executor;
mod pipe;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grpc_wasm::Code;
use h2::client::SendRequest;
use h2::{Ping, PingPong};
use rustc_hash::FxHashMap as HashMap;

use self::call::{Call, Events, Outbox};
use self::executor::Executor;
use self::pipe::{Pipe, PipeIo};
use super::exchange::{self, origin, Origin};
use super::gate::Gate;
use super::tls::ClientTls;
use super::{
    CallTransport, CallerSocket, Keepalive, NewCall, RunningCall, Started, TlsOptions,
    TransportError, CONNECTION_WINDOW,
};
use crate::call::events::{self, close_as};
pub use crate::call::Produced;
use crate::call::{GrpcTarget, Token};
use crate::sync::lock;

/// The id of the connection's own task; calls use their tokens.
const CONNECTION: Token = Token(0);

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
    origin: Result<Origin, String>,
    tls: Option<ClientTls>,
    pipe: Arc<Mutex<Pipe>>,
    send: Option<SendRequest<Bytes>>,
    executor: Executor,
    outboxes: HashMap<Token, Arc<Mutex<Outbox>>>,
    events: Events,
    /// Why the HTTP/2 connection ended, once it has.
    ended: Arc<Mutex<Option<String>>>,
    keepalive: Keepalive,
    ping: Option<PingPong>,
    liveness: Liveness,
    /// The server answered our first PING: it speaks HTTP/2 (a later
    /// failure is no TLS server's refusal of plaintext).
    answered: Arc<std::sync::atomic::AtomicBool>,
    /// Bytes of this connection went to its socket: the socket was up.
    handed_out: bool,
}

impl Wire {
    /// A connection to `authority` (host:port, as in the `:authority`
    /// header), with TLS when `tls` is given. Its first bytes (the HTTP/2
    /// preface, or the TLS hello) are ready in [`Wire::take_output`].
    pub fn new(authority: &str, tls: Option<ClientTls>) -> Result<Wire, TransportError> {
        Wire::with_keepalive(authority, tls, Keepalive::default())
    }

    /// [`Wire::new`] with its own keepalive and handshake bounds, enforced by
    /// [`Wire::tick`].
    pub fn with_keepalive(
        authority: &str,
        tls: Option<ClientTls>,
        keepalive: Keepalive,
    ) -> Result<Wire, TransportError> {
        let mut wire = Wire {
            origin: origin(authority, tls.is_some()),
            tls,
            pipe: Arc::default(),
            send: None,
            executor: Executor::default(),
            outboxes: HashMap::default(),
            events: Arc::default(),
            ended: Arc::default(),
            keepalive,
            ping: None,
            liveness: Liveness::Handshake(None),
            answered: Arc::default(),
            handed_out: false,
        };
        wire.restart()?;
        // The handshake's PING leaves with the preface (nothing to report).
        let _ = wire.drive();
        Ok(wire)
    }

    /// A fresh HTTP/2 connection (the socket was replaced); calls that were
    /// running fail with UNAVAILABLE and `reason`. Their ends come back
    /// even when the fresh connection cannot start (then it is over).
    pub fn reset(&mut self, reason: &str) -> (Produced, Result<(), TransportError>) {
        // The socket closed under a plaintext connection whose server never
        // spoke HTTP/2: a TLS server closes on the preface (or sends an
        // alert that the socket's owner may not have read yet).
        let unheard = !self.answered.load(std::sync::atomic::Ordering::Relaxed);
        let hinted;
        let reason = if self.tls.is_none() && self.handed_out && unheard {
            hinted = format!("{reason}{}", super::TLS_HINT);
            hinted.as_str()
        } else {
            reason
        };
        let mut produced = self.fail_all(reason);
        let restarted = self.restart();
        produced.append(&mut self.drive());
        (produced, restarted)
    }

    /// The end of the connection: calls that were running fail with
    /// UNAVAILABLE and `reason`, and no new one starts.
    pub fn close(&mut self, reason: &str) -> Produced {
        lock(&self.pipe).close();
        self.fail_all(reason)
    }

    fn restart(&mut self) -> Result<(), TransportError> {
        self.handed_out = false;
        let tls = self.tls.as_ref().map(ClientTls::connection).transpose()?;
        self.pipe = Arc::new(Mutex::new(Pipe::new(tls)));
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
                .max_concurrent_reset_streams(crate::limits::REMEMBERED_RESETS)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .handshake::<_, Bytes>(io),
        );
        // The client half of the handshake only writes, so it never waits.
        let waker = self.executor.waker(CONNECTION);
        let (send, mut connection) = match handshake.as_mut().poll(&mut Context::from_waker(&waker))
        {
            Poll::Ready(Ok(pair)) => pair,
            Poll::Ready(Err(e)) => return Err(TransportError::Handshake(e.to_string())),
            Poll::Pending => return Err(TransportError::Handshake("it did not complete".into())),
        };
        self.send = Some(send);
        // The server's answer to a PING sent now proves the handshake
        // done: HTTP/2 makes its SETTINGS the first frame it sends.
        self.ping = connection.ping_pong();
        if let Some(ping) = &mut self.ping {
            ping.send_ping(Ping::opaque())
                .map_err(|e| TransportError::Handshake(e.to_string()))?;
        }
        self.liveness = Liveness::Handshake(None);
        let ended = self.ended.clone();
        let plaintext = self.tls.is_none();
        let answered = self.answered.clone();
        self.executor.spawn(CONNECTION, async move {
            let why = match connection.await {
                Ok(()) => "the server closed the connection".to_string(),
                Err(e)
                    if plaintext
                        && !answered.load(std::sync::atomic::Ordering::Relaxed)
                        && super::looks_like_tls_server(&e) =>
                {
                    super::with_tls_hint(super::h2_failure(&e)).message
                }
                Err(e) => super::h2_failure(&e).message,
            };
            *lock(&ended) = Some(why);
        });
        Ok(())
    }

    /// Bytes from the socket. Once the HTTP/2 connection is over they are
    /// dropped: nothing would ever take them.
    pub fn input(&mut self, bytes: &[u8]) -> Produced {
        if self.is_over() {
            return Vec::new();
        }
        if let Liveness::Heard(_) = self.liveness {
            self.liveness = Liveness::Heard(Instant::now());
        }
        let fed = lock(&self.pipe).feed(bytes);
        if let Err(reason) = fed {
            lock(&self.pipe).close();
            let mut produced = self.fail_all(&reason);
            produced.append(&mut self.drive());
            return produced;
        }
        self.executor.wake(CONNECTION);
        self.drive()
    }

    /// Bytes for the socket, taken.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut output = Vec::new();
        self.swap_output(&mut output);
        output
    }

    /// [`Wire::take_output`] into `buffer` (emptied first): the two buffers
    /// trade places, so a steady caller allocates none.
    pub fn swap_output(&mut self, buffer: &mut Vec<u8>) {
        buffer.clear();
        lock(&self.pipe).swap_outbound(buffer);
        self.handed_out |= !buffer.is_empty();
    }

    pub fn has_output(&self) -> bool {
        lock(&self.pipe).has_outbound()
    }

    /// The bytes waiting for the socket.
    pub fn output_len(&self) -> usize {
        lock(&self.pipe).outbound_len()
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
        token: Token,
        target: GrpcTarget,
        message: &[u8],
        timeout_ms: u32,
    ) -> Produced {
        self.start(token, target, Some(message), Some(timeout_ms), None)
    }

    /// A stream: messages follow with [`Wire::send`], the end with
    /// [`Wire::close_send`] (its deadline is in the module's metadata).
    /// The stream's response is read only while `gate` is open.
    pub fn stream(&mut self, token: Token, target: GrpcTarget, gate: Arc<Gate>) -> Produced {
        self.start(token, target, None, None, Some(gate))
    }

    fn start(
        &mut self,
        token: Token,
        target: GrpcTarget,
        message: Option<&[u8]>,
        timeout_ms: Option<u32>,
        gate: Option<Arc<Gate>>,
    ) -> Produced {
        let Some(send) = self.send.clone() else {
            return vec![(token, vec![events::connection_closed()])];
        };
        let request = match exchange::request(&self.origin, &target, timeout_ms) {
            Ok(request) => request,
            Err(e) => return vec![(token, vec![close_as(Code::Internal, &e)])],
        };
        let unary = message.is_some();
        let compression = target.compression;
        let first = message.map(|m| exchange::frame(m, compression, true));
        let first = match first.transpose() {
            Ok(first) => first,
            Err(e) => return vec![(token, vec![close_as(Code::Internal, &e)])],
        };
        let outbox = Outbox::new(first, unary, gate.clone(), compression);
        let outbox = Arc::new(Mutex::new(outbox));
        self.outboxes.insert(token, outbox.clone());
        let call = Call { token, unary, gate };
        let task = call::task(send, request, outbox, call, self.events.clone());
        self.executor.spawn(token, task);
        self.drive()
    }

    /// One more message of stream `token`; `compress: false` sends it
    /// uncompressed in a compressed stream.
    pub fn send(&mut self, token: Token, message: &[u8], compress: bool) -> Produced {
        let Some(compression) = self.outboxes.get(&token).map(|o| lock(o).compression) else {
            return self.drive();
        };
        match exchange::frame(message, compression, compress) {
            Ok(framed) => self.outbox(token, |outbox| outbox.push(framed)),
            Err(e) => {
                let mut produced = self.cancel(token);
                produced.push((token, vec![close_as(Code::Internal, &e)]));
                produced
            }
        }
    }

    pub fn close_send(&mut self, token: Token) -> Produced {
        self.outbox(token, Outbox::close)
    }

    /// Ends a call at once; h2 resets its stream (RST_STREAM) as the
    /// call's halves drop.
    pub fn cancel(&mut self, token: Token) -> Produced {
        self.executor.remove(token);
        self.outboxes.remove(&token);
        self.executor.wake(CONNECTION);
        self.drive()
    }

    pub fn is_running(&self, token: Token) -> bool {
        self.executor.contains(token)
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
                    self.close(&unanswered("the HTTP/2 handshake", handshake)),
                    None,
                ),
            },
            Liveness::Pinging(sent) => match timeout.checked_sub(now - sent) {
                Some(left) if !left.is_zero() => (Vec::new(), Some(left)),
                _ => (self.close(&unanswered("a keepalive PING", timeout)), None),
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
        self.executor.wake(CONNECTION);
        self.drive()
    }

    /// Notes the answer to our PING, if it came.
    fn poll_pong(&mut self) {
        if let Liveness::Heard(_) = self.liveness {
            return;
        }
        let Some(ping) = &mut self.ping else { return };
        // The connection's own waker: a pong arrives while it is polled.
        let waker = self.executor.waker(CONNECTION);
        if let Poll::Ready(Ok(_)) = ping.poll_pong(&mut Context::from_waker(&waker)) {
            self.liveness = Liveness::Heard(Instant::now());
            self.answered
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn outbox(&mut self, token: Token, f: impl FnOnce(&mut Outbox)) -> Produced {
        if let Some(outbox) = self.outboxes.get(&token) {
            f(&mut lock(outbox));
        }
        self.drive()
    }

    fn fail_all(&mut self, reason: &str) -> Produced {
        let tokens: Vec<Token> = self.outboxes.keys().copied().collect();
        self.executor.clear();
        self.outboxes.clear();
        self.send = None;
        self.ping = None;
        tokens
            .into_iter()
            .map(|token| (token, vec![close_as(Code::Unavailable, reason)]))
            .collect()
    }

    /// Polls every task whose waker fired, until none did.
    fn drive(&mut self) -> Produced {
        while let Some((id, finished)) = self.executor.poll_next() {
            if !finished {
                continue;
            }
            self.outboxes.remove(&id);
            if id == CONNECTION {
                let why = lock(&self.ended).take();
                let why = why.unwrap_or_else(|| "the connection closed".into());
                let mut produced = self.fail_all(&why);
                produced.append(&mut std::mem::take(&mut *lock(&self.events)));
                return produced;
            }
        }
        self.poll_pong();
        std::mem::take(&mut *lock(&self.events))
    }
}

/// A connection to `addr` (`host:port`) whose socket the caller will
/// drive, with TLS when `tls` asks for it.
pub fn connect(
    addr: &str,
    tls: &TlsOptions,
    keepalive: &Keepalive,
) -> Result<Arc<Mutex<Wire>>, TransportError> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
        _ => {
            return Err(TransportError::Address(
                addr.to_string(),
                "expected host:port".into(),
            ))
        }
    };
    let tls = if tls.enabled() {
        Some(ClientTls::new(host, tls)?)
    } else {
        None
    };
    let wire = Wire::with_keepalive(addr, tls, *keepalive)?;
    Ok(Arc::new(Mutex::new(wire)))
}

impl CallTransport for Arc<Mutex<Wire>> {
    fn unary(&self, call: NewCall<'_>, message: Vec<u8>, timeout_ms: u32) -> Started {
        let token = call.token;
        let produced = lock(self).unary(token, call.target, &message, timeout_ms);
        (WireCall::boxed(self, token, true), produced)
    }

    fn stream(&self, call: NewCall<'_>, gate: Arc<Gate>) -> Started {
        let token = call.token;
        let produced = lock(self).stream(token, call.target, gate);
        (WireCall::boxed(self, token, false), produced)
    }

    fn socket(&self) -> Option<&dyn CallerSocket> {
        Some(self)
    }

    fn close(&self, reason: &str) -> Produced {
        lock(self).close(reason)
    }
}

impl CallerSocket for Arc<Mutex<Wire>> {
    fn input(&self, bytes: &[u8]) -> Produced {
        lock(self).input(bytes)
    }

    fn swap_output(&self, buffer: &mut Vec<u8>) {
        lock(self).swap_output(buffer);
    }

    fn output_len(&self) -> usize {
        lock(self).output_len()
    }

    fn state(&self) -> (bool, bool) {
        let wire = lock(self);
        (wire.has_output(), wire.is_over())
    }

    fn tick(&self, now: Instant) -> (Produced, Option<Duration>) {
        lock(self).tick(now)
    }

    fn reset(&self, reason: &str) -> (Produced, Result<(), TransportError>) {
        lock(self).reset(reason)
    }

    fn poll(&self) -> Produced {
        lock(self).poll()
    }
}

/// A call on a wire connection: its commands run on the caller's thread,
/// and return what they produced.
struct WireCall {
    wire: Arc<Mutex<Wire>>,
    token: Token,
    unary: bool,
}

impl WireCall {
    fn boxed(wire: &Arc<Mutex<Wire>>, token: Token, unary: bool) -> Box<dyn RunningCall> {
        Box::new(WireCall {
            wire: wire.clone(),
            token,
            unary,
        })
    }
}

impl RunningCall for WireCall {
    fn send(&mut self, message: Vec<u8>, compress: bool) -> Produced {
        lock(&self.wire).send(self.token, &message, compress)
    }

    fn close_send(&mut self) -> Produced {
        lock(&self.wire).close_send(self.token)
    }

    fn cancel(self: Box<Self>) -> Produced {
        lock(&self.wire).cancel(self.token)
    }

    fn is_unary(&self) -> bool {
        self.unary
    }
}

fn unanswered(what: &str, within: Duration) -> String {
    format!(
        "the server did not answer {what} within {} ms",
        within.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::pipe::AFTER_CLOSE_NOTIFY;
    use super::*;
    use crate::call::GrpcEvent;
    use grpc_wasm::framing::{encode_frame, Compression};

    fn greeter() -> GrpcTarget {
        GrpcTarget {
            upstream: "1".into(),
            service: "helloworld.Greeter".into(),
            method: "SayHello".into(),
            metadata: vec![],
            compression: Default::default(),
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
        assert!(wire.unary(Token(3), target, b"", 500).is_empty());
        assert!(!wire.is_over());
        let produced = wire.input(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        assert!(wire.is_over());
        assert_eq!(produced.len(), 1, "{produced:?}");
        let (token, events) = &produced[0];
        assert_eq!(*token, Token(3));
        match &events[..] {
            [GrpcEvent::Close(14, message)] => {
                let message = String::from_utf8_lossy(message);
                assert!(message.starts_with("the connection failed: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// The message a call in flight is failed with when the socket closes
    /// under a plaintext connection that has (or has not) been written to.
    fn closed_with(written: bool) -> String {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        assert!(wire.unary(Token(3), greeter(), b"", 500).is_empty());
        if written {
            assert!(!wire.take_output().is_empty());
        }
        let (produced, restarted) = wire.reset("the connection failed: closed");
        assert!(restarted.is_ok());
        match &produced[..] {
            [(Token(3), events)] => match &events[..] {
                [GrpcEvent::Close(14, message)] => String::from_utf8_lossy(message).into_owned(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_socket_closed_before_the_server_spoke_http2_hints_at_tls() {
        // The preface went out and the server closed without a word, as a
        // TLS server does: a hint. A socket that never came up: none.
        assert_eq!(
            closed_with(true),
            "the connection failed: closed (does the server want TLS? connect with TLS options: ca, host)"
        );
        assert_eq!(closed_with(false), "the connection failed: closed");
    }

    #[test]
    fn requests_carry_the_deadline_and_the_metadata() {
        let wire = Wire::new("example.com:443", None).unwrap();
        let target = GrpcTarget {
            upstream: "1".into(),
            service: "pkg.Svc".into(),
            method: "Do".into(),
            metadata: vec![("x-id".into(), b"7".to_vec())],
            compression: Default::default(),
        };
        let request = exchange::request(&wire.origin, &target, Some(250)).unwrap();
        assert_eq!(request.uri(), "http://example.com:443/pkg.Svc/Do");
        let header = |r: &http::Request<()>, name: &str| {
            r.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(header(&request, "grpc-timeout").as_deref(), Some("250000u"));
        assert_eq!(header(&request, "x-id").as_deref(), Some("7"));
        assert_eq!(header(&request, "te").as_deref(), Some("trailers"));
        let long = exchange::request(&wire.origin, &target, Some(200_000_000)).unwrap();
        assert_eq!(header(&long, "grpc-timeout").as_deref(), Some("200000S"));
        let stream = exchange::request(&wire.origin, &target, None).unwrap();
        assert_eq!(header(&stream, "grpc-timeout"), None);
    }

    #[test]
    fn a_reset_fails_running_calls() {
        let mut wire = Wire::new("127.0.0.1:1", None).unwrap();
        let target = greeter();
        assert!(wire.unary(Token(7), target, b"\x0a\x01x", 500).is_empty());
        assert!(wire.is_running(Token(7)));
        let (produced, restarted) = wire.reset("connect failed: refused");
        restarted.unwrap();
        assert_eq!(produced.len(), 1);
        assert_eq!(produced[0].0, Token(7));
        assert!(
            matches!(&produced[0].1[..], [GrpcEvent::Close(14, m)] if m == b"connect failed: refused")
        );
        assert!(!wire.is_running(Token(7)));
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
        assert!(wire.unary(Token(3), greeter(), b"", 5000).is_empty());
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(quiet(wire.tick(t0)), Some(ms(300)));
        assert_eq!(quiet(wire.tick(t0 + ms(299))), Some(ms(1)));
        let (produced, next) = wire.tick(t0 + ms(300));
        assert_eq!(
            only_close(&produced, Token(3)),
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
        assert!(wire.unary(Token(3), greeter(), b"", 60_000).is_empty());
        let _ = wire.take_output();
        wire
    }

    #[test]
    fn a_quiet_connection_with_calls_is_pinged_and_ends_when_the_ping_is_not_answered() {
        let before = Instant::now();
        let mut wire = answered(keepalive(200, 300, 1000));
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // Heard just now: the PING is due an interval after that (exactly
        // when is not known here, but not before `before`).
        let (produced, next) = wire.tick(t0);
        assert!(produced.is_empty());
        let earliest = ms(200).saturating_sub(t0 - before);
        assert!(
            next.is_some_and(|d| d <= ms(200) && d >= earliest),
            "{next:?}"
        );
        assert_eq!(pings(&wire.take_output()), 0);
        assert_eq!(quiet(wire.tick(t0 + ms(200))), Some(ms(300)));
        assert_eq!(pings(&wire.take_output()), 1);
        assert_eq!(quiet(wire.tick(t0 + ms(450))), Some(ms(50)));
        let (produced, next) = wire.tick(t0 + ms(500));
        assert_eq!(
            only_close(&produced, Token(3)),
            (
                14,
                "the server did not answer a keepalive PING within 300 ms".to_string()
            )
        );
        assert_eq!(next, None);
        assert!(wire.is_over());
    }

    #[test]
    fn a_server_that_floods_pings_and_reads_nothing_ends_the_connection_at_the_bound() {
        // Each PING owes an ack; none of them is taken (the socket is not
        // written): the acks once piled up without end (603 MB in 9 s).
        let mut wire = answered(keepalive(0, 0, 1000));
        let mut ping = vec![0, 0, 8, PING, 0, 0, 0, 0, 0];
        ping.extend_from_slice(&[7; 8]);
        let flood = ping.repeat(4096);
        let acks_per_bound = crate::limits::MAX_UNSENT / ping.len() + 1;
        let mut produced = Vec::new();
        for _ in 0..acks_per_bound / 4096 + 2 {
            produced = wire.input(&flood);
            if !produced.is_empty() {
                break;
            }
        }
        let expected = format!("the connection failed: {}", pipe::unread());
        assert_eq!(only_close(&produced, Token(3)), (14, expected));
        assert!(wire.is_over());
        assert!(wire.take_output().len() <= crate::limits::MAX_UNSENT);
        // The flood goes on; h2 is over and takes none of it. The socket's
        // reader fed it on, and the worker grew by the server's rate.
        for _ in 0..crate::limits::MAX_UNREAD / flood.len() + 2 {
            assert!(wire.input(&flood).is_empty());
        }
        assert!(lock(&wire.pipe).unread() < flood.len());
    }

    #[test]
    fn an_upload_under_wide_windows_waits_in_the_output_not_in_the_gate() {
        // With every window open h2 takes each message at once: nothing
        // stays unsent in the call, and all of it waits for the socket.
        // A caller that counted only the gate never yielded to its writer,
        // and the connection failed at its bound (hence send_backlog counts
        // `output_len` too).
        let mut wire = answered(keepalive(0, 0, 1000));
        let mut wide = vec![0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 4, 0x7f, 0xff, 0xff, 0xff];
        wide.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 0, 0x7f, 0xff, 0x00, 0x00]);
        assert!(wire.input(&wide).is_empty());
        let gate = Arc::new(Gate::default());
        assert!(wire.stream(Token(9), greeter(), gate.clone()).is_empty());
        for _ in 0..8 {
            assert!(wire.send(Token(9), &vec![1u8; 1 << 20], true).is_empty());
        }
        assert_eq!(gate.unsent(), 0);
        assert!(wire.output_len() > 8 << 20, "{}", wire.output_len());
    }

    #[test]
    fn an_answered_ping_keeps_the_connection() {
        let mut wire = answered(keepalive(200, 300, 1000));
        let ms = Duration::from_millis;
        let t0 = Instant::now() + ms(200);
        assert_eq!(quiet(wire.tick(t0)), Some(ms(300)));
        let sent = wire.take_output();
        assert_eq!(pings(&sent), 1);
        let before = Instant::now();
        assert!(wire.input(&server_answer(&sent, false)).is_empty());
        // Heard from again: the next PING is an interval away, not a death.
        let now = Instant::now();
        let (produced, next) = wire.tick(now);
        assert!(produced.is_empty());
        let earliest = ms(200).saturating_sub(now - before);
        assert!(
            next.is_some_and(|d| d >= earliest && d <= ms(200)),
            "{next:?}"
        );
        assert!(!wire.is_over());
    }

    #[test]
    fn a_connection_without_calls_is_not_pinged() {
        let mut wire = answered(keepalive(200, 300, 1000));
        let _ = wire.cancel(Token(3));
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
        /// [`Answer::Body`] under this `grpc-encoding`.
        Encoded(&'static str, Vec<Bytes>),
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
                let mut response =
                    http::Response::builder().header("content-type", "application/grpc");
                let frames = match answer {
                    Answer::Body(frames) => frames,
                    Answer::Encoded(name, frames) => {
                        response = response.header("grpc-encoding", name);
                        frames
                    }
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
                assert_eq!(token, Token(5));
                events.append(&mut list);
            }
        };
        absorb(wire.unary(Token(5), greeter(), b"", 10_000), &mut events);
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
    fn a_gzip_answer_is_inflated_and_an_unoffered_encoding_is_unimplemented() {
        let message = vec![0x2a; 1000];
        let gzip = encode_frame(&message, Compression::Gzip).unwrap();
        let events = unary_answered(Answer::Encoded("gzip", vec![gzip.into()]));
        assert!(
            events
                .iter()
                .any(|e| matches!(e, GrpcEvent::Message(m) if m[..] == message[..])),
            "{events:?}"
        );
        let events = unary_answered(Answer::Encoded("deflate", vec![grpc_frame(3)]));
        assert!(
            matches!(&events[..], [GrpcEvent::Close(12, m)] if m[..] == *b"the server compressed the response with 'deflate', which this client did not offer (it offers gzip)"),
            "{events:?}"
        );
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
        let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let mut server = tls_server(&key);
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

    /// A TLS server for `key`'s self-signed certificate, speaking h2.
    fn tls_server(key: &rcgen::CertifiedKey<rcgen::KeyPair>) -> rustls::ServerConnection {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
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
        rustls::ServerConnection::new(Arc::new(config)).unwrap()
    }

    #[test]
    fn a_request_over_64_kib_written_before_the_tls_handshake_ends_is_sent_whole() {
        // h2 writes the preface and a first window (65,535 bytes) of DATA
        // at once; rustls held at most 64 KiB of plaintext before its
        // handshake ended, and the rest failed the connection.
        let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let options = crate::transport::TlsOptions {
            ca: Some(key.cert.pem()),
            ..Default::default()
        };
        let tls = ClientTls::new("localhost", &options).unwrap();
        let mut wire = Wire::new("localhost:443", Some(tls)).unwrap();
        let message = vec![7u8; 100_000];
        assert!(wire.unary(Token(3), greeter(), &message, 5000).is_empty());
        assert!(!wire.is_over());
        let mut server = tls_server(&key);
        let mut plain = Vec::new();
        for _ in 0..10 {
            let out = wire.take_output();
            // rustls takes a record or so per read_tls.
            let mut rest = &out[..];
            while !rest.is_empty() {
                server.read_tls(&mut rest).unwrap();
                server.process_new_packets().unwrap();
                let mut chunk = [0u8; 65536];
                while let Ok(n) = std::io::Read::read(&mut server.reader(), &mut chunk) {
                    if n == 0 {
                        break;
                    }
                    plain.extend_from_slice(&chunk[..n]);
                }
            }
            let mut back = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut back).unwrap();
            }
            assert!(wire.input(&back).is_empty(), "the call failed");
            if !server.is_handshaking() && !wire.has_output() {
                break;
            }
        }
        assert!(!wire.is_over());
        // The preface, SETTINGS, HEADERS and a full first window of DATA.
        assert!(
            plain.len() > 65_535,
            "{} bytes reached the server",
            plain.len()
        );
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

    fn only_close(produced: &Produced, token: Token) -> (u32, String) {
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
        assert!(wire.unary(Token(3), greeter(), b"", 500).is_empty());
        let bytes = close_notify(&mut server);
        let (produced, over) = within_5s(move || {
            let produced = wire.input(&bytes);
            (produced, wire.is_over())
        });
        let closed = (14, "the server closed the connection".to_string());
        assert_eq!(only_close(&produced, Token(3)), closed);
        assert!(over);
    }

    #[test]
    fn bytes_after_a_tls_close_notify_in_the_same_read_fail_the_connection() {
        let (mut wire, mut server) = tls_pair();
        assert!(wire.unary(Token(3), greeter(), b"", 500).is_empty());
        // More than rustls takes in one read_tls.
        let mut bytes = close_notify(&mut server);
        bytes.extend(std::iter::repeat_n(0x17, 100_000));
        let (produced, over) = within_5s(move || {
            let produced = wire.input(&bytes);
            (produced, wire.is_over())
        });
        assert_eq!(
            only_close(&produced, Token(3)),
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
