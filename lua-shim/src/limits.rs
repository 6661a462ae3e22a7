//! The bounds the shim itself puts on a server, a connection and a Lua
//! caller, in one place. Everything about messages (their size, nesting,
//! JSON) is the core's, in `grpc_wasm::limits`; these are the transport's
//! and the host's. docs/limits.md gives each.

use std::time::Duration;

use grpc_wasm::limits::{DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_TIMEOUT_MS};

/// The response bytes (JSON) a call may hold that its caller has not taken,
/// and the request bytes a stream's transport may hold unsent
/// (`max_queued_bytes`): past it, a stream is not read until the caller
/// takes some (HTTP/2 flow control holds the server), and `send` waits.
/// One message of the default size fits. docs/limits.md: the two queued-bytes rows.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = DEFAULT_MAX_MESSAGE_BYTES;

/// Bytes waiting for the socket on one `cosocket` connection. Control
/// frames (PING and SETTINGS acks) have no window: a server that floods
/// PINGs and reads nothing grew a worker to 603 MB in 9 s. Past
/// this the connection fails, and its calls with UNAVAILABLE. Callers that
/// send faster than the socket writes wait well before it
/// ([`DEFAULT_MAX_QUEUED_BYTES`]), so it is reached by a server that reads
/// nothing, not by a large upload; 64 MiB leaves a burst of large unary
/// calls on a wide-windowed connection its room. docs/limits.md: "bytes waiting
/// for the socket".
pub const MAX_UNSENT: usize = 64 << 20;

/// Bytes read from a `cosocket` connection's socket that HTTP/2 has not
/// taken yet. h2 takes what each read brings before the next (64 KiB), so
/// only a connection that stopped taking its input comes near it: the
/// socket's reader kept reading a flooding server after h2 had ended, and
/// the worker grew by the server's rate, gigabytes in seconds. Past this
/// the connection fails, and its calls with UNAVAILABLE.
pub const MAX_UNREAD: usize = 4 << 20;

/// Streams this side reset that h2 remembers, for a second, so as to ignore
/// the frames still in flight for them; a few hundred bytes each. At h2's
/// default of 50, the 51st cancel within a second is forgotten at once and
/// each of its late frames costs a RST_STREAM, of which h2 allows 1,024 in
/// a connection's life before it ends the connection (ENHANCE_YOUR_CALM).
/// docs/limits.md: "cancelled calls and expired deadlines on one conn".
pub const REMEMBERED_RESETS: usize = 4096;

/// How long a connection with calls may hear nothing before it sends a
/// PING (`keepalive_interval`). docs/limits.md: "a connection with calls that
/// hears nothing".
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a PING may go unanswered before the connection ends
/// (`keepalive_timeout`).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a server may take to answer the HTTP/2 handshake (TLS
/// included on `cosocket`, the dial on `runtime`; `handshake_timeout`).
/// docs/limits.md: "a server that does not answer the HTTP/2 handshake".
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a lua-resty-ffi `next` without a `timeout` may wait: the
/// module's default deadline and a second of slack. docs/limits.md: "a
/// lua-resty-ffi wait for the next event".
pub const DEFAULT_WAIT: Duration = Duration::from_millis(DEFAULT_TIMEOUT_MS + 1_000);

/// The largest context id: the C ABI hands ids out as `i32`.
pub const MAX_CONTEXT_ID: u32 = i32::MAX as u32;

/// Context ids tried before giving up: more calls than that in flight is a
/// leak.
pub const CONTEXT_ID_PROBES: u32 = 1 << 20;

/// Reflection loads (`grpc.reflect`) a worker runs at once: each may hold
/// a whole set of a server's files (`grpc_wasm::limits::MAX_REFLECTED_BYTES`)
/// until its caller takes it. docs/limits.md: "reflection loads at once".
pub const MAX_REFLECTIONS: usize = 4;

/// The bytes of descriptor sets a worker holds, all loads together
/// (`load_descriptor_set`, `conn:reflect`): a server that answered each
/// load with files of new names would otherwise grow it for good.
/// docs/limits.md: "descriptor sets a worker holds".
pub const MAX_LOADED_SET_BYTES: usize = 4 * grpc_wasm::limits::MAX_REFLECTED_BYTES;
