//! The wake-up path for stock nginx-lua, where no C module can hand the
//! event loop a file descriptor: a per-worker Unix socket that a Lua
//! cosocket reads. A byte says "calls are ready"; the reader then takes the
//! ready call ids through the FFI and posts their semaphores. Bytes are
//! coalesced: one is written only when the ready list goes from empty to
//! not empty, so a busy worker pays one write per batch, not per call.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::client::lock;

#[derive(Default)]
struct Ready {
    ids: Vec<u32>,
    /// A byte is on its way and the reader has not drained since.
    signalled: bool,
}

pub struct Notifier {
    path: PathBuf,
    reader: Mutex<Option<UnixStream>>,
    ready: Mutex<Ready>,
}

impl Notifier {
    /// Listens on a fresh socket path in `dir`; the reader may connect (and
    /// reconnect) at any time.
    pub fn listen(dir: &Path) -> std::io::Result<Arc<Notifier>> {
        let path = dir.join(format!(
            "grpc-wasm-{}-{:08x}.sock",
            std::process::id(),
            rand_u32()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let notifier = Arc::new(Notifier {
            path,
            reader: Mutex::new(None),
            ready: Mutex::new(Ready::default()),
        });
        let beat = Arc::downgrade(&notifier);
        std::thread::Builder::new()
            .name("grpc-wasm-beat".into())
            .spawn(move || heartbeat(beat))?;
        let weak = Arc::downgrade(&notifier);
        std::thread::Builder::new()
            .name("grpc-wasm-notify".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Some(notifier) = weak.upgrade() else {
                        return;
                    };
                    if let Ok(stream) = stream {
                        let _ = stream.set_nonblocking(true);
                        *lock(&notifier.reader) = Some(stream);
                        // Whatever became ready before the reader came.
                        let mut ready = lock(&notifier.ready);
                        ready.signalled = false;
                        if !ready.ids.is_empty() {
                            notifier.signal(&mut ready);
                        }
                    }
                }
            })?;
        Ok(notifier)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks a call ready and wakes the reader if it is not already woken.
    pub fn wake(&self, id: u32) {
        let mut ready = lock(&self.ready);
        ready.ids.push(id);
        if !ready.signalled {
            self.signal(&mut ready);
        }
    }

    fn signal(&self, ready: &mut Ready) {
        if let Some(stream) = lock(&self.reader).as_mut() {
            ready.signalled = match stream.write(&[1]) {
                Ok(_) => true,
                // A full socket buffer means bytes are already waiting.
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            };
        }
    }

    /// The ready ids, oldest first; the next wake writes a byte again.
    pub fn drain(&self, out: &mut [u32]) -> usize {
        let mut ready = lock(&self.ready);
        let n = ready.ids.len().min(out.len());
        out[..n].copy_from_slice(&ready.ids[..n]);
        ready.ids.drain(..n);
        if ready.ids.is_empty() {
            ready.signalled = false;
        }
        n
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A byte every half second, so that the reader's read never times out
/// (nginx would log each timeout) and it sees a worker exit promptly.
fn heartbeat(notifier: std::sync::Weak<Notifier>) {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let Some(notifier) = notifier.upgrade() else {
            return;
        };
        let mut reader = lock(&notifier.reader);
        if let Some(stream) = reader.as_mut() {
            let _ = stream.write(&[0]);
        }
    }
}

fn rand_u32() -> u32 {
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    u32::from_le_bytes(bytes)
}
