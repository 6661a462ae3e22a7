//! Failures that leave state nothing can trust, and what is rebuilt after
//! them. A trap in the module: the instance is rebuilt with the same
//! configuration, and every call it was running ends with INTERNAL. A
//! panic in the shim (a bug in it, or in a library under it: h2, rustls,
//! wasmtime): whatever it was changing may be half-written, under any of
//! the client's locks or a connection's, so nothing of it is used again.
//! Every call in flight ends with INTERNAL, every connection is closed,
//! the instance is rebuilt, and the locks are cleared of their poison.
//! The entry points ([`Client::contain`], the C ABI's guard, the
//! lua-resty-ffi loop) send every caught panic here.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{Client, ClientError, Conn, Event};
use crate::call::{events, CallId};
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
    ) -> (Result<T, HostError>, Vec<CallId>) {
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
    pub(super) fn recover(&self, host: &mut ProxyHost, error: &HostError) -> Vec<CallId> {
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
        let why = format!(
            "the grpc-wasm module failed ({}); its instance was rebuilt and this call was lost",
            first_line(error)
        );
        self.fail_all(&lost(&why))
    }

    /// Every call not yet ended ends with `reply`; returns them.
    fn fail_all(&self, reply: &LocalReply) -> Vec<CallId> {
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
        // Reflection loads in flight end with the calls: their streams are
        // cancelled below, and their callers' calls fail with the rest. A
        // finished load keeps its set for its caller, who was told OK.
        self.inner.reflections.clear_poison();
        let mut reflections = lock(&self.inner.reflections);
        reflections.retain(|_, r| r.is_finished());
        self.inner
            .reflecting
            .store(reflections.len(), std::sync::atomic::Ordering::Release);
        drop(reflections);
        let calls: Vec<Box<dyn RunningCall>> = lock(&self.inner.calls)
            .drain()
            .map(|(_, call)| call)
            .collect();
        for call in calls {
            // Whatever else it produced belongs to failed calls too; a
            // connection a panic left half-written may panic again here.
            let _ = catch_unwind(AssertUnwindSafe(|| call.cancel()));
        }
    }

    /// Runs `f`; a panic in it is handled by [`Client::after_panic`] and
    /// returned as [`ClientError::Panicked`].
    pub fn contain<T>(&self, f: impl FnOnce() -> T) -> Result<T, ClientError> {
        catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
            let what = panic_message(panic.as_ref());
            self.after_panic(&what);
            ClientError::Panicked(what)
        })
    }

    /// After a panic (`what`): nothing it may have left half-written is
    /// used again (see the module's documentation). The calls woken are
    /// woken here.
    /// Never unwinds: its callers are the C ABI and the runtime's tasks,
    /// where a second panic would abort the worker.
    pub fn after_panic(&self, what: &str) {
        eprintln!(
            "[grpc-wasm] a panic in the shim ({what}); every call in flight fails, every \
             connection is closed and the module instance is rebuilt"
        );
        if catch_unwind(AssertUnwindSafe(|| self.rebuild_after_panic(what))).is_err() {
            eprintln!("[grpc-wasm] rebuilding after a panic panicked too; later calls may fail");
            self.clear_poison();
        }
    }

    fn clear_poison(&self) {
        let inner = &self.inner;
        inner.conns.clear_poison();
        inner.calls.clear_poison();
        inner.reflections.clear_poison();
        inner.changing.clear_poison();
        inner.protos.clear_poison();
        inner.loaded.clear_poison();
        inner.host.clear_poison();
        inner.events.clear_poison();
    }

    fn rebuild_after_panic(&self, what: &str) {
        let inner = &self.inner;
        inner.conns.clear_poison();
        let conns: Vec<Conn> = lock(&inner.conns).drain().map(|(_, conn)| conn).collect();
        inner.calls.clear_poison();
        self.abandon_transports();
        for conn in conns {
            let _ = catch_unwind(AssertUnwindSafe(|| conn.close(events::CONNECTION_CLOSED)));
        }
        inner.changing.clear_poison();
        inner.protos.clear_poison();
        inner.host.clear_poison();
        let woken = {
            let mut host = lock(&inner.host);
            let restarted = host.restart().and_then(|()| {
                let config = self.config();
                host.configure(config.as_bytes())
            });
            if let Err(e) = restarted {
                eprintln!("[grpc-wasm] the rebuilt module instance failed: {e}");
            }
            inner.events.clear_poison();
            let why = format!(
                "the shim failed (panic: {what}); its state was rebuilt and this call was lost"
            );
            self.fail_all(&lost(&why))
        };
        self.wake(woken);
    }
}

/// What a caught panic says, when it says it as text.
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn first_line(error: &HostError) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The end of a call lost to a trap or a panic (`message` says which).
fn lost(message: &str) -> LocalReply {
    super::status_reply(grpc_wasm::Code::Internal, message)
}
