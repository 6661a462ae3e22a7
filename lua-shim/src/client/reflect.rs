//! Server reflection for the caller (`grpc.reflect`): the core's
//! reflection [`Loader`] run over a stream the client opens itself on the
//! caller's connection, beside the module's calls. Its events come in
//! where the module's do and are routed here by token (the module's own
//! count hands the token out, so no call of the module's holds it). The
//! caller sees a call like any other: it waits for the end, then
//! [`Client::reflected`] adds the closed set to what the module is
//! configured with, all or nothing.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grpc_wasm::reflection::{Loader, Reflected, Version, METHOD};
use grpc_wasm::{Code, Registry};

use super::queues::Queue;
use super::{local_reply, status_reply, Client, ClientError, Event};
use crate::call::{CallId, ConnId, GrpcEvent, GrpcTarget, Token};
use crate::host::ProxyHost;
use crate::limits::MAX_REFLECTIONS;
use crate::sync::lock;

/// One load, from its start to the set its caller takes.
pub(super) struct Reflection {
    conn: ConnId,
    /// The stream in flight (`None` once it is over).
    token: Option<Token>,
    loader: Option<Loader>,
    /// What the load made, kept until its caller takes it.
    outcome: Option<Result<Reflected, String>>,
    /// Past it (and a grace), the load is its caller's no more: a Lua
    /// thread killed while it waited never closes it.
    deadline: Instant,
}

/// How long a load outlives its deadline before another load may take
/// its place: its caller closes it at the deadline when it still can.
const ABANDONED_AFTER: Duration = Duration::from_secs(1);

impl Reflection {
    /// Whether the load is over, its outcome waiting for its caller.
    pub(super) fn is_finished(&self) -> bool {
        self.outcome.is_some()
    }
}

impl Client {
    /// Starts loading the services of connection `conn`'s server (`None`:
    /// every service it lists); the returned call ends when the load does.
    /// `timeout` is its caller's deadline.
    pub fn reflect(
        &self,
        conn: ConnId,
        services: Option<&[String]>,
        timeout: Duration,
    ) -> Result<CallId, ClientError> {
        if !lock(&self.inner.conns).contains_key(&conn) {
            return Err(ClientError::UnknownConn);
        }
        let (id, woken) = {
            let mut host = lock(&self.inner.host);
            let mut pending = self.sweep_abandoned(&mut host);
            let mut reflections = lock(&self.inner.reflections);
            if reflections.len() >= MAX_REFLECTIONS {
                return Err(ClientError::Reflection(format!(
                    "{MAX_REFLECTIONS} reflection loads are running in this worker already; \
                     wait for one to end"
                )));
            }
            let id = {
                let mut events = lock(&self.inner.events);
                let id = host.reserve_id(|id| events.contains_key(&id))?;
                events.insert(id, Queue::default());
                id
            };
            let loader = Loader::new(Version::V1, services, Registry::bundled_files());
            let reflection = Reflection {
                conn,
                token: None,
                loader: Some(loader),
                outcome: None,
                deadline: Instant::now() + timeout,
            };
            reflections.insert(id, reflection);
            self.inner
                .reflecting
                .store(reflections.len(), Ordering::Release);
            if let Some(reflection) = reflections.get_mut(&id) {
                self.open(&mut host, id, reflection, &mut pending);
            }
            drop(reflections);
            (id, self.run_from(&mut host, pending))
        };
        self.wake(woken);
        Ok(id)
    }

    /// The services a finished load added, once its call has ended
    /// successfully: the set joins what the module is configured with,
    /// all or nothing. A file already loaded under the same name stays
    /// (the first one loaded under a name is kept, as with every set);
    /// should a service the load found then be missing, nothing is added.
    pub fn reflected(&self, id: CallId) -> Result<Vec<String>, ClientError> {
        let outcome = {
            let mut reflections = lock(&self.inner.reflections);
            let outcome = reflections.get_mut(&id).and_then(|r| r.outcome.take());
            if outcome.is_some() {
                reflections.remove(&id);
                self.inner
                    .reflecting
                    .store(reflections.len(), Ordering::Release);
            }
            outcome
        };
        let reflected = match outcome {
            Some(result) => result.map_err(ClientError::Reflection)?,
            None => {
                return Err(ClientError::Reflection(
                    "no finished reflection load has this id".into(),
                ))
            }
        };
        let _changing = lock(&self.inner.changing);
        let services = reflected.services.clone();
        self.change_protos_checked(
            |protos| {
                protos
                    .with_descriptor_set(&reflected.descriptor_set)
                    .map_err(super::schema::refused)
            },
            |host| {
                let loaded = super::schema::registry_of(&host.descriptor_set()?)?;
                for service in &services {
                    if loaded.pool().get_service_by_name(service).is_none() {
                        return Err(ClientError::Reflection(format!(
                            "service '{service}' is not in the loaded set: a file that defines it \
                             on the server has the name of a file loaded before, which stays \
                             (the first file loaded under a name is kept)"
                        )));
                    }
                }
                Ok(())
            },
        )?;
        Ok(services)
    }

    /// Whether `token` is a reflection stream's; cheap while none runs.
    pub(super) fn is_reflection(&self, token: Token) -> bool {
        self.inner.reflecting.load(Ordering::Acquire) > 0
            && lock(&self.inner.reflections)
                .values()
                .any(|r| r.token == Some(token))
    }

    /// An event of a reflection stream: the loader reads it and says
    /// what to send, or the load ends (its caller's call with it).
    pub(super) fn reflection_event(
        &self,
        host: &mut ProxyHost,
        token: Token,
        event: GrpcEvent,
        pending: &mut VecDeque<(Token, GrpcEvent)>,
        woken: &mut Vec<CallId>,
    ) {
        let mut reflections = lock(&self.inner.reflections);
        let Some((&id, reflection)) = reflections.iter_mut().find(|(_, r)| r.token == Some(token))
        else {
            return;
        };
        let Some(loader) = reflection.loader.as_mut() else {
            return;
        };
        let ended = match event {
            GrpcEvent::InitialMetadata(_) | GrpcEvent::TrailingMetadata(_) => return,
            GrpcEvent::Message(bytes) => match loader.on_answer(&bytes) {
                Ok(Some(requests)) => {
                    for request in requests {
                        let produced = self.on_call(token, |c| c.send(request, true));
                        super::module::queue(produced, pending);
                    }
                    return;
                }
                // Everything asked was answered: the stream has done its work.
                Ok(None) => None,
                Err(e) => Some(e),
            },
            GrpcEvent::Close(code, message) => {
                reflection.token = None;
                host.release_token(token);
                let code = Code::from_i32(i32::try_from(code).unwrap_or(2));
                match loader.on_close(code, &grpc_wasm::status::percent_decode(&message)) {
                    Ok(Some(_)) => {
                        self.open(host, id, reflection, pending);
                        return;
                    }
                    Ok(None) => None,
                    Err(e) => Some(e),
                }
            }
        };
        self.stop_stream(host, reflection, pending);
        let outcome = match (ended, reflection.loader.take()) {
            (Some(e), _) => Err(e),
            (None, Some(loader)) => loader.finish(),
            (None, None) => return,
        };
        let reply = match &outcome {
            Ok(reflected) => {
                let body = serde_json::json!({ "services": reflected.services });
                local_reply(Code::Ok, body.to_string())
            }
            Err(e) => status_reply(e.code(), &e.to_string()),
        };
        reflection.outcome = Some(outcome.map_err(|e| e.to_string()));
        drop(reflections);
        self.push(id, Event::End(reply), woken);
    }

    /// Opens the stream for the loader's version and sends what it asks.
    fn open(
        &self,
        host: &mut ProxyHost,
        id: CallId,
        reflection: &mut Reflection,
        pending: &mut VecDeque<(Token, GrpcEvent)>,
    ) {
        let Some(loader) = reflection.loader.as_mut() else {
            return;
        };
        let token = host.reserve_token();
        reflection.token = Some(token);
        let target = GrpcTarget {
            upstream: reflection.conn.0.to_string(),
            service: loader.version().service().to_string(),
            method: METHOD.to_string(),
            ..GrpcTarget::default()
        };
        let requests = loader.requests();
        let produced = self.start_call(token, target, |conn, call| {
            let wire = conn.socket().map(|_| reflection.conn);
            conn.stream(call, self.gate(id, wire))
        });
        super::module::queue(produced, pending);
        for request in requests {
            let produced = self.on_call(token, |c| c.send(request, true));
            super::module::queue(produced, pending);
        }
    }

    /// Cancels a reflection stream still in flight. What the cancel
    /// produces joins `pending`: on a wire connection it is every call's
    /// events that the connection had ready, not only this stream's.
    fn stop_stream(
        &self,
        host: &mut ProxyHost,
        reflection: &mut Reflection,
        pending: &mut VecDeque<(Token, GrpcEvent)>,
    ) {
        if let Some(token) = reflection.token.take() {
            if let Some(call) = lock(&self.inner.calls).remove(&token) {
                super::module::queue(call.cancel(), pending);
            }
            host.release_token(token);
        }
    }

    /// A reflection call its caller closes: its stream ends, its load is
    /// forgotten. Returns the transport events to run.
    pub(super) fn forget_reflection(
        &self,
        host: &mut ProxyHost,
        id: CallId,
    ) -> VecDeque<(Token, GrpcEvent)> {
        let mut pending = VecDeque::new();
        let mut reflections = lock(&self.inner.reflections);
        if let Some(mut reflection) = reflections.remove(&id) {
            self.stop_stream(host, &mut reflection, &mut pending);
        }
        self.inner
            .reflecting
            .store(reflections.len(), Ordering::Release);
        pending
    }

    /// Forgets the loads whose caller let their deadline pass by more than
    /// [`ABANDONED_AFTER`] without closing them (a killed Lua thread), so
    /// that they hold no slot, stream or set for good.
    fn sweep_abandoned(&self, host: &mut ProxyHost) -> VecDeque<(Token, GrpcEvent)> {
        let now = Instant::now();
        let abandoned: Vec<CallId> = lock(&self.inner.reflections)
            .iter()
            .filter(|(_, r)| now > r.deadline + ABANDONED_AFTER)
            .map(|(id, _)| *id)
            .collect();
        let mut pending = VecDeque::new();
        for id in abandoned {
            pending.extend(self.forget_reflection(host, id));
            lock(&self.inner.events).remove(&id);
        }
        pending
    }
}
