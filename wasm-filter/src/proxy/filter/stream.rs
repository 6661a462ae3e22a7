//! One HTTP exchange's state, kept between the host's callbacks.

use std::rc::Rc;

use crate::code::Code;
use crate::framing::{Compression, FrameDecoder};
use crate::status::Status;

use super::super::callout::host::Call;
use super::super::config::FilterConfig;
use super::super::held::{Held, OverBudget};
use super::super::host::HeaderMap;
use super::super::messages::Route;
use super::super::metrics::{Cause, Meter};

pub(super) struct Stream {
    pub(super) config: Rc<FilterConfig>,
    /// Shared, so that callbacks take it without copying the binding.
    pub(super) route: Option<Rc<Route>>,
    /// Where the exchange stands; what each callback may still do.
    pub(super) phase: Phase,
    /// Callout mode: the call that answers this request.
    pub(super) call: Option<Call>,
    /// The response's `grpc-encoding`.
    pub(super) encoding: Compression,
    /// This stream's share of what the VM's streams hold of responses.
    pub(super) held: Held,
    /// The gRPC request was written from the request line alone, before
    /// any body (see `transcode_callbacks::body_from_the_request_line`).
    pub(super) request_written: bool,
    /// The call's metrics.
    pub(super) meter: Meter,
    /// The response headers, held back until the answer is known (see
    /// `transcode_callbacks::response_headers`): they leave made its own.
    pub(super) held_headers: Option<HeaderMap>,
    /// A response body or trailers callback came: the host passes what
    /// follows headers the filter holds.
    pub(super) response_went_on: bool,
}

/// Who decided how an exchange ended: the filter itself (its error is a
/// transcoding failure), or the upstream's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Filter,
    Upstream,
}

impl Stream {
    pub(super) fn new(config: Rc<FilterConfig>) -> Self {
        Stream {
            config,
            route: None,
            phase: Phase::Open,
            call: None,
            encoding: Compression::Identity,
            held: Held::default(),
            request_written: false,
            meter: Meter::default(),
            held_headers: None,
            response_went_on: false,
        }
    }

    /// Ends the call's metrics with `code`, once.
    pub(super) fn end(&mut self, code: Code, origin: Origin) {
        let failure = (origin == Origin::Filter && code != Code::Ok).then(|| {
            if self.meter.has_sent() {
                Cause::Response
            } else {
                Cause::Request
            }
        });
        self.meter.end(code, failure);
    }

    /// Makes the stream's share of the VM's budget what its phase holds
    /// now, after a callback: a share only grows within the budget where
    /// the bytes are taken (`make_room`, `stream_chunk`), so here it is
    /// given back, or kept as checked.
    pub(super) fn settle_held(&mut self) {
        let _ = self.held.set(self.held_bytes(), usize::MAX);
    }

    /// What the stream holds of its response: its phase's bytes, and the
    /// headers it holds back.
    pub(super) fn held_bytes(&self) -> usize {
        self.phase.held_bytes() + self.held_header_bytes()
    }

    /// What the response headers held back take.
    pub(super) fn held_header_bytes(&self) -> usize {
        self.held_headers.as_ref().map_or(0, HeaderMap::held_bytes)
    }

    /// Makes the stream's share `bytes` of response and its held headers,
    /// within the VM's budget.
    pub(super) fn hold(&mut self, bytes: usize) -> Result<(), OverBudget> {
        let bytes = bytes.saturating_add(self.held_header_bytes());
        self.held.set(bytes, self.config.max_held_response_bytes)
    }

    /// Holds the response headers back, if the VM's budget has room for
    /// them; else hands them back, with what the budget said.
    pub(super) fn hold_headers(
        &mut self,
        headers: HeaderMap,
    ) -> Result<(), (HeaderMap, OverBudget)> {
        let bytes = self.phase.held_bytes() + headers.held_bytes();
        if let Err(over) = self.hold(bytes) {
            return Err((headers, over));
        }
        self.held_headers = Some(headers);
        Ok(())
    }
}

/// An exchange's phase. Transcoding moves from `Open` through one of the
/// response phases to `Answered`, `Dropping` or `Failed`; callout mode
/// goes from `Open` to `Answered` when its reply is sent.
pub(super) enum Phase {
    /// Nothing decided yet: the request is on its way, or the response is
    /// a whole body not yet seen.
    Open,
    /// The host holds the response body (the filter paused it) until its
    /// end, which becomes one JSON reply; with the bytes of its one chunk
    /// so far when the filter has read them (Envoy, a unary reply), so
    /// that trailers right after need not read them again.
    Holding(Option<Vec<u8>>),
    /// A unary message too large for the host's buffer, taken into the
    /// module chunk by chunk: the bytes so far.
    Carrying(Vec<u8>),
    /// A response streamed message by message: the frames still incomplete.
    Streaming(FrameDecoder),
    /// ngx_wasm_module: the reply decided at the response headers, whose
    /// body replaces the first body chunk.
    ReplyInFirstChunk(Vec<u8>),
    /// The reply is written into the body: the chunks that follow are
    /// dropped, and the trailers left alone.
    Dropping,
    /// A carried unary message's JSON has left: data that follows is an
    /// error (as a second message is on the held path), named in the
    /// trailers; without any, the trailers are left alone.
    Sent,
    /// The filter wrote this error into the body after the headers had
    /// left: the chunks that follow are dropped, and trailers that come
    /// later are made to say the same (not the upstream's OK).
    Failed(Status),
    /// The reply is decided (a local reply, or the body written at its
    /// end): the callbacks that follow leave the exchange alone.
    Answered,
}

impl Phase {
    /// Whether the exchange's reply is decided, so that nothing more may
    /// be sent or transcoded.
    pub(super) fn is_decided(&self) -> bool {
        matches!(
            self,
            Phase::Answered
                | Phase::Dropping
                | Phase::Sent
                | Phase::Failed(_)
                | Phase::ReplyInFirstChunk(_)
        )
    }

    /// The bytes this phase holds in the module's memory.
    fn held_bytes(&self) -> usize {
        match self {
            Phase::Holding(Some(seen)) => seen.capacity(),
            Phase::Carrying(held) => held.capacity(),
            Phase::Streaming(decoder) => decoder.capacity(),
            _ => 0,
        }
    }

    /// The bytes of a `Holding` phase whose chunk the filter read (the
    /// whole body the host holds), which becomes `Open`; any other phase
    /// stays and gives nothing.
    pub(super) fn take_seen(&mut self) -> Option<Vec<u8>> {
        match std::mem::replace(self, Phase::Open) {
            Phase::Holding(Some(seen)) => Some(seen),
            other => {
                *self = other;
                None
            }
        }
    }

    /// The bytes of a `Carrying` phase, which becomes `Open`; any other
    /// phase stays and carries nothing.
    pub(super) fn take_carried(&mut self) -> Vec<u8> {
        match std::mem::replace(self, Phase::Open) {
            Phase::Carrying(held) => held,
            other => {
                *self = other;
                Vec::new()
            }
        }
    }
}
