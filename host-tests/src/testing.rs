//! grpcwasm.testing.Testing: a service that misbehaves on request, so that
//! every failure path of a client can be driven by a real server.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::body::Body;
use tonic::metadata::{KeyAndValueRef, MetadataKey, MetadataMap};
use tonic::server::NamedService;
use tonic::{Code, Request, Response, Status};
use tower_service::Service;

use crate::pb::google::rpc::{bad_request, BadRequest, ErrorInfo};
use crate::pb::grpcwasm::testing::testing_server::{self, TestingServer};
use crate::pb::grpcwasm::testing::{
    Empty, FailRequest, Item, LargeReply, LargeRequest, MetadataReply, NestReply, NestRequest,
    SleepReply, SleepRequest, StreamRequest,
};

/// The largest payload Large and EchoBytes handle.
pub const MAX_PAYLOAD: usize = 64 << 20;
/// The message size limit: a payload of MAX_PAYLOAD plus the field's tag and
/// length prefix, so that a maximal payload still fits.
pub const MAX_MESSAGE: usize = MAX_PAYLOAD + 16;
/// Sleep refuses longer naps, so a typo cannot park a task for days.
const MAX_SLEEP: Duration = Duration::from_secs(3600);
/// How long before the caller's deadline Sleep gives up, so that its
/// DEADLINE_EXCEEDED wins the race against tonic's timeout layer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(5);
/// Nest's deepest answer: about 4.5 MB of Any headers.
const MAX_NEST: usize = 100_000;
/// Request headers with this prefix are echoed by EchoMetadata.
const ECHO_PREFIX: &str = "x-echo-";

pub const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";
pub const BAD_REQUEST_TYPE_URL: &str = "type.googleapis.com/google.rpc.BadRequest";

#[derive(Debug, Default, Clone, Copy)]
pub struct Testing;

/// The service, ready for `Server::add_service`: message limits raised to
/// [`MAX_MESSAGE`] and wrapped so that EchoMetadata can send trailers.
pub fn service() -> WithTrailers<TestingServer<Testing>> {
    WithTrailers::new(
        TestingServer::new(Testing)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
    )
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl testing_server::Testing for Testing {
    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        let code = failure_code(req.code)?;
        if req.with_details {
            let details = status_details(req.code, &req.message);
            return Err(Status::with_details(code, req.message, details));
        }
        Err(Status::new(code, req.message))
    }

    /// Past the caller's deadline this answers DEADLINE_EXCEEDED itself,
    /// [`DEADLINE_MARGIN`] early: tonic's own timeout would answer CANCELLED,
    /// which is not what a gRPC server should send.
    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<SleepReply>, Status> {
        let budget = request_timeout(request.metadata());
        let nap = sleep_duration(request.into_inner().millis)?;
        let started = Instant::now();
        if let Some(budget) = budget.map(|b| b.saturating_sub(DEADLINE_MARGIN)) {
            if nap >= budget {
                tokio::time::sleep(budget).await;
                return Err(Status::deadline_exceeded(
                    "deadline exceeded while sleeping",
                ));
            }
        }
        tokio::time::sleep(nap).await;
        let slept = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        Ok(Response::new(SleepReply {
            slept_millis: slept,
        }))
    }

    async fn echo_metadata(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<MetadataReply>, Status> {
        let received = request.metadata();
        let mut response = Response::new(MetadataReply {
            metadata: ascii_metadata(received),
        });
        let mut trailers = MetadataMap::new();
        echo_prefixed(received, response.metadata_mut(), &mut trailers);
        response
            .extensions_mut()
            .insert(ExtraTrailers(trailers.into_headers()));
        Ok(response)
    }

    type StreamThenFailStream = BoxStream<Item>;

    async fn stream_then_fail(
        &self,
        request: Request<StreamRequest>,
    ) -> Result<Response<Self::StreamThenFailStream>, Status> {
        let req = request.into_inner();
        let end = final_status(req.code, req.message)?;
        if req.count < 0 {
            return Err(Status::invalid_argument("count must be >= 0"));
        }
        let interval = sleep_duration(req.interval_millis)?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(stream_items(req.count, interval, end, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn large(&self, request: Request<LargeRequest>) -> Result<Response<LargeReply>, Status> {
        let size = payload_size(request.into_inner().size)?;
        Ok(Response::new(LargeReply {
            payload: pattern(size),
        }))
    }

    async fn echo_bytes(
        &self,
        request: Request<LargeReply>,
    ) -> Result<Response<LargeReply>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    async fn nest(&self, request: Request<NestRequest>) -> Result<Response<NestReply>, Status> {
        let req = request.into_inner();
        let depth = usize::try_from(req.depth)
            .ok()
            .filter(|d| (1..=MAX_NEST).contains(d))
            .ok_or_else(|| Status::invalid_argument(format!("depth must be 1..={MAX_NEST}")))?;
        let value = nested_any(depth);
        if req.in_details {
            let status = crate::pb::google::rpc::Status {
                code: Code::Internal as i32,
                message: "nested details".into(),
                details: vec![value],
            };
            return Err(Status::with_details(
                Code::Internal,
                "nested details",
                Bytes::from(status.encode_to_vec()),
            ));
        }
        Ok(Response::new(NestReply { value: Some(value) }))
    }
}

const ANY_TYPE_URL: &str = "type.googleapis.com/google.protobuf.Any";
/// This service's own Empty, so that a client with only testing.proto
/// loaded knows every type in the answer.
const EMPTY_TYPE_URL: &str = "type.googleapis.com/grpcwasm.testing.Empty";

/// An Any of an Any ... `depth` Anys in all, around an Empty. Built from
/// the inside out in one pass: encoding each level anew would copy the
/// whole inner message once per level.
pub fn nested_any(depth: usize) -> prost_types::Any {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let innermost = prost_types::Any {
        type_url: EMPTY_TYPE_URL.into(),
        value: Vec::new(),
    };
    if depth <= 1 {
        return innermost;
    }
    // Each level between the outermost and the innermost Any is its
    // type_url field, then the key and length of its value field.
    let mut inner_len = innermost.encoded_len();
    let mut headers = Vec::with_capacity(depth - 2);
    for _ in 2..depth {
        let mut header = Vec::with_capacity(48);
        prost::encoding::string::encode(1, &ANY_TYPE_URL.to_string(), &mut header);
        encode_key(2, WireType::LengthDelimited, &mut header);
        encode_varint(inner_len as u64, &mut header);
        inner_len += header.len();
        headers.push(header);
    }
    let mut value = Vec::with_capacity(inner_len);
    for header in headers.iter().rev() {
        value.extend_from_slice(header);
    }
    value.extend_from_slice(&innermost.encode_to_vec());
    prost_types::Any {
        type_url: ANY_TYPE_URL.into(),
        value,
    }
}

fn failure_code(code: i32) -> Result<Code, Status> {
    if (1..=16).contains(&code) {
        Ok(Code::from_i32(code))
    } else {
        Err(Status::invalid_argument("code must be 1..16"))
    }
}

/// The end of a StreamThenFail stream: `None` for OK.
fn final_status(code: i32, message: String) -> Result<Option<Status>, Status> {
    match code {
        0 => Ok(None),
        1..=16 => Ok(Some(Status::new(Code::from_i32(code), message))),
        _ => Err(Status::invalid_argument("code must be 0..16")),
    }
}

fn sleep_duration(millis: i64) -> Result<Duration, Status> {
    let millis =
        u64::try_from(millis).map_err(|_| Status::invalid_argument("millis must be >= 0"))?;
    let nap = Duration::from_millis(millis);
    if nap > MAX_SLEEP {
        return Err(Status::invalid_argument("millis must be <= 3600000"));
    }
    Ok(nap)
}

/// The caller's timeout from grpc-timeout: up to 8 digits and a unit.
fn request_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    parse_grpc_timeout(value)
}

/// The one grpc-timeout parser of the project lives in the core.
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    grpc_wasm::timeout::parse_timeout(value).ok()
}

fn payload_size(size: i32) -> Result<usize, Status> {
    match usize::try_from(size) {
        Ok(size) if size <= MAX_PAYLOAD => Ok(size),
        _ => Err(Status::invalid_argument(format!(
            "size must be 0..={MAX_PAYLOAD}"
        ))),
    }
}

/// Bytes `i % 251`: a prime period, so a shifted or truncated copy is caught.
pub fn pattern(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8).collect()
}

/// An encoded google.rpc.Status for grpc-status-details-bin.
pub fn status_details(code: i32, message: &str) -> Bytes {
    let error_info = ErrorInfo {
        reason: "TEST_FAILURE".into(),
        domain: "grpc-wasm.test".into(),
        metadata: HashMap::from([("requested_code".to_string(), code.to_string())]),
    };
    let bad_request = BadRequest {
        field_violations: vec![bad_request::FieldViolation {
            field: "code".into(),
            description: "requested failure".into(),
        }],
    };
    let status = crate::pb::google::rpc::Status {
        code,
        message: message.to_string(),
        details: vec![
            any(ERROR_INFO_TYPE_URL, &error_info),
            any(BAD_REQUEST_TYPE_URL, &bad_request),
        ],
    };
    Bytes::from(status.encode_to_vec())
}

fn any(type_url: &str, message: &impl Message) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url.to_string(),
        value: message.encode_to_vec(),
    }
}

async fn stream_items(
    count: i32,
    interval: Duration,
    end: Option<Status>,
    tx: mpsc::Sender<Result<Item, Status>>,
) {
    for index in 0..count {
        if index > 0 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        if tx.send(Ok(Item { index })).await.is_err() {
            return;
        }
    }
    if let Some(status) = end {
        let _ = tx.send(Err(status)).await;
    }
}

/// Every ASCII entry; repeated keys have their values joined with ",".
fn ascii_metadata(metadata: &MetadataMap) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    for entry in metadata.iter() {
        let KeyAndValueRef::Ascii(key, value) = entry else {
            continue;
        };
        let value = String::from_utf8_lossy(value.as_encoded_bytes()).into_owned();
        out.entry(key.as_str().to_string())
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(&value);
            })
            .or_insert(value);
    }
    out
}

/// Copies `x-echo-*` entries to `headers` under the same name and to
/// `trailers` as `{name}-trailer` (binary keys: `{stem}-trailer-bin`).
fn echo_prefixed(received: &MetadataMap, headers: &mut MetadataMap, trailers: &mut MetadataMap) {
    for entry in received.iter() {
        match entry {
            KeyAndValueRef::Ascii(key, value) if key.as_str().starts_with(ECHO_PREFIX) => {
                headers.append(key.clone(), value.clone());
                let name = format!("{}-trailer", key.as_str());
                if let Ok(trailer) = MetadataKey::from_bytes(name.as_bytes()) {
                    trailers.append(trailer, value.clone());
                }
            }
            KeyAndValueRef::Binary(key, value) if key.as_str().starts_with(ECHO_PREFIX) => {
                headers.append_bin(key.clone(), value.clone());
                let stem = key.as_str().strip_suffix("-bin").unwrap_or(key.as_str());
                let name = format!("{stem}-trailer-bin");
                if let Ok(trailer) = MetadataKey::from_bytes(name.as_bytes()) {
                    trailers.append_bin(trailer, value.clone());
                }
            }
            _ => {}
        }
    }
}

/// Trailers a handler wants sent next to grpc-status. Tonic has no API for
/// custom trailers on a successful call, so handlers put them in the response
/// extensions and [`WithTrailers`] merges them into the final frame.
#[derive(Debug, Clone, Default)]
pub struct ExtraTrailers(pub http::HeaderMap);

/// Wraps a generated server so that [`ExtraTrailers`] reach the wire.
#[derive(Debug, Clone)]
pub struct WithTrailers<S> {
    inner: S,
}

impl<S> WithTrailers<S> {
    pub fn new(inner: S) -> Self {
        WithTrailers { inner }
    }
}

impl<S: NamedService> NamedService for WithTrailers<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for WithTrailers<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let pending = self.inner.call(request);
        Box::pin(async move { Ok(attach_trailers(pending.await?)) })
    }
}

fn attach_trailers(response: http::Response<Body>) -> http::Response<Body> {
    let (mut parts, body) = response.into_parts();
    let Some(ExtraTrailers(extra)) = parts.extensions.remove::<ExtraTrailers>() else {
        return http::Response::from_parts(parts, body);
    };
    let body = Body::new(TrailerBody {
        inner: body,
        extra: Some(extra),
    });
    http::Response::from_parts(parts, body)
}

/// A body that adds `extra` to the trailers frame of `inner`.
struct TrailerBody {
    inner: Body,
    extra: Option<http::HeaderMap>,
}

impl TrailerBody {
    fn merge(&mut self, frame: Frame<Bytes>) -> Frame<Bytes> {
        let mut trailers = match frame.into_trailers() {
            Ok(trailers) => trailers,
            Err(frame) => return frame,
        };
        if let Some(extra) = self.extra.take() {
            for (name, value) in extra.iter() {
                trailers.append(name.clone(), value.clone());
            }
        }
        Frame::trailers(trailers)
    }
}

impl http_body::Body for TrailerBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        // Body is Unpin (it boxes its inner body), so no pin projection is needed.
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        Poll::Ready(frame.map(|result| result.map(|frame| this.merge(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_any_is_what_encoding_each_level_gives() {
        let mut slow = prost_types::Any {
            type_url: EMPTY_TYPE_URL.into(),
            value: Vec::new(),
        };
        for depth in 1..=300 {
            assert_eq!(nested_any(depth), slow, "depth {depth}");
            slow = prost_types::Any {
                type_url: ANY_TYPE_URL.into(),
                value: slow.encode_to_vec(),
            };
        }
    }

    #[test]
    fn pattern_wraps_at_251() {
        let p = pattern(600);
        assert_eq!(p.len(), 600);
        assert_eq!(
            (p[0], p[250], p[251], p[599]),
            (0, 250, 0, (599 % 251) as u8)
        );
    }

    #[test]
    fn sizes_and_codes_are_checked() {
        assert_eq!(payload_size(-1).unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(
            payload_size((MAX_PAYLOAD + 1) as i32).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(payload_size(MAX_PAYLOAD as i32).unwrap(), MAX_PAYLOAD);
        assert_eq!(failure_code(0).unwrap_err().message(), "code must be 1..16");
        assert_eq!(failure_code(17).unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(failure_code(16).unwrap(), Code::Unauthenticated);
        assert!(final_status(0, String::new()).unwrap().is_none());
        assert!(sleep_duration(-5).is_err());
    }

    #[test]
    fn grpc_timeout_header() {
        assert_eq!(parse_grpc_timeout("50m"), Some(Duration::from_millis(50)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123456789m", "5x", "-5m", "+5m", "5"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn echo_rules() {
        let mut received = MetadataMap::new();
        received.insert("x-echo-a", "1".parse().unwrap());
        received.insert("other", "2".parse().unwrap());
        received.insert_bin(
            "x-echo-b-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01"),
        );
        let (mut headers, mut trailers) = (MetadataMap::new(), MetadataMap::new());
        echo_prefixed(&received, &mut headers, &mut trailers);
        assert_eq!(headers.get("x-echo-a").unwrap(), "1");
        assert!(headers.get("other").is_none());
        assert_eq!(trailers.get("x-echo-a-trailer").unwrap(), "1");
        let bin = trailers.get_bin("x-echo-b-trailer-bin").unwrap();
        assert_eq!(bin.to_bytes().unwrap().as_ref(), b"\x00\x01");
        assert_eq!(
            headers
                .get_bin("x-echo-b-bin")
                .unwrap()
                .to_bytes()
                .unwrap()
                .as_ref(),
            b"\x00\x01"
        );
    }
}
