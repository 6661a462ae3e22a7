//! A gRPC peer that misbehaves at the wire level, below what a tonic
//! service can be made to do: the answer is chosen by the request's
//! `x-rogue` header, so one server serves every fault test.
//!
//! - `gzip-bomb`: a 200 with `grpc-encoding: gzip` and [`BOMB_FRAMES`]
//!   gzip frames, each a `LargeReply` of [`BOMB_MESSAGE`] zero bytes that
//!   compresses to about a kilobyte, then `grpc-status: 0`: a unary answer
//!   that inflates to a gigabyte.
//! - `large-first-of-three`: three messages that read as `Item {index: 1}`,
//!   `{index: 2}`, `{index: 3}`, the first carrying [`LARGE_UNKNOWN`] bytes
//!   in a field `Item` does not define; then `grpc-status: 0`.
//! - `frame-over-limit`: a frame whose header declares [`HUGE_FRAME`] bytes,
//!   [`CUT_AFTER`] of them, then `grpc-status: 0`.
//! - `cut-message`: a frame whose header declares a megabyte, [`CUT_AFTER`]
//!   of it, then `grpc-status: 0`.
//! - `declared-then-wait`: a frame whose header declares [`DECLARED`]
//!   bytes, [`SENT_OF_DECLARED`] of them, then [`WAIT`] of silence (so that
//!   many such answers are held at once), then `grpc-status: 0`.

use bytes::Bytes;
use grpc_wasm::framing::{encode_frame, Compression};
use h2::server::{self, SendResponse};
use http::{HeaderMap, Request, Response};
use prost::Message;
use tokio::net::{TcpListener, TcpStream};

use crate::pb::grpcwasm::testing::LargeReply;
use crate::BoxError;

pub const LARGE_UNKNOWN: usize = 100_000;
pub const HUGE_FRAME: u32 = 100 << 20;
pub const CUT_AFTER: usize = 100_000;
pub const BOMB_FRAMES: usize = 300;
pub const BOMB_MESSAGE: usize = 1 << 20;
pub const DECLARED: u32 = 8_000_000;
pub const SENT_OF_DECLARED: usize = 20_000;
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves connections until the listener fails; each connection and each
/// request runs on its own task.
pub async fn serve(listener: TcpListener) -> Result<(), BoxError> {
    let bomb = Bytes::from(gzip_bomb()?);
    loop {
        let (socket, _) = listener.accept().await?;
        let bomb = bomb.clone();
        tokio::spawn(async move {
            let _ = connection(socket, bomb).await;
        });
    }
}

async fn connection(socket: TcpStream, bomb: Bytes) -> Result<(), h2::Error> {
    let _ = socket.set_nodelay(true);
    let mut conn = server::handshake(socket).await?;
    while let Some(request) = conn.accept().await {
        let (request, respond) = request?;
        let bomb = bomb.clone();
        tokio::spawn(async move {
            let _ = answer(request, respond, bomb).await;
        });
    }
    Ok(())
}

async fn answer(
    request: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
    bomb: Bytes,
) -> Result<(), BoxError> {
    let mode = request
        .headers()
        .get("x-rogue")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    // The request body is read to its end first, as a server would.
    let mut body = request.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    match mode.as_str() {
        "gzip-bomb" => {
            let head = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-encoding", "gzip")
                .body(())?;
            let mut send = respond.send_response(head, false)?;
            send.send_data(bomb, false)?;
            send.send_trailers(trailers(0, "")?)?;
        }
        "large-first-of-three" => send_then_ok(respond, items_with_a_large_first()?)?,
        "frame-over-limit" => send_then_ok(respond, declared_then_cut(HUGE_FRAME))?,
        "cut-message" => send_then_ok(respond, declared_then_cut(1 << 20))?,
        "declared-then-wait" => {
            let head = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .body(())?;
            let mut send = respond.send_response(head, false)?;
            let mut body = declared_then_cut(DECLARED);
            body.truncate(5 + SENT_OF_DECLARED);
            send.send_data(Bytes::from(body), false)?;
            tokio::time::sleep(WAIT).await;
            send.send_trailers(trailers(0, "")?)?;
        }
        other => {
            let head = Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "12")
                .header("grpc-message", format!("unknown x-rogue mode '{other}'"))
                .body(())?;
            respond.send_response(head, true)?;
        }
    }
    Ok(())
}

/// A gRPC 200, `body` as one DATA frame, then `grpc-status: 0`.
fn send_then_ok(mut respond: SendResponse<Bytes>, body: Vec<u8>) -> Result<(), BoxError> {
    let head = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())?;
    let mut send = respond.send_response(head, false)?;
    send.send_data(Bytes::from(body), false)?;
    send.send_trailers(trailers(0, "")?)?;
    Ok(())
}

fn items_with_a_large_first() -> Result<Vec<u8>, BoxError> {
    // Field 1 (index) as a varint, and on the first an unknown field 15 of
    // LARGE_UNKNOWN bytes.
    let mut first = vec![0x08, 1, 0x7a];
    prost::encoding::encode_varint(LARGE_UNKNOWN as u64, &mut first);
    first.resize(first.len() + LARGE_UNKNOWN, b'x');
    let mut body = encode_frame(&first, Compression::Identity)?;
    for index in [2u8, 3] {
        body.extend(encode_frame(&[0x08, index], Compression::Identity)?);
    }
    Ok(body)
}

/// A frame header declaring `declared` bytes, and only CUT_AFTER of them.
fn declared_then_cut(declared: u32) -> Vec<u8> {
    let mut body = vec![0];
    body.extend(declared.to_be_bytes());
    body.resize(5 + CUT_AFTER, 0);
    body
}

fn trailers(code: u32, message: &str) -> Result<HeaderMap, BoxError> {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", code.to_string().parse()?);
    if !message.is_empty() {
        map.insert("grpc-message", message.parse()?);
    }
    Ok(map)
}

/// [`BOMB_FRAMES`] copies of one gzip frame: compressing once keeps the
/// server cheap, and the receiver cannot tell.
fn gzip_bomb() -> Result<Vec<u8>, BoxError> {
    let message = LargeReply {
        payload: vec![0; BOMB_MESSAGE],
    }
    .encode_to_vec();
    let frame = encode_frame(&message, Compression::Gzip)?;
    Ok(frame.repeat(BOMB_FRAMES))
}
