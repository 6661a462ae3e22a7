//! Each call's events until its caller takes them, and the backpressure
//! both ways: a call holding `max_queued_bytes` closes its stream's gate,
//! and a stream whose transport holds as much unsent tells its caller to
//! wait.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Client, Event};
use crate::call::{CallId, Compression, ConnId};
use crate::sync::lock;
use crate::transport::Gate;

/// A call's events not yet taken, and whether its end is among them (then
/// the module has already finished the call).
#[derive(Default)]
pub(super) struct Queue {
    pub(super) events: VecDeque<Event>,
    pub(super) ended: bool,
    /// The bytes of the messages in `events`.
    pub(super) bytes: usize,
    /// Its stream's backpressure, closed while `bytes` is at the cap.
    pub(super) gate: Option<Arc<Gate>>,
    /// The wire connection its stream runs on, driven when the gate opens.
    pub(super) wire: Option<ConnId>,
    /// How its caller wants the request compressed.
    pub(super) compression: Compression,
}

impl Queue {
    pub(super) fn push(&mut self, event: Event, cap: usize) {
        self.ended |= matches!(event, Event::End(_));
        if let Event::Message(json) = &event {
            self.bytes += json.len();
        }
        if self.bytes >= cap {
            if let Some(gate) = &self.gate {
                gate.close();
            }
        }
        self.events.push_back(event);
    }

    /// The next event, and whether taking it opened the stream's gate.
    pub(super) fn pop(&mut self, cap: usize) -> (Option<Event>, bool) {
        let event = self.events.pop_front();
        if let Some(Event::Message(json)) = &event {
            self.bytes -= json.len();
        }
        let opened = self.bytes < cap && self.gate.as_ref().is_some_and(|g| g.open());
        (event, opened)
    }
}

impl Client {
    /// Whether call `id` is known (started and not closed).
    /// The request bytes a stream's transport holds that have not left for
    /// the server, when they pass `max_queued_bytes` (the bound each way):
    /// the caller waits before its next send. On a wire connection they
    /// include what waits for the socket, so that a caller sending faster
    /// than its socket writes yields to the writer (the connection's own
    /// bound, `pipe::MAX_UNSENT`, is for servers that read nothing).
    /// `Some(0)` when it may go on; `None` for a call that is over or
    /// unknown.
    pub fn send_backlog(&self, id: CallId) -> Option<usize> {
        let (gate, wire) = {
            let events = lock(&self.inner.events);
            let queue = events.get(&id).filter(|q| !q.ended)?;
            (queue.gate.clone(), queue.wire)
        };
        let mut unsent = gate.map_or(0, |gate| gate.unsent());
        // Taken apart from the events lock: the wire's drive takes that.
        if let Some(conn) = wire.and_then(|conn| self.conn_by_id(conn)) {
            let waiting = conn.socket().map_or(0, |socket| socket.output_len());
            unsent = unsent.saturating_add(waiting);
        }
        Some(if unsent > self.max_queued() {
            unsent
        } else {
            0
        })
    }

    pub fn has_call(&self, id: CallId) -> bool {
        lock(&self.inner.events).contains_key(&id)
    }

    /// The call's next event, if one has arrived.
    pub fn next_event(&self, id: CallId) -> Option<Event> {
        self.take_event(id).0
    }

    /// [`Client::next_event`], and the wire connection that taking it set
    /// going again (its socket may have bytes to send: window updates).
    pub fn take_event(&self, id: CallId) -> (Option<Event>, Option<ConnId>) {
        let cap = self.max_queued();
        let (event, wire) = {
            let mut events = lock(&self.inner.events);
            let Some(queue) = events.get_mut(&id) else {
                return (None, None);
            };
            match queue.pop(cap) {
                (event, true) => (event, queue.wire),
                (event, false) => (event, None),
            }
        };
        if let Some(conn) = wire {
            self.resume_wire(conn);
        }
        (event, wire)
    }

    pub(super) fn push(&self, id: CallId, event: Event, woken: &mut Vec<CallId>) {
        let cap = self.max_queued();
        if let Some(queue) = lock(&self.inner.events).get_mut(&id) {
            queue.push(event, cap);
            if !woken.contains(&id) {
                woken.push(id);
            }
        }
    }

    /// The gate of the stream that call `context` opened (a fresh one that
    /// nothing closes if the call is gone).
    pub(super) fn gate(&self, context: CallId, wire: Option<ConnId>) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        if let Some(queue) = lock(&self.inner.events).get_mut(&context) {
            queue.gate = Some(gate.clone());
            queue.wire = wire;
        }
        gate
    }

    /// How call `context`'s caller wants its request compressed.
    pub(super) fn compression_of(&self, context: CallId) -> Compression {
        lock(&self.inner.events)
            .get(&context)
            .map(|queue| queue.compression)
            .unwrap_or_default()
    }

    /// The cap on what each call holds for its caller (at least 1 byte).
    pub fn set_max_queued_bytes(&self, bytes: usize) {
        self.inner.max_queued.store(bytes.max(1), Ordering::Relaxed);
    }

    pub(super) fn max_queued(&self) -> usize {
        self.inner.max_queued.load(Ordering::Relaxed)
    }
}
