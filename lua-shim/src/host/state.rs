//! What the proxy-wasm host keeps between calls into the module: the HTTP
//! contexts' headers and bodies, the buffers of the gRPC callback in
//! progress, and what the module asked for (replies, calls, messages).

use std::collections::hash_map::Entry;

use grpc_wasm::Code;
use rustc_hash::FxHashMap as HashMap;

use wasmtime::{Memory, TypedFunc};

use super::metrics::Metrics;
use crate::call::{CallId, GrpcTarget, HeaderBlock, Token};

#[derive(Default)]
pub struct HttpContext {
    pub request_headers: HeaderBlock,
    pub request_body: Vec<u8>,
}

/// A `proxy_send_local_response` the module made for an HTTP context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub http_status: u32,
    pub body: Vec<u8>,
    pub headers: HeaderBlock,
}

impl LocalReply {
    /// The call's gRPC status code as the module answered it, by the
    /// core's rule: a missing or malformed `grpc-status` is UNKNOWN. Both
    /// ways into Lua hand it over, so that Lua parses no status itself.
    pub fn grpc_code(&self) -> Code {
        self.headers
            .get("grpc-status")
            .and_then(Code::from_header)
            .unwrap_or(Code::Unknown)
    }
}

/// What the module asked the host to do with gRPC; carried out by the
/// transport once the callback has returned.
#[derive(Debug)]
pub enum GrpcCommand {
    Call {
        token: Token,
        target: GrpcTarget,
        message: Vec<u8>,
        timeout_ms: u32,
        /// The HTTP context (the shim's call) that opened it.
        context: CallId,
    },
    Stream {
        token: Token,
        target: GrpcTarget,
        /// The HTTP context (the shim's call) that opened it.
        context: CallId,
    },
    Send {
        token: Token,
        message: Vec<u8>,
        /// False: this message goes uncompressed in a compressed call.
        compress: bool,
    },
    Close {
        token: Token,
    },
    Cancel {
        token: Token,
    },
}

/// Everything the module produced during one host call.
#[derive(Debug, Default)]
pub struct Outputs {
    pub replies: Vec<(CallId, LocalReply)>,
    pub commands: Vec<GrpcCommand>,
    /// Streamed messages handed over with `grpc_wasm.deliver`: context, JSON.
    pub messages: Vec<(CallId, Vec<u8>)>,
}

#[derive(Default)]
pub struct HostState {
    pub memory: Option<Memory>,
    pub allocate: Option<TypedFunc<u32, u32>>,
    /// The context host calls act on (`proxy_set_effective_context`).
    pub effective: u32,
    pub http: HashMap<u32, HttpContext>,
    pub plugin_config: Vec<u8>,
    /// The gRPC callback in progress: message, metadata, status.
    pub grpc_message: Vec<u8>,
    pub grpc_initial: HeaderBlock,
    pub grpc_trailing: HeaderBlock,
    pub grpc_status: (u32, Vec<u8>),
    /// Foreign function arguments of the call in progress.
    pub next_token: u32,
    /// Tokens of the calls and streams not yet over: after 2^32 calls the
    /// counter wraps, and a stream may still hold an old one.
    pub live_tokens: HashMap<Token, TokenKind>,
    pub tick_ms: u32,
    /// The module's last error-level log line (a refused configuration).
    pub last_error: String,
    pub outputs: Outputs,
    /// A trap in a call the host made into the module from a host
    /// function; the outer call fails with it.
    pub trapped: Option<String>,
    /// What the module may grow to (unlimited unless a test lowers it).
    pub limits: wasmtime::StoreLimits,
    /// While the client feeds a message its caller sends uncompressed: the
    /// message the module sends meanwhile goes so.
    pub uncompressed_sends: bool,
    /// The module's metrics (see `metrics`).
    pub metrics: Metrics,
}

/// What a token names. A unary call that succeeds ends with its message:
/// no close follows it (Envoy's order), so its token is over there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// `proxy_grpc_call`.
    Call,
    /// `proxy_grpc_stream`.
    Stream,
}

impl HostState {
    /// Tokens as Envoy numbers them: calls and streams never collide, and
    /// a token still held is never handed out again.
    pub fn token(&mut self, kind: TokenKind) -> Token {
        loop {
            self.next_token = self.next_token.wrapping_add(1).max(1);
            let token = Token(self.next_token);
            if let Entry::Vacant(entry) = self.live_tokens.entry(token) {
                entry.insert(kind);
                return token;
            }
        }
    }

    /// The call or stream `token` ended: its token may be used again.
    pub fn release(&mut self, token: Token) {
        self.live_tokens.remove(&token);
    }

    /// A message arrived for `token`: a unary call's message is its end.
    pub fn message_arrived(&mut self, token: Token) {
        if self.live_tokens.get(&token) == Some(&TokenKind::Call) {
            self.release(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_skip_zero_and_every_token_still_held_across_the_wrap() {
        let mut state = HostState {
            next_token: u32::MAX - 2,
            ..HostState::default()
        };
        let held = state.token(TokenKind::Stream);
        assert_eq!(held, Token(u32::MAX - 1));
        state.next_token = u32::MAX - 3;
        // u32::MAX - 2 is free, u32::MAX - 1 is held, then u32::MAX, then 0
        // is never a token.
        assert_eq!(state.token(TokenKind::Stream), Token(u32::MAX - 2));
        assert_eq!(state.token(TokenKind::Stream), Token(u32::MAX));
        assert_eq!(state.token(TokenKind::Stream), Token(1));
        state.release(Token(u32::MAX));
        state.next_token = u32::MAX - 3;
        assert_eq!(state.token(TokenKind::Stream), Token(u32::MAX));
        assert_eq!(state.token(TokenKind::Stream), Token(2));
    }

    #[test]
    fn a_unary_call_is_over_at_its_message_and_a_stream_at_its_close() {
        let mut state = HostState::default();
        let call = state.token(TokenKind::Call);
        let stream = state.token(TokenKind::Stream);
        state.message_arrived(stream);
        assert_eq!(state.live_tokens.len(), 2);
        state.message_arrived(call);
        assert_eq!(state.live_tokens.keys().collect::<Vec<_>>(), [&stream]);
        state.release(stream);
        assert!(state.live_tokens.is_empty());
    }
}
