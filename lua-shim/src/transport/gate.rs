//! Backpressure for a streamed response: a call's gate closes while its
//! caller holds as many queued bytes as it may (`Client`'s per-call cap),
//! and the transport stops taking the stream's data until the caller's
//! reads open it again. The data left in HTTP/2's buffer is not given back
//! as flow-control credit, so the server stops at the stream's window
//! instead of filling the worker's memory.
//!
//! The other way, the gate counts the request bytes the caller sent that
//! the transport has not yet handed to HTTP/2 within the server's window
//! ([`Gate::unsent`]): the caller's `send` waits while they pass its bound,
//! as a server that grants no window once left every sent byte in the
//! worker (400 sends of 1 MiB: 425 MB).

use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use crate::sync::lock;

#[derive(Default)]
pub struct Gate(Mutex<State>, AtomicUsize);

#[derive(Default)]
struct State {
    closed: bool,
    /// The transport's task, parked until the gate opens.
    waiter: Option<Waker>,
}

impl Gate {
    pub fn close(&self) {
        lock(&self.0).closed = true;
    }

    /// Opens the gate; true when it was closed, so that a parked transport
    /// task is now ready (the caller drives a wire connection's tasks).
    pub fn open(&self) -> bool {
        let mut state = lock(&self.0);
        let was_closed = std::mem::take(&mut state.closed);
        if let Some(waiter) = state.waiter.take() {
            waiter.wake();
        }
        was_closed
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.0).closed
    }

    pub fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.0);
        if !state.closed {
            return Poll::Ready(());
        }
        state.waiter = Some(cx.waker().clone());
        Poll::Pending
    }

    pub async fn opened(&self) {
        poll_fn(|cx| self.poll_open(cx)).await
    }

    /// `bytes` more of the request wait in the transport.
    pub fn queued(&self, bytes: usize) {
        self.1.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of the request went to HTTP/2, within the server's window.
    pub fn sent(&self, bytes: usize) {
        let _ = self
            .1
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(bytes))
            });
    }

    /// The request bytes still waiting in the transport.
    pub fn unsent(&self) -> usize {
        self.1.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_closed_gate_parks_its_task_until_opened() {
        let gate = Gate::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(gate.poll_open(&mut cx), Poll::Ready(()));
        assert!(!gate.open());
        gate.close();
        assert_eq!(gate.poll_open(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        assert!(gate.open());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(gate.poll_open(&mut cx), Poll::Ready(()));
        assert!(!gate.is_closed());
    }
}
