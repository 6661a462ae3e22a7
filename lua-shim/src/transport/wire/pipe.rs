//! The bytes between h2 and the caller's socket, through rustls when the
//! connection has TLS: h2 reads what [`Pipe::feed`] put in and writes into
//! a buffer the caller empties.

use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sync::lock;

/// Why a TLS connection fails when its server goes on after closing it.
pub(super) const AFTER_CLOSE_NOTIFY: &str = "TLS: the server sent bytes after its close_notify";

use crate::limits::{MAX_UNREAD, MAX_UNSENT};

/// Why a connection whose server reads nothing of it failed.
pub(super) fn unread() -> String {
    format!("the server does not read what this side sends: {MAX_UNSENT} bytes wait unsent")
}

/// Why a connection whose input HTTP/2 stopped taking failed.
pub(super) fn untaken() -> String {
    format!("HTTP/2 does not take what the server sends: over {MAX_UNREAD} bytes wait unread")
}

/// The bytes between h2 and the socket, with TLS in between when enabled.
#[derive(Default)]
pub(super) struct Pipe {
    tls: Option<rustls::ClientConnection>,
    /// Plaintext for h2 to read.
    inbound: BytesMut,
    /// Bytes for the socket.
    outbound: Vec<u8>,
    /// The socket is gone: h2 reads end-of-file.
    eof: bool,
    reader: Option<Waker>,
}

impl Pipe {
    pub(super) fn new(tls: Option<rustls::ClientConnection>) -> Pipe {
        Pipe {
            tls,
            ..Pipe::default()
        }
    }

    /// The socket is gone: h2 reads end-of-file.
    pub(super) fn close(&mut self) {
        self.eof = true;
    }

    /// The bytes for the socket, traded for `buffer`.
    pub(super) fn swap_outbound(&mut self, buffer: &mut Vec<u8>) {
        std::mem::swap(&mut self.outbound, buffer);
    }

    pub(super) fn has_outbound(&self) -> bool {
        !self.outbound.is_empty()
    }

    pub(super) fn outbound_len(&self) -> usize {
        self.outbound.len()
    }

    /// The bytes fed that h2 has not read.
    #[cfg(test)]
    pub(super) fn unread(&self) -> usize {
        self.inbound.len()
    }

    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        if self.inbound.len().saturating_add(bytes.len()) > MAX_UNREAD {
            return Err(untaken());
        }
        match &mut self.tls {
            None => self.inbound.extend_from_slice(bytes),
            Some(tls) => {
                while !bytes.is_empty() {
                    // After the peer's close_notify rustls takes nothing
                    // more (Ok(0)); looping on would spin the caller's
                    // thread forever.
                    if tls.read_tls(&mut bytes).map_err(|e| e.to_string())? == 0 {
                        return Err(AFTER_CLOSE_NOTIFY.into());
                    }
                    let state = tls.process_new_packets().map_err(|e| format!("TLS: {e}"))?;
                    let mut plain = [0u8; 16384];
                    loop {
                        match tls.reader().read(&mut plain) {
                            Ok(0) => break,
                            Ok(n) => self.inbound.extend_from_slice(&plain[..n]),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                            Err(e) => return Err(format!("TLS: {e}")),
                        }
                    }
                    if state.peer_has_closed() {
                        // A clean TLS end is the end of the stream for h2.
                        self.eof = true;
                        if !bytes.is_empty() {
                            return Err(AFTER_CLOSE_NOTIFY.into());
                        }
                    }
                }
                // Handshake answers, alerts.
                while tls.wants_write() {
                    tls.write_tls(&mut self.outbound)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.outbound.len().saturating_add(data.len()) > MAX_UNSENT {
            return Err(std::io::Error::other(unread()));
        }
        match &mut self.tls {
            None => self.outbound.extend_from_slice(data),
            Some(tls) => {
                // rustls holds plaintext written before the handshake ends.
                tls.writer().write_all(data)?;
                while tls.wants_write() {
                    tls.write_tls(&mut self.outbound)?;
                }
            }
        }
        Ok(())
    }
}

/// h2's end of the pipe.
#[derive(Clone)]
pub(super) struct PipeIo(pub(super) Arc<Mutex<Pipe>>);

impl AsyncRead for PipeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut pipe = lock(&self.0);
        if !pipe.inbound.is_empty() {
            let n = pipe.inbound.len().min(buf.remaining());
            buf.put_slice(&pipe.inbound[..n]);
            pipe.inbound.advance(n);
            return Poll::Ready(Ok(()));
        }
        if pipe.eof {
            return Poll::Ready(Ok(()));
        }
        pipe.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for PipeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(lock(&self.0).write(data).map(|()| data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_nothing_reads_fails_the_pipe_at_the_bound() {
        let mut pipe = Pipe::new(None);
        let chunk = vec![0u8; 65536];
        for _ in 0..MAX_UNREAD / chunk.len() {
            assert_eq!(pipe.feed(&chunk), Ok(()));
        }
        assert_eq!(pipe.feed(&[0]), Err(untaken()));
        assert_eq!(pipe.unread(), MAX_UNREAD);
        assert_eq!(
            untaken(),
            "HTTP/2 does not take what the server sends: over 4194304 bytes wait unread"
        );
    }
}
