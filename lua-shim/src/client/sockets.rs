//! Connections whose socket the caller drives (a cosocket): it moves the
//! bytes and keeps the clock, and each step's events go into the module.

use std::time::Instant;

use super::{Client, ClientError};
use crate::call::{CallId, ConnId};

impl Client {
    /// Bytes from a wire connection's socket; returns the calls that got
    /// events (their waiters are the caller's to wake).
    pub fn wire_input(&self, conn: ConnId, bytes: &[u8]) -> Result<Vec<CallId>, ClientError> {
        let produced = self.with_socket(conn, |socket| socket.input(bytes))?;
        Ok(self.produced(produced))
    }

    /// Bytes for a wire connection's socket, swapped into `buffer` (emptied
    /// first): the connection keeps `buffer`'s allocation for its next
    /// bytes, so a steady caller allocates none.
    pub fn wire_output(&self, conn: ConnId, buffer: &mut Vec<u8>) -> Result<(), ClientError> {
        self.with_socket(conn, |socket| socket.swap_output(buffer))
    }

    /// A wire connection's state for its socket's owner: whether it has
    /// bytes to send, and whether its HTTP/2 connection is over.
    pub fn wire_state(&self, conn: ConnId) -> Result<(bool, bool), ClientError> {
        self.with_socket(conn, |socket| socket.state())
    }

    /// The keepalive's clock (see [`crate::transport::CallerSocket::tick`]): returns the calls woken
    /// and how many ms until the next tick is due (`None`: not before a
    /// call starts).
    pub fn wire_tick(&self, conn: ConnId) -> Result<(Vec<CallId>, Option<u64>), ClientError> {
        let (produced, next) = self.with_socket(conn, |socket| socket.tick(Instant::now()))?;
        // Rounded up, so that the next tick does not come before it is due.
        let next = next.map(|d| d.as_nanos().div_ceil(1_000_000) as u64);
        Ok((self.produced(produced), next))
    }

    /// The wire connection's socket is gone (`reason`): its calls fail with
    /// UNAVAILABLE, and a fresh HTTP/2 connection waits for a new socket.
    pub fn wire_reset(&self, conn: ConnId, reason: &str) -> Result<Vec<CallId>, ClientError> {
        let (produced, restarted) = self.with_socket(conn, |socket| socket.reset(reason))?;
        let woken = self.produced(produced);
        if let Err(e) = restarted {
            // The caller gets the error, not the calls to wake.
            self.wake(woken);
            return Err(e.into());
        }
        Ok(woken)
    }

    /// Runs a wire connection's tasks after a gate opened (the tonic
    /// transport's tasks are woken on the runtime by the gate itself).
    pub(super) fn resume_wire(&self, conn: ConnId) {
        let Ok(produced) = self.with_socket(conn, |socket| socket.poll()) else {
            return;
        };
        let woken = self.produced(produced);
        self.wake(woken);
    }
}
