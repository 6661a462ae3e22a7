//! One gRPC call over h2, as a task of the connection's executor: its
//! request (headers, then the messages its outbox gets), and its answer
//! turned into the events Envoy reports, in Envoy's order.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use grpc_wasm::framing::{Compression, FrameDecoder};
use grpc_wasm::limits::DEFAULT_MAX_MESSAGE_BYTES;
use grpc_wasm::{Code, Status};
use h2::client::SendRequest;

use super::super::exchange;
use super::super::gate::Gate;
use crate::call::events::{self, close, close_as};
use crate::call::{GrpcEvent, HeaderBlock, Produced, Token};
use crate::sync::lock;

/// A call's outgoing half, shared between the connection's methods and
/// the call's task. Messages stay here until the server's windows let h2
/// send them: h2 itself would queue any amount.
#[derive(Default)]
pub(super) struct Outbox {
    messages: VecDeque<Bytes>,
    closed: bool,
    task: Option<Waker>,
    /// A stream's gate, which counts the bytes queued here for its caller.
    gate: Option<Arc<Gate>>,
    /// How the call's messages are compressed (each may go uncompressed).
    pub(super) compression: Compression,
}

impl Outbox {
    /// A unary call's outbox holds its one message, and is closed.
    pub(super) fn new(
        first: Option<Bytes>,
        closed: bool,
        gate: Option<Arc<Gate>>,
        compression: Compression,
    ) -> Outbox {
        Outbox {
            messages: first.into_iter().collect(),
            closed,
            task: None,
            gate,
            compression,
        }
    }

    pub(super) fn push(&mut self, message: Bytes) {
        if let Some(gate) = &self.gate {
            gate.queued(message.len());
        }
        self.messages.push_back(message);
        self.wake();
    }

    /// The request's end: nothing follows what is queued.
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.wake();
    }

    fn wake(&mut self) {
        if let Some(waker) = self.task.take() {
            waker.wake();
        }
    }

    /// `bytes` of the front message went to h2.
    fn sent(&mut self, bytes: usize) {
        if let Some(gate) = &self.gate {
            gate.sent(bytes);
        }
    }
}

/// Events a task produced, taken out after each drive.
pub(super) type Events = Arc<Mutex<Produced>>;

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
        while let Some(front) = outbox.messages.front_mut() {
            // Only as much as the windows allow goes to h2; h2 wakes this
            // task when the server grants more.
            self.body.reserve_capacity(front.len());
            let granted = match self.body.poll_capacity(cx) {
                Poll::Ready(Some(Ok(n))) if n > 0 => n.min(front.len()),
                Poll::Ready(Some(Ok(_))) | Poll::Pending => return,
                // The stream is reset or gone: the response side reports why.
                Poll::Ready(Some(Err(_)) | None) => {
                    self.sending = false;
                    return;
                }
            };
            let piece = front.split_to(granted);
            if front.is_empty() {
                outbox.messages.pop_front();
            }
            outbox.sent(piece.len());
            if self.body.send_data(piece, false).is_err() {
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
pub(super) struct Call {
    pub(super) token: Token,
    pub(super) unary: bool,
    /// A stream's backpressure: its data is taken only while this is open.
    pub(super) gate: Option<Arc<Gate>>,
}

/// Call `call`'s task: it runs to the call's end, then leaves its last
/// events in `events`.
pub(super) async fn task(
    send: SendRequest<Bytes>,
    request: http::Request<()>,
    outbox: Arc<Mutex<Outbox>>,
    call: Call,
    events: Events,
) {
    let produced = run_call(send, request, outbox, &call, &events).await;
    lock(&events).push((call.token, produced));
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
    let failed = |e: h2::Error| vec![close(&super::super::h2_failure(&e))];
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
    // The server may compress with what the request offered; anything
    // else it cannot expect this side to read (gRPC's compression spec).
    let encoding = match exchange::response_encoding(&parts.headers) {
        Ok(encoding) => encoding,
        Err(why) => return vec![close_as(Code::Unimplemented, &why)],
    };
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_BYTES, encoding);
    if unary {
        // A unary answer is one message; without a cap on the sum, a server
        // sending frame after frame would have them all held here until the
        // trailers, and the worker would run out of memory first.
        decoder.limit_total(DEFAULT_MAX_MESSAGE_BYTES);
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
        if !unary {
            // What one received chunk inflates to is bounded, as in the
            // filter (`messages::stream_piece`): the gate closes only once
            // the caller's queue is full, after this drive, and a gzip frame
            // of a few KiB may inflate to 4 MiB.
            decoder.limit_total(DEFAULT_MAX_MESSAGE_BYTES);
        }
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
    let status = events::status_of(&trailers)
        .unwrap_or_else(|| Status::missing_grpc_status("the server's response"));
    let trailing = pairs(&trailers);
    if unary && status.is_ok() {
        return events::unary_answer(initial.unwrap_or_default(), trailing, received);
    }
    events::ended(trailing, &status)
}
