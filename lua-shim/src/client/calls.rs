//! A call's life as its caller sees it: started with its headers and
//! metadata, fed request messages, closed.

use grpc_wasm::contract::{JSON_OPTIONS_HEADER, METADATA_PREFIX};
use grpc_wasm::timeout::encode_timeout;
use std::time::Duration;

use super::queues::Queue;
use super::{CallOptions, Client, ClientError, UPSTREAM_HEADER};
use crate::call::{CallId, ConnId, HeaderBlock};
use crate::host::HostError;
use crate::sync::lock;

impl Client {
    /// Starts a call on `path` (`/pkg.Service/Method`). With `body`, the
    /// request is complete (unary and server streaming); without, messages
    /// follow with [`Client::send`]. Returns the call id.
    pub fn start(
        &self,
        conn: ConnId,
        path: &str,
        body: Option<&[u8]>,
        options: &CallOptions,
    ) -> Result<CallId, ClientError> {
        if !lock(&self.inner.conns).contains_key(&conn) {
            return Err(ClientError::UnknownConn);
        }
        check_metadata(&options.metadata)?;
        let mut conn_id = itoa::Buffer::new();
        let timeout = options
            .timeout_ms
            .map(|ms| encode_timeout(Duration::from_millis(ms.max(1))));
        let none: &[u8] = b"";
        let fixed = [
            (none, &b":method"[..], &b"POST"[..]),
            (none, b":path", path.as_bytes()),
            (none, b"content-type", b"application/json"),
            (
                none,
                UPSTREAM_HEADER.as_bytes(),
                conn_id.format(conn.0).as_bytes(),
            ),
        ];
        let optional = [
            timeout
                .as_deref()
                .map(|t| (none, &b"grpc-timeout"[..], t.as_bytes())),
            options
                .json_options
                .as_deref()
                .map(|j| (none, JSON_OPTIONS_HEADER.as_bytes(), j.as_bytes())),
        ];
        let metadata = options
            .metadata
            .iter()
            .chain(grpc_wasm::metadata::propagated(
                &options.metadata,
                &options.propagated,
            ))
            .map(|(k, v)| (METADATA_PREFIX.as_bytes(), k.as_bytes(), v.as_bytes()));
        let headers = HeaderBlock::from_entries(|| {
            fixed
                .iter()
                .copied()
                .chain(optional.iter().flatten().copied())
                .chain(metadata.clone())
        });
        let (id, woken) = {
            let mut host = lock(&self.inner.host);
            let id = {
                // An id Lua still holds (its end not yet closed) is busy
                // even when the module is done with it.
                let mut events = lock(&self.inner.events);
                let id = host.reserve_id(|id| events.contains_key(&id))?;
                let queue = Queue {
                    compression: options.compression,
                    ..Queue::default()
                };
                events.insert(id, queue);
                id
            };
            match host.open(id, headers, body) {
                Ok(()) => (id, self.run(&mut host)),
                // The call is among those the rebuilt instance failed.
                Err(e @ HostError::Trap(_)) => (id, self.recover(&mut host, &e)),
                Err(e) => {
                    lock(&self.inner.events).remove(&id);
                    return Err(e.into());
                }
            }
        };
        self.wake(woken);
        Ok(id)
    }

    /// One more request message (JSON) for a streaming call; `compress:
    /// false` sends it uncompressed in a compressed call.
    pub fn send(&self, id: CallId, json: &[u8], compress: bool) -> Result<(), ClientError> {
        self.feed(id, json, false, compress)
    }

    /// No more request messages.
    pub fn close_send(&self, id: CallId) -> Result<(), ClientError> {
        self.feed(id, b"", true, true)
    }

    fn feed(&self, id: CallId, bytes: &[u8], end: bool, compress: bool) -> Result<(), ClientError> {
        if !lock(&self.inner.events).contains_key(&id) {
            return Err(ClientError::UnknownCall);
        }
        let mut framed = Vec::with_capacity(bytes.len() + 1);
        framed.extend_from_slice(bytes);
        if !end {
            // Messages are newline-delimited in the request body.
            framed.push(b'\n');
        }
        let (woken, result) = {
            let mut host = lock(&self.inner.host);
            host.send_uncompressed(!compress);
            let fed = host.body(id, &framed, end);
            host.send_uncompressed(false);
            match fed {
                Ok(()) => (self.run(&mut host), Ok(())),
                Err(e) => (self.recover(&mut host, &e), Err(e.into())),
            }
        };
        self.wake(woken);
        result
    }

    /// Ends a call early or forgets a finished one; the module cancels
    /// whatever still runs. A reflection load is the client's own: its
    /// stream is cancelled and its set forgotten.
    pub fn close(&self, id: CallId) {
        // Taken apart from the match: `events` is never held while `host`
        // is taken (the lock order).
        let removed = lock(&self.inner.events).remove(&id);
        let Some(queue) = removed else {
            return;
        };
        let reflection = lock(&self.inner.reflections).contains_key(&id);
        if queue.ended && !reflection {
            // The module finished it already: nothing to cancel.
            return;
        }
        let woken = {
            let mut host = lock(&self.inner.host);
            if reflection {
                let pending = self.forget_reflection(&mut host, id);
                self.run_from(&mut host, pending)
            } else {
                match host.finish(id) {
                    Ok(()) => self.run(&mut host),
                    Err(e) => self.recover(&mut host, &e),
                }
            }
        };
        self.wake(woken);
    }
}

/// Metadata by the core's one rule (`grpc_wasm::metadata::check_entry`),
/// for every caller, `resty.ffi.grpc` included: it checks only types.
pub(super) fn check_metadata(metadata: &[(String, String)]) -> Result<(), ClientError> {
    for (key, value) in metadata {
        grpc_wasm::metadata::check_entry(key, value.as_bytes())?;
    }
    Ok(())
}
