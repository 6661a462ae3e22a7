//! A trap in the module: the instance is rebuilt with the same
//! configuration, and every call it was running ends with INTERNAL.

use super::{Client, Event};
use crate::call::HeaderBlock;
use crate::host::{HostError, LocalReply, ProxyHost};
use crate::sync::lock;
use crate::transport::RunningCall;

impl Client {
    /// `result`, after rebuilding the instance if it was a trap, and the
    /// calls that rebuilding woke: the caller wakes them once the module
    /// is unlocked, so that no woken thread waits for it.
    pub(super) fn checked<T>(
        &self,
        host: &mut ProxyHost,
        result: Result<T, HostError>,
    ) -> (Result<T, HostError>, Vec<u32>) {
        let woken = match &result {
            Err(e @ HostError::Trap(_)) => self.recover(host, e),
            _ => Vec::new(),
        };
        (result, woken)
    }

    /// A trap leaves the instance in a state nothing can trust (a borrow
    /// held, a map half written), so every later call would fail: it is
    /// replaced by a fresh instance with the same configuration, and every
    /// call it was running ends with INTERNAL. Returns the calls woken.
    pub(super) fn recover(&self, host: &mut ProxyHost, error: &HostError) -> Vec<u32> {
        eprintln!(
            "[grpc-wasm] {error}; the module instance is rebuilt and its calls fail with INTERNAL"
        );
        self.abandon_transports();
        let restarted = host.restart().and_then(|()| {
            let config = self.config();
            host.configure(config.as_bytes())
        });
        if let Err(e) = restarted {
            eprintln!("[grpc-wasm] the rebuilt module instance failed: {e}");
        }
        let reply = trapped(error);
        let mut woken = Vec::new();
        for (id, queue) in lock(&self.inner.events).iter_mut() {
            if !queue.ended {
                queue.ended = true;
                queue.events.push_back(Event::End(reply.clone()));
                woken.push(*id);
            }
        }
        woken
    }

    /// Stops the transport side of every call: their tokens belonged to
    /// the old instance.
    fn abandon_transports(&self) {
        let calls: Vec<Box<dyn RunningCall>> = lock(&self.inner.calls)
            .drain()
            .map(|(_, call)| call)
            .collect();
        for call in calls {
            // Whatever else it produced belongs to failed calls too.
            let _ = call.cancel();
        }
    }
}

/// The end of a call whose instance trapped, as the module itself reports
/// failures: a `google.rpc.Status` body and the status headers.
fn trapped(error: &HostError) -> LocalReply {
    let message = format!(
        "the grpc-wasm module failed ({}); its instance was rebuilt and this call was lost",
        error.to_string().lines().next().unwrap_or_default()
    );
    let body = serde_json::json!({"code": 13, "message": message}).to_string();
    let none: &[u8] = b"";
    let headers = [
        (none, &b"grpc-status"[..], &b"13"[..]),
        (none, b"grpc-status-name", b"INTERNAL"),
        (none, b"content-type", b"application/json"),
    ];
    LocalReply {
        http_status: 500,
        body: body.into_bytes(),
        headers: HeaderBlock::from_entries(|| headers.iter().copied()),
    }
}
