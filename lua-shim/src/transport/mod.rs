//! The HTTP/2 transport: tonic channels (plaintext, TLS, mTLS with rustls)
//! that carry the calls the module asks for, and report back what Envoy
//! would: initial metadata, messages, trailing metadata, then a close with
//! the status code and the raw `grpc-message`.

mod codec;
pub mod gate;
pub mod tls;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use grpc_wasm::framing::{FrameError, DEFAULT_MAX_MESSAGE_SIZE};
use grpc_wasm::{Code, Status};
use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use codec::RawCodec;
pub use gate::Gate;

use crate::call::events::{self, close, close_as};
use crate::call::{GrpcEvent, GrpcTarget, HeaderBlock, Pairs};

/// HTTP/2 connection-level flow-control window, the largest HTTP/2 allows.
/// A call whose caller does not read leaves its stream's data unreleased
/// (see [`Gate`]), and that data counts against the connection's window
/// too: at h2's 64 KiB default one such call would stall every other call
/// on the connection. Memory stays bounded by the streams' own windows.
pub(crate) const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// Streams this side reset that h2 remembers, for a second, so as to ignore
/// the frames still in flight for them; a few hundred bytes each. At h2's
/// default of 50, the 51st cancel within a second is forgotten at once and
/// each of its late frames costs a RST_STREAM, of which h2 allows 1,024 in
/// a connection's life before it ends the connection (ENHANCE_YOUR_CALM).
pub(crate) const REMEMBERED_RESETS: usize = 4096;

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
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            handshake: Duration::from_secs(10),
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
pub type Sink = Arc<dyn Fn(u32, Vec<GrpcEvent>) + Send + Sync>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    #[error("invalid address '{0}': {1}")]
    Address(String, String),
    #[error("invalid TLS options: {0}")]
    Tls(String),
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

/// A lazily connected, multiplexed HTTP/2 channel; it reconnects by itself
/// after the server comes back. Must run inside the runtime. hyper's
/// keepalive pings only while calls run, and its handshake has no answer to
/// wait for, so `handshake` bounds the dial (TCP and TLS) and a server that
/// then stays silent is caught by the keepalive PING.
pub fn connect(
    addr: &str,
    tls: &TlsOptions,
    keepalive: &Keepalive,
) -> Result<Upstream, TransportError> {
    let scheme = if tls.enabled() { "https" } else { "http" };
    let bad = |e: &dyn std::fmt::Display| TransportError::Address(addr.to_string(), e.to_string());
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| bad(&e))?
        .connect_timeout(keepalive.handshake)
        .http2_keep_alive_interval(keepalive.interval)
        .keep_alive_timeout(keepalive.timeout)
        .keep_alive_while_idle(false)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_max_concurrent_reset_streams(REMEMBERED_RESETS)
        .tcp_nodelay(true);
    if tls.enabled() {
        let mut config = ClientTlsConfig::new();
        if let Some(host) = &tls.host {
            config = config.domain_name(host.clone());
        }
        config = match tls.ca_pem()? {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            // The same roots as the wire transport's (tls::system_roots).
            None => match tls::native_certs() {
                certs if certs.is_empty() => config.with_webpki_roots(),
                certs => config
                    .ca_certificates(certs.iter().map(|c| Certificate::from_pem(tls::to_pem(c)))),
            },
        };
        if let Some((cert, key)) = tls.identity()? {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| TransportError::Tls(e.to_string()))?;
    }
    Ok(Upstream {
        channel: endpoint.connect_lazy(),
        keepalive: *keepalive,
    })
}

/// A tonic connection, and the bounds it was made with (its failures name
/// them, as the wire transport's do).
#[derive(Clone)]
pub struct Upstream {
    pub channel: Channel,
    pub keepalive: Keepalive,
}

/// The status of a call that HTTP/2 itself ended, the same on both
/// transports, as gRPC's HTTP/2 spec has it: a stream the server reset takes
/// the code its error code maps to ([`Code::from_h2_reset`]); a GOAWAY, a
/// broken connection or one this side gave up on is UNAVAILABLE, as the call
/// may never have reached the server; a stream this side reset over the
/// server's answer (bad headers, a flow-control breach) is INTERNAL: the
/// connection is fine, and a retry would meet the same answer.
pub(crate) fn h2_failure(e: &h2::Error) -> Status {
    match e.reason() {
        Some(reason) if e.is_reset() && e.is_remote() => Status::new(
            Code::from_h2_reset(reason.into()),
            format!("the server reset the stream with {reason:?}"),
        ),
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

/// The HTTP/2 or I/O failure under a tonic status, named as the wire
/// transport names it: tonic calls them all "h2 protocol error: http2
/// error", and a connection closed mid-body UNKNOWN.
fn connection_failure(status: &tonic::Status) -> Option<Status> {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return Some(h2_failure(h2));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let message = format!("the connection failed: {io}");
            return Some(Status::new(Code::Unavailable, message));
        }
        source = e.source();
    }
    None
}

/// hyper reports a PING without an answer as "http2 error"; the cause,
/// deeper in the error's chain, says what happened.
fn keepalive_timed_out(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.to_string() == "keep-alive timed out" {
            return true;
        }
        source = e.source();
    }
    false
}

fn check_pem(text: &str, what: &str) -> Result<(), TransportError> {
    if text.contains("-----BEGIN ") {
        Ok(())
    } else {
        Err(TransportError::Tls(format!(
            "{what} is not PEM text (give the file's contents, e.g. grpc.readfile(path))"
        )))
    }
}

fn path(target: &GrpcTarget) -> Result<PathAndQuery, tonic::Status> {
    PathAndQuery::try_from(format!("/{}/{}", target.service, target.method))
        .map_err(|e| tonic::Status::invalid_argument(format!("invalid method path: {e}")))
}

fn request<T>(message: T, metadata: &Pairs) -> tonic::Request<T> {
    let mut headers = http::HeaderMap::new();
    events::append_metadata(&mut headers, metadata);
    let mut request = tonic::Request::new(message);
    *request.metadata_mut() = MetadataMap::from_headers(headers);
    request
}

fn pairs(metadata: &MetadataMap) -> HeaderBlock {
    events::header_block(&metadata.clone().into_headers(), None)
}

/// A failed call as Envoy reports it: trailing metadata (with the details
/// as `grpc-status-details-bin`), then the close.
fn report_failure(sink: &Sink, token: u32, status: &tonic::Status, keepalive: &Keepalive) {
    if status.code() == tonic::Code::Unavailable && keepalive_timed_out(status) {
        let message = format!(
            "the server did not answer a keepalive PING within {} ms",
            keepalive.timeout.as_millis()
        );
        return sink(token, vec![close_as(Code::Unavailable, &message)]);
    }
    if let Some(failure) = connection_failure(status) {
        return sink(token, vec![close(&failure)]);
    }
    use base64::Engine;
    let encoded = (!status.details().is_empty())
        .then(|| base64::engine::general_purpose::STANDARD_NO_PAD.encode(status.details()));
    let details = encoded
        .as_deref()
        .map(|e| ("grpc-status-details-bin", e.as_bytes()));
    let trailing = events::header_block(&status.metadata().clone().into_headers(), details);
    // tonic decoded `grpc-message`; the event carries it encoded again.
    let code = Code::from_i32(status.code() as i32);
    sink(
        token,
        events::ended(trailing, &Status::new(code, status.message())),
    );
}

/// A unary call with its deadline, enforced here as well as sent. It goes
/// as a one-message stream so that headers and trailers stay apart (tonic's
/// unary API merges them); the module sees Envoy's order: metadata, then
/// the message.
pub fn unary(
    rt: &tokio::runtime::Handle,
    upstream: Upstream,
    token: u32,
    target: GrpcTarget,
    message: Vec<u8>,
    timeout_ms: u32,
    sink: Sink,
) -> AbortHandle {
    rt.spawn(async move {
        let timeout = Duration::from_millis(u64::from(timeout_ms.max(1)));
        let started = tokio::time::Instant::now();
        let call = async {
            let mut grpc = tonic::client::Grpc::new(upstream.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let mut req = request(tokio_stream::once(message), &target.metadata);
            req.set_timeout(timeout);
            let response = grpc.streaming(req, path(&target)?, RawCodec).await?;
            let (headers, mut body, _) = response.into_parts();
            let mut messages = Vec::with_capacity(1);
            let mut total = 0usize;
            while let Some(message) = body.message().await? {
                // As on the wire transport: a server sending message after
                // message must not have them all held until its trailers.
                total += message.len();
                if total > DEFAULT_MAX_MESSAGE_SIZE {
                    let too_much = FrameError::TotalTooLarge {
                        limit: DEFAULT_MAX_MESSAGE_SIZE,
                    };
                    return Err(tonic::Status::resource_exhausted(too_much.to_string()));
                }
                messages.push(message);
            }
            let trailers = body
                .trailers()
                .await?
                .map(|t| pairs(&t))
                .unwrap_or_default();
            Ok::<_, tonic::Status>((pairs(&headers), messages, trailers))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok((headers, messages, trailers))) => {
                sink(token, events::unary_answer(headers, trailers, messages));
            }
            // tonic ends a call at its deadline as CANCELLED ("Timeout
            // expired"); gRPC, the wire transport and Envoy say
            // DEADLINE_EXCEEDED.
            Ok(Err(status))
                if status.code() == tonic::Code::Cancelled && started.elapsed() >= timeout =>
            {
                deadline_exceeded(&sink, token, timeout)
            }
            Ok(Err(status)) => report_failure(&sink, token, &status, &upstream.keepalive),
            Err(_) => deadline_exceeded(&sink, token, timeout),
        }
    })
    .abort_handle()
}

fn deadline_exceeded(sink: &Sink, token: u32, timeout: Duration) {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    sink(token, vec![close(&Status::deadline_exceeded(ms))]);
}

/// A stream: messages go out as the module sends them; dropping the sender
/// half-closes. The next response message is read only while `gate` is
/// open (hyper gives flow-control credit back as the body is read).
pub fn stream(
    rt: &tokio::runtime::Handle,
    upstream: Upstream,
    token: u32,
    target: GrpcTarget,
    sink: Sink,
    gate: Arc<Gate>,
) -> (mpsc::UnboundedSender<Vec<u8>>, AbortHandle) {
    let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let handle = rt.spawn(async move {
        let run = async {
            let mut grpc = tonic::client::Grpc::new(upstream.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let req = request(UnboundedReceiverStream::new(rx), &target.metadata);
            let response = grpc.streaming(req, path(&target)?, RawCodec).await?;
            let (metadata, mut messages, _) = response.into_parts();
            sink(token, vec![GrpcEvent::InitialMetadata(pairs(&metadata))]);
            loop {
                gate.opened().await;
                let Some(message) = messages.message().await? else {
                    break;
                };
                sink(token, vec![GrpcEvent::Message(message)]);
            }
            let trailers = messages
                .trailers()
                .await?
                .map(|t| pairs(&t))
                .unwrap_or_default();
            Ok::<_, tonic::Status>(trailers)
        };
        match run.await {
            Ok(trailers) => sink(token, events::ended(trailers, &Status::ok())),
            Err(status) => report_failure(&sink, token, &status, &upstream.keepalive),
        }
    });
    (tx, handle.abort_handle())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/2 server that takes every request and never answers.
    async fn silent_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(socket).await else {
                        return;
                    };
                    let mut held = Vec::new();
                    while let Some(Ok(request)) = conn.accept().await {
                        held.push(request);
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn a_unary_call_past_its_deadline_is_deadline_exceeded() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let addr = rt.block_on(silent_server());
        let _guard = rt.enter();
        for _ in 0..5 {
            let upstream = connect(
                &addr.to_string(),
                &TlsOptions::default(),
                &Keepalive::default(),
            )
            .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let sink: Sink = Arc::new(move |token, events| {
                let _ = tx.send((token, events));
            });
            let target = GrpcTarget {
                upstream: "1".into(),
                service: "pkg.Svc".into(),
                method: "Sleep".into(),
                metadata: vec![],
            };
            unary(rt.handle(), upstream, 7, target, Vec::new(), 100, sink);
            let (token, events) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(token, 7);
            match &events[..] {
                [GrpcEvent::Close(4, message)] => {
                    assert_eq!(message, b"deadline of 100 ms exceeded")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
