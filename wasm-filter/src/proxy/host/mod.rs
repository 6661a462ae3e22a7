//! What the filter asks of its host, behind the [`Host`] trait, and safe
//! wrappers over it that turn every host answer into a `Result`: no status
//! the host may return can make the module trap.
//!
//! The wasm32 build talks to the proxy through `hostcalls::AbiHost`, the raw
//! proxy-wasm 0.2.1 host functions. Native builds have no proxy: tests
//! install a [`mock::MockHost`] (or any `Host`) with [`install`] and drive
//! the filter's callbacks as a proxy would.

use std::cell::RefCell;
use std::ops::Range;

use crate::contract::pairs::{self, Change};
use crate::contract::{BufferType, ContextId, LogLevel, MapType, MetricType, ProxyStatus, Token};

#[cfg(target_arch = "wasm32")]
mod hostcalls;
#[cfg(not(target_arch = "wasm32"))]
pub mod mock;

/// A host status other than Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStatus(pub u32);

impl HostStatus {
    /// What a host answers for a map, buffer, property or function it
    /// does not have.
    pub const NOT_FOUND: HostStatus = HostStatus(ProxyStatus::NotFound as u32);
}

/// A gRPC call's target as the host functions take it: the metadata is a
/// serialized proxy-wasm map.
pub struct GrpcCall<'a> {
    pub upstream: &'a [u8],
    pub service: &'a str,
    pub method: &'a str,
    pub metadata: &'a [u8],
}

/// The proxy-wasm host functions the filter uses, one method each, with
/// the host's status as the error. Kinds are the contract's types.
pub trait Host {
    fn log(&self, level: LogLevel, message: &str);
    fn get_buffer(&self, kind: BufferType, start: usize, max: usize)
        -> Result<Vec<u8>, HostStatus>;
    /// Envoy's rule: at 0, drops `size` bytes and puts `data` in front.
    fn set_buffer(
        &self,
        kind: BufferType,
        start: usize,
        size: usize,
        data: &[u8],
    ) -> Result<(), HostStatus>;
    /// The map as serialized proxy-wasm pairs.
    fn get_header_pairs(&self, map: MapType) -> Result<Vec<u8>, HostStatus>;
    fn replace_header(&self, map: MapType, key: &str, value: &str) -> Result<(), HostStatus>;
    fn remove_header(&self, map: MapType, key: &str) -> Result<(), HostStatus>;
    fn set_tick_period(&self, period_ms: u32) -> Result<(), HostStatus>;
    fn current_time_nanos(&self) -> u64;
    /// `path`: the segments joined by NUL.
    fn get_property(&self, path: &[u8]) -> Result<Vec<u8>, HostStatus>;
    fn set_effective_context(&self, context_id: ContextId) -> Result<(), HostStatus>;
    fn call_foreign(&self, name: &str, args: &[u8]) -> Result<Vec<u8>, HostStatus>;
    /// An HTTP call without a body; returns its token.
    fn http_call(
        &self,
        upstream: &str,
        headers: &[u8],
        trailers: &[u8],
        timeout_ms: u32,
    ) -> Result<Token, HostStatus>;
    fn grpc_call(
        &self,
        call: &GrpcCall,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<Token, HostStatus>;
    fn grpc_stream(&self, call: &GrpcCall) -> Result<Token, HostStatus>;
    fn grpc_send(&self, token: Token, message: &[u8]) -> Result<(), HostStatus>;
    fn grpc_close(&self, token: Token) -> Result<(), HostStatus>;
    fn grpc_cancel(&self, token: Token) -> Result<(), HostStatus>;
    /// The status of the gRPC callback in progress: code and message.
    fn get_status(&self) -> Result<(u32, Vec<u8>), HostStatus>;
    fn send_local_response(
        &self,
        http_status: u32,
        details: &str,
        body: &[u8],
        headers: &[u8],
    ) -> Result<(), HostStatus>;
    /// Returns the metric's id.
    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, HostStatus>;
    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostStatus>;
    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostStatus>;
}

#[cfg(target_arch = "wasm32")]
fn current() -> &'static hostcalls::AbiHost {
    &hostcalls::AbiHost
}

#[cfg(not(target_arch = "wasm32"))]
thread_local! {
    static CURRENT: RefCell<Option<std::rc::Rc<dyn Host>>> = const { RefCell::new(None) };
}

/// Makes `host` the host of this thread's filter (native builds).
#[cfg(not(target_arch = "wasm32"))]
pub fn install(host: std::rc::Rc<dyn Host>) {
    CURRENT.with(|c| *c.borrow_mut() = Some(host));
}

/// The installed host; without one, a host that has nothing
/// ([`mock::MockHost`] empty).
#[cfg(not(target_arch = "wasm32"))]
fn current() -> std::rc::Rc<dyn Host> {
    CURRENT.with(|c| {
        c.borrow_mut()
            .get_or_insert_with(|| std::rc::Rc::new(mock::MockHost::default()))
            .clone()
    })
}

pub fn log(level: LogLevel, message: &str) {
    current().log(level, message);
}

pub fn buffer(kind: BufferType, start: usize, max: usize) -> Result<Vec<u8>, HostStatus> {
    match current().get_buffer(kind, start, max) {
        Err(HostStatus::NOT_FOUND) => Ok(Vec::new()),
        other => other,
    }
}

/// Replaces the first `size` bytes of a buffer with `data`.
pub fn set_buffer(kind: BufferType, size: usize, data: &[u8]) -> Result<(), HostStatus> {
    current().set_buffer(kind, 0, size, data)
}

pub fn set_header(map: MapType, key: &str, value: &str) -> Result<(), HostStatus> {
    current().replace_header(map, key, value)
}

pub fn remove_header(map: MapType, key: &str) -> Result<(), HostStatus> {
    current().remove_header(map, key)
}

/// A header map read in one host call; lookups stay in the module and
/// borrow from the host's bytes.
#[derive(Debug, Default)]
pub struct HeaderMap {
    bytes: Vec<u8>,
    entries: Vec<(Range<usize>, Range<usize>)>,
}

impl HeaderMap {
    pub fn read(map: MapType) -> HeaderMap {
        let bytes = current().get_header_pairs(map).unwrap_or_default();
        let entries = pairs::index(&bytes).unwrap_or_default();
        HeaderMap { bytes, entries }
    }

    /// What the map holds in the module's memory, in bytes.
    pub fn held_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.entries.capacity() * std::mem::size_of::<(Range<usize>, Range<usize>)>()
    }

    /// The first value of `name`, whatever its case: Envoy lower-cases
    /// names, but HTTP/1 hosts (ngx_wasm_module) keep `Content-Type`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.bytes(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(k, _)| self.bytes[k.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| &self.bytes[v.clone()])
    }

    /// Sets `set` and drops `remove` in the host's map `map` (the one this
    /// was read from), with a host call only for what differs.
    pub fn edit(
        &self,
        map: MapType,
        set: &[(&str, &str)],
        remove: &[&str],
    ) -> Result<(), HostStatus> {
        for change in pairs::changes(self.pairs(), set, remove) {
            match change {
                Change::Set(name, value) => set_header(map, name, value)?,
                Change::Remove(name) => remove_header(map, name)?,
            }
        }
        Ok(())
    }

    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries
            .iter()
            .map(|(k, v)| (&self.bytes[k.clone()], &self.bytes[v.clone()]))
    }
}

use crate::limits::TICK_MS;

thread_local! {
    /// Roots whose ticks run. ngx_wasm_module traps when a period is set
    /// while one runs, so a running period is never set again.
    static TICKING: RefCell<Vec<ContextId>> = const { RefCell::new(Vec::new()) };
}

/// Starts or stops `root_id`'s ticks; `root_id` must be the current
/// context.
pub fn ticks(root_id: ContextId, on: bool) -> Result<(), HostStatus> {
    if TICKING.with(|t| t.borrow().contains(&root_id)) == on {
        return Ok(());
    }
    let period = if on { TICK_MS } else { 0 };
    current().set_tick_period(period)?;
    TICKING.with(|t| {
        let mut t = t.borrow_mut();
        if on {
            t.push(root_id);
        } else {
            t.retain(|r| *r != root_id);
        }
    });
    Ok(())
}

pub fn now_nanos() -> u64 {
    current().current_time_nanos()
}

/// A host property by its path segments; `None` when the host has none.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    current().get_property(path.join("\0").as_bytes()).ok()
}

/// Whether the host is the OpenResty shim, which names itself through a
/// property other hosts do not have. (Not a probing foreign-function call:
/// ngx_wasm_module traps on names it does not know.)
pub fn is_shim() -> bool {
    property(&[crate::contract::HOST_PROPERTY]).as_deref() == Some(crate::contract::SHIM_HOST)
}

/// Makes later calls (replies, headers) act on this HTTP stream; gRPC
/// callbacks arrive on the root context.
pub fn set_effective_context(context_id: ContextId) -> Result<(), HostStatus> {
    current().set_effective_context(context_id)
}

/// Calls a function the host registered under `name`; `Err(HostStatus(1))`
/// (NotFound) on hosts that have none by that name.
pub fn call_foreign(name: &str, args: &[u8]) -> Result<Vec<u8>, HostStatus> {
    current().call_foreign(name, args)
}

/// An HTTP GET through the host; returns its token. The answer arrives in
/// `proxy_on_http_call_response`.
pub fn http_get(
    upstream: &str,
    authority: &str,
    path: &str,
    timeout_ms: u32,
) -> Result<Token, HostStatus> {
    let headers = pairs::serialize(&[
        (":method", "GET"),
        (":path", path),
        (":authority", authority),
        (":scheme", "http"),
    ]);
    let trailers = pairs::serialize::<&str, &str>(&[]);
    current().http_call(upstream, &headers, &trailers, timeout_ms)
}

/// Where and what to call: the host frames the bare message itself.
pub struct GrpcTarget<'a> {
    pub upstream: &'a [u8],
    pub service: &'a str,
    pub method: &'a str,
    pub metadata: &'a [(String, String)],
}

impl GrpcTarget<'_> {
    fn metadata_map(&self) -> Vec<u8> {
        let pairs: Vec<(&str, &[u8])> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        pairs::serialize(&pairs)
    }
}

impl GrpcTarget<'_> {
    fn call<'m>(&'m self, map: &'m [u8]) -> GrpcCall<'m> {
        GrpcCall {
            upstream: self.upstream,
            service: self.service,
            method: self.method,
            metadata: map,
        }
    }
}

/// A unary call; returns its token.
pub fn grpc_call(
    target: &GrpcTarget,
    message: &[u8],
    timeout_ms: u64,
) -> Result<Token, HostStatus> {
    let map = target.metadata_map();
    let timeout = u32::try_from(timeout_ms).unwrap_or(u32::MAX).max(1);
    current().grpc_call(&target.call(&map), message, timeout)
}

/// Opens a stream; returns its token. Streams have no host deadline: the
/// caller enforces its own.
pub fn grpc_stream(target: &GrpcTarget) -> Result<Token, HostStatus> {
    let map = target.metadata_map();
    current().grpc_stream(&target.call(&map))
}

pub fn grpc_send(token: Token, message: &[u8]) -> Result<(), HostStatus> {
    current().grpc_send(token, message)
}

/// Half-closes a stream (the spec's way; an empty message would be a message).
pub fn grpc_close(token: Token) -> Result<(), HostStatus> {
    current().grpc_close(token)
}

pub fn grpc_cancel(token: Token) -> Result<(), HostStatus> {
    current().grpc_cancel(token)
}

/// The status of the gRPC callback in progress: code and message.
pub fn grpc_status() -> (u32, String) {
    match current().get_status() {
        Ok((code, message)) => (code, String::from_utf8_lossy(&message).into_owned()),
        Err(HostStatus(status)) => (2, format!("the host gave no status (host status {status})")),
    }
}

/// Answers the client directly; the host sends it when the callback returns.
pub fn send_reply(
    http_status: u16,
    details: &str,
    body: &[u8],
    headers: &[(&str, &[u8])],
) -> Result<(), HostStatus> {
    send_reply_map(http_status, details, body, &pairs::serialize(headers))
}

/// [`send_reply`] with the headers already serialized.
pub fn send_reply_map(
    http_status: u16,
    details: &str,
    body: &[u8],
    map: &[u8],
) -> Result<(), HostStatus> {
    current().send_local_response(u32::from(http_status), details, body, map)
}

pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, HostStatus> {
    current().define_metric(kind, name)
}

pub fn increment_metric(id: u32, offset: i64) -> Result<(), HostStatus> {
    current().increment_metric(id, offset)
}

pub fn record_metric(id: u32, value: u64) -> Result<(), HostStatus> {
    current().record_metric(id, value)
}
