//! The connection registry: ids the caller holds for the connections it
//! opened, on either transport. The client knows a connection only as a
//! [`CallTransport`](crate::transport::CallTransport) (and, when the
//! caller drives its socket, a [`CallerSocket`]), never as one transport.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Client, ClientError, Conn};
use crate::call::{events, ConnId};
use crate::sync::lock;
use crate::transport::{runtime, wire, CallerSocket, Keepalive, TlsOptions};

impl Client {
    /// A connection on the runtime transport (tonic on the client's tokio
    /// runtime). Returns its id.
    pub fn connect(
        &self,
        addr: &str,
        tls: &TlsOptions,
        keepalive: &Keepalive,
    ) -> Result<ConnId, ClientError> {
        let _guard = self.inner.runtime.enter();
        let upstream = runtime::connect(addr, tls, keepalive)?;
        Ok(self.register(Arc::new(upstream)))
    }

    /// A connection whose socket the caller owns and drives with
    /// [`Client::wire_input`] and [`Client::wire_output`]: calls on it run
    /// on the caller's thread, and [`Client::wire_tick`] keeps it honest.
    pub fn connect_wire(
        &self,
        addr: &str,
        tls: &TlsOptions,
        keepalive: &Keepalive,
    ) -> Result<ConnId, ClientError> {
        let wire = wire::connect(addr, tls, keepalive)?;
        Ok(self.register(Arc::new(wire)))
    }

    pub(super) fn register(&self, conn: Conn) -> ConnId {
        let id = ConnId(self.inner.next_conn.fetch_add(1, Ordering::Relaxed));
        lock(&self.inner.conns).insert(id, conn);
        id
    }

    /// Forgets a connection; one whose socket the caller drives ends its
    /// calls UNAVAILABLE.
    pub fn close_conn(&self, conn: ConnId) {
        let removed = lock(&self.inner.conns).remove(&conn);
        if let Some(conn) = removed {
            let produced = conn.close(events::CONNECTION_CLOSED);
            let woken = self.produced(produced);
            self.wake(woken);
        }
    }

    /// The connection a call's target names (its id, as the module's
    /// upstream header carries it).
    pub(super) fn conn(&self, upstream: &str) -> Option<Conn> {
        self.conn_by_id(ConnId(upstream.parse().ok()?))
    }

    pub(super) fn conn_by_id(&self, id: ConnId) -> Option<Conn> {
        lock(&self.inner.conns).get(&id).cloned()
    }

    /// `f` on connection `conn`'s socket, when the caller drives it.
    pub(super) fn with_socket<T>(
        &self,
        conn: ConnId,
        f: impl FnOnce(&dyn CallerSocket) -> T,
    ) -> Result<T, ClientError> {
        let conn = self.conn_by_id(conn).ok_or(ClientError::UnknownConn)?;
        let socket = conn.socket().ok_or(ClientError::UnknownConn)?;
        Ok(f(socket))
    }
}
