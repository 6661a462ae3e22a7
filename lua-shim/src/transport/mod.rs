//! The HTTP/2 transports that carry the calls the module asks for, and
//! report back what Envoy would (see [`crate::call`]): the [`runtime`]
//! transport (tonic on the client's tokio runtime) and the [`wire`]
//! transport (h2 on the caller's thread, over a socket the caller drives).
//! Both implement [`CallTransport`] (and the wire transport
//! [`CallerSocket`]), all the client knows of them, and share the
//! options, bounds and failure names here.

mod codec;
mod exchange;
pub mod gate;
pub mod runtime;
pub mod tls;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use grpc_wasm::{Code, Status};

pub use codec::RawCodec;
pub use gate::Gate;

use crate::call::{GrpcEvent, GrpcTarget, Produced, Token};

/// What the client needs of a connection to run the module's calls on it,
/// whichever transport carries them. A call's events come back either at
/// once (the wire transport runs on the caller's thread) or later through
/// the [`Sink`] (the runtime transport's calls run on its threads).
pub trait CallTransport {
    /// A unary call: its one message, and its deadline.
    fn unary(&self, call: NewCall<'_>, message: Vec<u8>, timeout_ms: u32) -> Started;
    /// A stream: messages follow through [`RunningCall::send`]; its
    /// response is read only while `gate` is open.
    fn stream(&self, call: NewCall<'_>, gate: Arc<Gate>) -> Started;
    /// The connection's socket, when its caller drives it (the wire
    /// transport); `None` when the transport owns its sockets.
    fn socket(&self) -> Option<&dyn CallerSocket> {
        None
    }
    /// The connection is closed by its owner: its calls end with
    /// `reason`. A transport that owns its sockets lets its calls run.
    fn close(&self, reason: &str) -> Produced {
        let _ = reason;
        Vec::new()
    }
}

/// A connection whose socket its caller owns: the caller moves the bytes
/// and keeps the clock, and each step returns the events it produced.
pub trait CallerSocket {
    /// Bytes read from the socket.
    fn input(&self, bytes: &[u8]) -> Produced;
    /// The bytes to write, swapped into `buffer` (emptied first), so that
    /// a steady caller allocates none.
    fn swap_output(&self, buffer: &mut Vec<u8>);
    /// How many bytes wait to be written.
    fn output_len(&self) -> usize;
    /// Whether it has bytes to write, and whether its HTTP/2 connection
    /// is over.
    fn state(&self) -> (bool, bool);
    /// Its timers (keepalive, handshake) at `now`: what they produced, and
    /// how long until the next is due (`None`: not before a call starts).
    fn tick(&self, now: std::time::Instant) -> (Produced, Option<Duration>);
    /// The socket is gone: its calls fail with `reason`, and a fresh
    /// HTTP/2 connection waits for a new socket (or the error why not).
    fn reset(&self, reason: &str) -> (Produced, Result<(), TransportError>);
    /// Runs its tasks again after a stream's gate opened.
    fn poll(&self) -> Produced;
}

/// What starting a call needs besides its message or gate.
pub struct NewCall<'a> {
    pub token: Token,
    pub target: GrpcTarget,
    pub runtime: &'a tokio::runtime::Handle,
    pub sink: &'a Sink,
}

/// A call a transport started, and the events it produced at once.
pub type Started = (Box<dyn RunningCall>, Produced);

/// A call as the client holds it while its transport runs it.
pub trait RunningCall: Send {
    /// One more request message (a stream's): compressed as the call is,
    /// unless `compress` is false.
    fn send(&mut self, message: Vec<u8>, compress: bool) -> Produced;
    /// The end of the request.
    fn close_send(&mut self) -> Produced;
    /// Ends the call at once; it reports nothing more.
    fn cancel(self: Box<Self>) -> Produced;
    /// Whether its one message ends it.
    fn is_unary(&self) -> bool;
}

/// HTTP/2 connection-level flow-control window, the largest HTTP/2 allows.
/// A call whose caller does not read leaves its stream's data unreleased
/// (see [`Gate`]), and that data counts against the connection's window
/// too: at h2's 64 KiB default one such call would stall every other call
/// on the connection. Memory stays bounded by the streams' own windows.
pub(crate) const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// How a connection finds out that its server is gone: a server that does
/// not answer our HTTP/2 handshake within `handshake`, or a PING within
/// `timeout`, ends the connection (its calls fail UNAVAILABLE) and the next
/// call dials again. A PING goes out once a connection with calls in flight
/// has heard nothing for `interval`; none goes out on a connection without
/// calls, as gRPC clients do by default (servers may refuse pings without
/// calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
    pub handshake: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            interval: crate::limits::KEEPALIVE_INTERVAL,
            timeout: crate::limits::KEEPALIVE_TIMEOUT,
            handshake: crate::limits::HANDSHAKE_TIMEOUT,
        }
    }
}

impl Keepalive {
    /// The defaults with each given value (ms) in place; 0 keeps the default.
    pub fn from_ms(interval: u64, timeout: u64, handshake: u64) -> Keepalive {
        let default = Keepalive::default();
        let or = |ms: u64, d: Duration| {
            if ms == 0 {
                d
            } else {
                Duration::from_millis(ms)
            }
        };
        Keepalive {
            interval: or(interval, default.interval),
            timeout: or(timeout, default.timeout),
            handshake: or(handshake, default.handshake),
        }
    }
}

/// Where transport events go: the call's token and the events, in order;
/// events that arrive together go together (one trip into the module).
pub type Sink = Arc<dyn Fn(Token, Vec<GrpcEvent>) + Send + Sync>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    #[error("invalid address '{0}': {1}")]
    Address(String, String),
    #[error("invalid TLS options: {0}")]
    Tls(String),
    /// A connection's HTTP/2 handshake could not even be written.
    #[error("HTTP/2 handshake: {0}")]
    Handshake(String),
}

/// TLS settings, all PEM text; none at all means plaintext.
#[derive(Debug, Default, Clone)]
pub struct TlsOptions {
    /// The server name to verify (and send as SNI); the address's host by default.
    pub host: Option<String>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl TlsOptions {
    pub(crate) fn enabled(&self) -> bool {
        self.host.is_some() || self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The roots to trust, checked as PEM; `None`: the webpki roots.
    pub(crate) fn ca_pem(&self) -> Result<Option<&str>, TransportError> {
        match &self.ca {
            Some(ca) => check_pem(ca, "ca").map(|()| Some(ca.as_str())),
            None => Ok(None),
        }
    }

    /// The client identity for mTLS, checked: both parts as PEM, or neither.
    pub(crate) fn identity(&self) -> Result<Option<(&str, &str)>, TransportError> {
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                check_pem(cert, "cert")?;
                check_pem(key, "priv_key")?;
                Ok(Some((cert, key)))
            }
            (None, None) => Ok(None),
            _ => Err(TransportError::Tls(
                "mTLS needs both cert and priv_key".into(),
            )),
        }
    }
}

/// The status of a call that HTTP/2 itself ended, the same on both
/// transports, as gRPC's HTTP/2 spec has it: a stream the server reset takes
/// the code its error code maps to ([`Status::from_h2_reset`]); a GOAWAY, a
/// broken connection or one this side gave up on is UNAVAILABLE, as the call
/// may never have reached the server; a stream this side reset over the
/// server's answer (bad headers, a flow-control breach) is INTERNAL: the
/// connection is fine, and a retry would meet the same answer.
pub(crate) fn h2_failure(e: &h2::Error) -> Status {
    match e.reason() {
        Some(reason) if e.is_reset() && e.is_remote() => Status::from_h2_reset(reason.into()),
        // h2's words carry the GOAWAY's debug data (`too_many_pings`).
        Some(_) if e.is_go_away() && e.is_remote() => Status::new(
            Code::Unavailable,
            format!("the server closed the connection: {e}"),
        ),
        Some(_) if e.is_reset() => Status::new(
            Code::Internal,
            format!("the server's answer broke HTTP/2: {e}"),
        ),
        _ if e.is_io() || e.is_go_away() => {
            Status::new(Code::Unavailable, format!("the connection failed: {e}"))
        }
        _ => Status::new(Code::Internal, format!("HTTP/2: {e}")),
    }
}

/// Whether a plaintext connection failed as one to a TLS server does: the
/// server's alert, read as HTTP/2, is a frame far too large; or the server
/// closed on the first bytes (a broken pipe, a reset), before the alert
/// was read.
pub(crate) fn looks_like_tls_server(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.reason() == Some(h2::Reason::FRAME_SIZE_ERROR) && !h2.is_remote() {
                return true;
            }
            if let Some(io) = h2.get_io() {
                return broken_at_once(io);
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return broken_at_once(io);
        }
        source = e.source();
    }
    false
}

fn broken_at_once(io: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    matches!(io.kind(), BrokenPipe | ConnectionReset)
}

/// What a plaintext call that met a TLS server is told.
pub(crate) const TLS_HINT: &str = " (does the server want TLS? connect with TLS options: ca, host)";

/// The hint a plaintext call that met a TLS server gets.
pub(crate) fn with_tls_hint(mut status: Status) -> Status {
    status.message.push_str(TLS_HINT);
    status
}

fn check_pem(text: &str, what: &str) -> Result<(), TransportError> {
    if text.contains("-----BEGIN ") {
        Ok(())
    } else {
        Err(TransportError::Tls(format!(
            "{what} is not PEM text (give the file's contents: local ok, pem = grpc.readfile(path))"
        )))
    }
}
