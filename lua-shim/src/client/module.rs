//! Driving the module: transport events in, its commands out (calls
//! started on their connections, messages sent, cancels), its replies and
//! streamed messages into the calls' queues, and its ticks.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{merge, Client, Conn, Event, Inner};
use crate::call::{events, CallId, ConnId, GrpcEvent, GrpcTarget, Produced, Token};
use crate::host::{GrpcCommand, HostError, Outputs, ProxyHost};
use crate::sync::lock;
use crate::transport::{NewCall, RunningCall, Sink, Started};

impl Client {
    /// The module's metrics in this process, as text (one metric a line;
    /// see `host::metrics::Metrics::text`).
    pub fn metrics(&self) -> String {
        lock(&self.inner.host).metrics_text()
    }

    /// Transport events into the module; returns the calls woken.
    pub(super) fn produced(&self, produced: Produced) -> Vec<CallId> {
        if produced.is_empty() {
            return Vec::new();
        }
        let mut host = lock(&self.inner.host);
        let mut woken = Vec::new();
        for (token, events) in produced {
            self.transport_over(token, &events);
            if self.is_reflection(token) {
                let pending = events.into_iter().map(|event| (token, event)).collect();
                woken = merge(woken, self.run_from(&mut host, pending));
                continue;
            }
            let delivered = events
                .into_iter()
                .try_for_each(|event| host.grpc_event(token, event));
            let ids = match delivered {
                Ok(()) => self.run(&mut host),
                // The rest are events of the old instance's calls, all failed.
                Err(e) => return merge(woken, self.recover(&mut host, &e)),
            };
            woken = merge(woken, ids);
        }
        woken
    }

    /// Forgets a call the transport has finished: after a close, or after
    /// the one message of a unary call.
    fn transport_over(&self, token: Token, events: &[GrpcEvent]) {
        let mut calls = lock(&self.inner.calls);
        let over = events.iter().any(|e| matches!(e, GrpcEvent::Close(..)))
            || (events.iter().any(|e| matches!(e, GrpcEvent::Message(_)))
                && calls.get(&token).is_some_and(|call| call.is_unary()));
        if over {
            calls.remove(&token);
        }
    }

    /// Carries out what the module asked for, until it asks for nothing
    /// more; returns the calls that got events.
    pub(super) fn run(&self, host: &mut ProxyHost) -> Vec<CallId> {
        self.run_from(host, VecDeque::new())
    }

    /// [`Client::run`], with transport events already `pending`.
    pub(super) fn run_from(
        &self,
        host: &mut ProxyHost,
        mut pending: VecDeque<(Token, GrpcEvent)>,
    ) -> Vec<CallId> {
        let mut outputs = host.take_outputs();
        let mut woken = Vec::new();
        loop {
            if let Err(e) = self.deliver(host, &mut outputs, &mut woken) {
                return merge(woken, self.recover(host, &e));
            }
            for command in std::mem::take(&mut outputs.commands) {
                self.command(command, &mut pending);
            }
            let Some((token, event)) = pending.pop_front() else {
                break;
            };
            // A wire call may have ended as it started (its connection
            // is over): forgotten here, as the runtime's are by `produced`.
            self.transport_over(token, std::slice::from_ref(&event));
            if self.is_reflection(token) {
                self.reflection_event(host, token, event, &mut pending, &mut woken);
                continue;
            }
            match host.grpc_event(token, event) {
                Ok(()) => outputs = host.take_outputs(),
                Err(e) => return merge(woken, self.recover(host, &e)),
            }
        }
        self.start_ticks(host.tick_ms());
        woken
    }

    fn deliver(
        &self,
        host: &mut ProxyHost,
        outputs: &mut Outputs,
        woken: &mut Vec<CallId>,
    ) -> Result<(), HostError> {
        for (id, json) in std::mem::take(&mut outputs.messages) {
            self.push(id, Event::Message(json), woken);
        }
        for (id, reply) in std::mem::take(&mut outputs.replies) {
            self.push(id, Event::End(reply), woken);
            // The exchange is over, as after a local reply in Envoy.
            host.finish(id)?;
            let more = host.take_outputs();
            outputs.commands.extend(more.commands);
        }
        Ok(())
    }

    fn command(&self, command: GrpcCommand, pending: &mut VecDeque<(Token, GrpcEvent)>) {
        let produced = match command {
            GrpcCommand::Call {
                token,
                mut target,
                message,
                timeout_ms,
                context,
            } => {
                target.compression = self.compression_of(context);
                self.start_call(token, target, |conn, call| {
                    conn.unary(call, message, timeout_ms)
                })
            }
            GrpcCommand::Stream {
                token,
                mut target,
                context,
            } => {
                target.compression = self.compression_of(context);
                let conn_id = target.upstream.parse().ok().map(ConnId);
                self.start_call(token, target, |conn, call| {
                    // A wire's tasks run when the caller drives them, so
                    // the one whose gate opens is driven then.
                    let wire = conn.socket().and(conn_id);
                    conn.stream(call, self.gate(context, wire))
                })
            }
            GrpcCommand::Send {
                token,
                message,
                compress,
            } => self.on_call(token, |c| c.send(message, compress)),
            GrpcCommand::Close { token } => self.on_call(token, |c| c.close_send()),
            GrpcCommand::Cancel { token } => match lock(&self.inner.calls).remove(&token) {
                Some(call) => call.cancel(),
                None => Vec::new(),
            },
        };
        queue(produced, pending);
    }

    /// Starts call `token` on its target's connection with `start`; a
    /// connection that is gone ends the call UNAVAILABLE.
    pub(super) fn start_call(
        &self,
        token: Token,
        target: GrpcTarget,
        start: impl FnOnce(&Conn, NewCall<'_>) -> Started,
    ) -> Produced {
        let Some(conn) = self.conn(&target.upstream) else {
            return vec![(token, vec![events::connection_closed()])];
        };
        let call = NewCall {
            token,
            target,
            runtime: self.inner.runtime.handle(),
            sink: &self.inner.sink,
        };
        let (running, produced) = start(&conn, call);
        lock(&self.inner.calls).insert(token, running);
        produced
    }

    /// `f` on a running call; a call its transport finished has nothing
    /// more to do.
    pub(super) fn on_call(
        &self,
        token: Token,
        f: impl FnOnce(&mut dyn RunningCall) -> Produced,
    ) -> Produced {
        match lock(&self.inner.calls).get_mut(&token) {
            Some(call) => f(call.as_mut()),
            None => Vec::new(),
        }
    }

    /// The module's ticks (stream deadlines), once it asks for them.
    fn start_ticks(&self, period_ms: u32) {
        if period_ms == 0 || self.inner.ticking.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        self.inner.runtime.spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(u64::from(period_ms)));
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                let ticked = client.contain(|| {
                    let mut host = lock(&client.inner.host);
                    match host.tick() {
                        Ok(()) => client.run(&mut host),
                        Err(e) => client.recover(&mut host, &e),
                    }
                });
                if let Ok(woken) = ticked {
                    client.wake(woken);
                }
            }
        });
    }
}

/// Transport events, on the runtime thread: into the module, then out. It
/// holds the client weakly, so that calls still running never keep a
/// dropped client alive.
pub(super) fn sink(weak: std::sync::Weak<Inner>) -> Sink {
    Arc::new(move |token, events: Vec<GrpcEvent>| {
        let Some(inner) = weak.upgrade() else { return };
        let client = Client { inner };
        if let Ok(woken) = client.contain(|| client.produced(vec![(token, events)])) {
            client.wake(woken);
        }
    })
}

/// Events a wire connection produced while the module was running: they
/// enter it in order, after the command that caused them.
pub(super) fn queue(produced: Produced, pending: &mut VecDeque<(Token, GrpcEvent)>) {
    for (token, events) in produced {
        pending.extend(events.into_iter().map(|event| (token, event)));
    }
}
