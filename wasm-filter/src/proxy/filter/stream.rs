//! One HTTP exchange's state, kept between the host's callbacks.

use std::rc::Rc;

use crate::framing::{Compression, FrameDecoder};

use super::super::callout_host::Call;
use super::super::config::FilterConfig;
use super::super::transcoder::Route;

pub(super) struct Stream {
    pub(super) config: Rc<FilterConfig>,
    /// Shared, so that callbacks take it without copying the binding.
    pub(super) route: Option<Rc<Route>>,
    /// The reply was already decided (a trailers-only error); drop the rest.
    pub(super) answered: bool,
    /// The response outgrew max_response_bytes after its headers had left.
    pub(super) overflowed: bool,
    /// The filter has asked the host to hold the response body.
    pub(super) holding_response: bool,
    /// ngx_wasm_module: the reply decided at the response headers, whose
    /// body replaces the first body chunk.
    pub(super) pending_body: Option<String>,
    /// A unary response body taken out of the host's buffer so far.
    pub(super) held: Vec<u8>,
    /// Callout mode: the call that answers this request.
    pub(super) call: Option<Call>,
    /// A response streamed message by message: the frames still incomplete.
    pub(super) decoder: Option<FrameDecoder>,
    /// The response's `grpc-encoding`.
    pub(super) encoding: Compression,
}
