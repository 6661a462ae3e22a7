//! The bounds the core puts on what a peer controls, in one place: every
//! module that walks nested or repeated input takes its limit from here, so
//! that docs/limits.md has one source. The
//! shim's bounds on connections and Lua callers (not on messages) are in
//! `lua-shim/src/limits.rs`.

use std::cell::Cell;

/// How deep messages may nest: fields of message type, `Any` inside `Any`,
/// `Struct` / `ListValue` / `Value` inside each other, in decoding,
/// printing and parsing alike. Google's runtimes use 100 too. Each level
/// costs stack, and a wasm module's stack is small (the hosts give about
/// 512 KiB to 1 MiB): an unbounded walk would trap the module instead of
/// failing one call.
pub const MAX_NESTING: usize = 100;

/// How long a field path from a query string (`a.b.c=...`) may be, in
/// bytes; its segments are held to [`MAX_NESTING`], as each one is a
/// message level.
pub const MAX_FIELD_PATH_BYTES: usize = 1024;

/// The largest `max_request_bytes` / `max_response_bytes` a configuration
/// may set: 256 MiB. A wasm32 module has 4 GiB of memory in all, a message
/// is held several times over while it is carried, decoded and printed,
/// and a frame length a peer declares near `u32::MAX` would wrap a 32-bit
/// `usize` once the header is added; docs/limits.md gives it.
pub const MAX_BODY_LIMIT: usize = 256 << 20;

/// The largest `max_held_response_bytes` a configuration may set: 1 GiB,
/// a quarter of what a wasm32 module can address, so that the bytes held
/// for many streams at once leave room for decoding and printing them.
pub const MAX_HELD_LIMIT: usize = 1 << 30;

/// The default `max_held_response_bytes`: 128 MiB for all the streams of a
/// VM together, 32 responses of the default `max_response_bytes` at once
/// (or twice `max_response_bytes`, when that is more).
pub const DEFAULT_HELD_BYTES: usize = 128 << 20;

/// The JSON a response message may print to, per byte of its wire form
/// (and 64 KiB more; see `json::cost`): a packed list of enums with long
/// names once printed a 4 MiB message as 260 MB of JSON.
pub const MAX_JSON_PER_BYTE: usize = 8;

/// The JSON a printer keeps while it grows, per byte of the message's wire
/// form (and 64 KiB more): a string grows by copying itself into one twice
/// its size, so the JSON of a message near its limit is counted first,
/// then printed again into a string of its size (see `json::cost`). Most
/// messages print to less, and only once.
pub const KEPT_JSON_PER_BYTE: usize = 3;

/// The JSON slack beside [`MAX_JSON_PER_BYTE`] and [`KEPT_JSON_PER_BYTE`]:
/// 64 KiB, so that a small message's JSON is never cut by its ratio; also
/// the room a printer keeps ahead of its JSON before it grows.
pub const JSON_SLACK_BYTES: usize = 64 << 10;

/// How deep prost's decoder lets messages nest below the one it decodes:
/// prost's own recursion limit, mirrored by the wire printer, which must
/// refuse what prost refuses. The same 100 as [`MAX_NESTING`], counted
/// prost's way (a map entry lies at its map's level).
pub const PROST_DECODE_LEVELS: usize = 100;

/// How many `Any`s that give `"@type"` after other keys may nest, each read
/// again from the raw JSON of those keys. docs/limits.md: the row "an `Any` in a
/// request whose `"@type"` comes after other keys".
pub const MAX_ANY_REREADS: usize = 8;

/// How many keys an `Any` may give before its `"@type"`: each is kept (40
/// bytes natively) until the type is known. docs/limits.md: the same row.
pub const MAX_KEYS_BEFORE_TYPE: usize = 1024;

/// The default limit on one message and on a body (`max_request_bytes`,
/// `max_response_bytes`; in the shim, `max_queued_bytes` and a unary
/// answer's messages together): 4 MiB, as in gRPC. docs/limits.md: the request,
/// response and shim rows.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// A unary response message larger than this is carried by the module,
/// within `max_held_response_bytes`, rather than held in the host's
/// buffer. docs/limits.md: the row "what the module holds of responses".
pub const LARGE_MESSAGE_BYTES: u64 = 64 << 10;

/// The deadline of a callout whose client and configuration set none
/// (`callout.timeout_ms`): 10 s. docs/limits.md: the row "a call's deadline when
/// neither the client nor the configuration sets one".
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// The longest deadline a client's `grpc-timeout` may ask for by default
/// (`callout.max_timeout_ms`): five minutes, so that a client cannot park
/// calls (and their memory) in the proxy for hours. docs/limits.md: the row "a
/// client's `grpc-timeout`".
pub const DEFAULT_MAX_TIMEOUT_MS: u64 = 300_000;

/// The one period of every root's ticks: they enforce callout deadlines
/// and pace configuration fetches, so a deadline ends at most this late.
/// docs/limits.md: the same row.
pub const TICK_MS: u32 = 50;

/// The largest document a configuration fetch may bring: it is read into
/// the module whole. docs/limits.md: the row "a configuration document fetched by
/// `"fetch"`".
pub const MAX_DOCUMENT_BYTES: usize = 16 << 20;

/// The first wait before a failed configuration fetch is tried again;
/// each failure doubles it, up to [`MAX_FETCH_BACKOFF_MS`]. docs/limits.md: the
/// same row, and the ngx_wasm_module section.
pub const FIRST_FETCH_BACKOFF_MS: u64 = 1_000;

/// The longest wait between tries of a failing configuration fetch.
pub const MAX_FETCH_BACKOFF_MS: u64 = 30_000;

/// The longest `content_type` an `HttpBody` answer may carry: it is sent as
/// a header, and hosts refuse or cut longer header blocks. docs/limits.md: the row
/// "an `HttpBody` answer's `content_type`".
pub const MAX_CONTENT_TYPE_BYTES: usize = 1024;

/// How much of a Connect error answer's body is kept to read its JSON: an
/// error is a few hundred bytes, and a proxy's page in its place is read
/// only for its HTTP status. docs/limits.md: the row "a Connect error's body".
pub const MAX_CONNECT_ERROR_BYTES: usize = 64 << 10;

/// How much metadata a peer may end a call with inside the body (gRPC-Web's
/// trailers frame, Connect's end-of-stream message), bounded as a peer's
/// header block is (Envoy's defaults: 100 headers, 60 KiB): a body frame
/// may otherwise be as large as a message.
pub const MAX_TRAILER_ENTRIES: usize = 100;
pub const MAX_TRAILER_BYTES: usize = 64 << 10;

/// The error text for input that nests deeper than [`MAX_NESTING`].
pub fn nesting_error() -> String {
    format!("message nesting exceeds {MAX_NESTING} levels")
}

/// Counts the levels of one walk and refuses the one past [`MAX_NESTING`].
/// A `Cell`, so that walkers that borrow themselves shared can count too.
#[derive(Debug, Default)]
pub(crate) struct Depth(Cell<usize>);

impl Depth {
    /// One level down; past the limit, [`nesting_error`]. Each successful
    /// `enter` is paired with a [`Depth::leave`] once the level is walked.
    pub(crate) fn enter(&self) -> Result<(), String> {
        let level = self.0.get();
        if level >= MAX_NESTING {
            return Err(nesting_error());
        }
        self.0.set(level + 1);
        Ok(())
    }

    pub(crate) fn leave(&self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// The most `.proto` files one reflection load takes from a server.
pub const MAX_REFLECTED_FILES: usize = 1024;

/// The most bytes of encoded file descriptors one reflection load takes
/// from a server (a large API's set is a few MB).
pub const MAX_REFLECTED_BYTES: usize = 16 << 20;

/// The most bytes of answers one reflection load reads: servers resend a
/// file's imports with each answer, so more than the files they make.
pub const MAX_REFLECTION_ANSWER_BYTES: usize = 4 * MAX_REFLECTED_BYTES;

/// Messages an OpenAPI document describes (its component schemas): each
/// named message once, however often it is used.
pub const MAX_OPENAPI_SCHEMAS: usize = 4096;

/// The bytes of an OpenAPI document, built once per configuration.
pub const MAX_OPENAPI_BYTES: usize = 16 << 20;

/// The request fields one operation's query parameters are looked for
/// among, nested ones included: past it the rest are left out (and the
/// operation says so).
pub const MAX_OPENAPI_QUERY_FIELDS: usize = 1024;

/// The request fields all the operations of a document look at together.
pub const MAX_OPENAPI_QUERY_FIELDS_ALL: usize = 64 * MAX_OPENAPI_QUERY_FIELDS;

/// The operations of a document: past it, the configuration is refused.
pub const MAX_OPENAPI_OPERATIONS: usize = 16_384;

/// How deep the query parameters of an operation go into nested
/// messages (`a.b.c`); a message already on the way is not entered again.
pub const MAX_OPENAPI_QUERY_DEPTH: usize = 8;
