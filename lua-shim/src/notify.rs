//! The wake-up path for stock nginx-lua, where no C module can hand the
//! event loop a file descriptor: a per-worker Unix socket that a Lua
//! cosocket reads. A byte says "calls are ready"; the reader then takes the
//! ready call ids through the FFI and posts their semaphores. Bytes are
//! coalesced: one is written only when the ready list goes from empty to
//! not empty, so a busy worker pays one write per batch, not per call.
//!
//! The reader is whoever connected last, so a stranger who connected would
//! take the wake-ups away from the worker: the socket lives in a fresh
//! directory that only this user can enter (created 0700, never reused),
//! and a connection is kept only from this very process (`SO_PEERCRED`).

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::sync::lock;

#[derive(Default)]
struct Ready {
    ids: Vec<u32>,
    /// A byte is on its way and the reader has not drained since.
    signalled: bool,
}

pub struct Notifier {
    /// The private directory that holds the socket.
    dir: PathBuf,
    path: PathBuf,
    /// Held locked for the process's life: a directory whose lock can be
    /// taken belongs to no live process (see `sweep_stale`).
    _alive: std::fs::File,
    reader: Mutex<Option<UnixStream>>,
    ready: Mutex<Ready>,
}

impl Notifier {
    /// Listens on a socket in a fresh private directory under `parent`;
    /// the reader may connect (and reconnect) at any time.
    pub fn listen(parent: &Path) -> std::io::Result<Arc<Notifier>> {
        sweep_stale(parent);
        let dir = private_dir(parent)?;
        let path = dir.join("wake.sock");
        let alive = match hold_alive_lock(&dir) {
            Ok(file) => file,
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        let listener = match UnixListener::bind(&path) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = std::fs::remove_file(dir.join(ALIVE));
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        remove_at_exit(&dir, &path);
        let notifier = Arc::new(Notifier {
            dir,
            path,
            _alive: alive,
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
                        if let Err(why) = own_peer(&stream) {
                            eprintln!("[grpc-wasm] wake-up socket: refused a connection: {why}");
                            continue;
                        }
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
        let _ = std::fs::remove_file(self.dir.join(ALIVE));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The file whose lock says a directory's process lives.
const ALIVE: &str = "alive.lock";

/// Creates the directory's lock file and takes its lock, which the
/// process holds until it ends (the kernel lets it go even on SIGKILL).
fn hold_alive_lock(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(ALIVE))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(file)
}

/// Whether a directory's process is gone: its lock can be taken. A
/// directory from before the lock (none there) is judged by its pid, in
/// this pid namespace.
fn owner_gone(dir: &Path, pid: u32) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(dir.join(ALIVE));
    match lock {
        Ok(file) => {
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            !Path::new("/proc").join(pid.to_string()).exists()
        }
        Err(_) => false,
    }
}

/// What an exiting process removes: the worker's Notifier lives as long as
/// the process, whose statics are never dropped, and an nginx worker ends
/// with exit(), which runs atexit handlers.
static AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn remove_sockets() {
    // Never panics: a poisoned lock still holds the paths.
    let paths = match AT_EXIT.lock() {
        Ok(paths) => paths,
        Err(poisoned) => poisoned.into_inner(),
    };
    for path in paths.iter() {
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path.join(ALIVE));
        let _ = std::fs::remove_dir(path);
    }
}

/// Registers the socket and its directory (in that order) for removal at
/// exit; the handler once per process.
fn remove_at_exit(dir: &Path, socket: &Path) {
    let mut paths = lock(&AT_EXIT);
    if paths.is_empty() {
        // SAFETY: `remove_sockets` is a plain `extern "C" fn()` that lives
        // as long as the process; atexit only stores it.
        let _ = unsafe { atexit(remove_sockets) };
    }
    paths.push(socket.to_path_buf());
    paths.push(dir.to_path_buf());
}

/// Removes the directories that processes now gone left in `parent` (a
/// worker killed by a signal runs no exit handler): only ours, of this
/// user, named `grpc-wasm-<pid>-<hex>`, whose lock no process holds. The
/// lock, not the pid, decides: processes in other pid namespaces (two
/// containers sharing /tmp) and reused pids are told apart.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = stale_pid(&name.to_string_lossy()) else {
            continue;
        };
        let ours = entry
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == me && m.is_dir());
        if ours && owner_gone(&entry.path(), pid) {
            let _ = std::fs::remove_file(entry.path().join("wake.sock"));
            let _ = std::fs::remove_file(entry.path().join(ALIVE));
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// The pid in a directory name `private_dir` makes.
fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("grpc-wasm-")?;
    let (pid, random) = rest.split_once('-')?;
    let hex = random.len() == 8 && random.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| pid.parse().ok()).flatten()
}

/// A new directory only this user can enter; `mkdir` fails on any existing
/// name, so a directory (or link) planted in advance is never used.
fn private_dir(parent: &Path) -> std::io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..8 {
        let dir = parent.join(format!(
            "grpc-wasm-{}-{:08x}",
            std::process::id(),
            rand_u32()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free directory name")))
}

/// Why a peer is not this process (the only legitimate reader is the Lua
/// cosocket of the worker that loaded the shim).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum PeerRefusal {
    #[error("cannot read the peer's credentials: {0}")]
    Credentials(String),
    #[error("the peer is pid {0} (uid {1}), not this process (pid {2})")]
    Stranger(i32, u32, i32),
}

fn own_peer(stream: &UnixStream) -> Result<(), PeerRefusal> {
    let cred = rustix::net::sockopt::socket_peercred(stream)
        .map_err(|e| PeerRefusal::Credentials(e.to_string()))?;
    let me = rustix::process::getpid();
    if cred.pid == me && cred.uid == rustix::process::geteuid() {
        Ok(())
    } else {
        Err(PeerRefusal::Stranger(
            cred.pid.as_raw_nonzero().get(),
            cred.uid.as_raw(),
            me.as_raw_nonzero().get(),
        ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read};
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, Instant};

    #[test]
    fn directories_of_gone_processes_are_swept_and_live_ones_kept() {
        let parent = std::env::temp_dir().join(format!("grpc-wasm-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        // A pid that was a process a moment ago and is none now.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let stale = parent.join(format!("grpc-wasm-{gone}-0000abcd"));
        let live = parent.join(format!("grpc-wasm-{}-0000abcd", std::process::id()));
        let other = parent.join(format!("grpc-wasm-{gone}-notours"));
        // Another pid namespace's live worker: its pid means nothing here,
        // its lock is held.
        let elsewhere = parent.join(format!("grpc-wasm-{gone}-0000beef"));
        // A worker of the lock's days that ended: the lock is free.
        let ended = parent.join(format!("grpc-wasm-{}-0000cafe", std::process::id()));
        for dir in [&stale, &live, &other, &elsewhere, &ended] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(stale.join("wake.sock"), b"").unwrap();
        let held = hold_alive_lock(&elsewhere).unwrap();
        drop(hold_alive_lock(&ended).unwrap());
        let notifier = Notifier::listen(&parent).unwrap();
        assert!(!stale.exists() && !ended.exists());
        assert!(live.exists() && other.exists() && elsewhere.exists());
        drop(held);
        std::fs::remove_file(elsewhere.join(ALIVE)).unwrap();
        std::fs::remove_dir(&elsewhere).unwrap();
        // The new one registered for removal at exit.
        assert!(lock(&AT_EXIT).contains(&notifier.path().to_path_buf()));
        drop(notifier);
        for dir in [&live, &other] {
            std::fs::remove_dir(dir).unwrap();
        }
        std::fs::remove_dir(&parent).unwrap();
        assert_eq!(stale_pid("grpc-wasm-12-0a0b0c0d"), Some(12));
        assert_eq!(stale_pid("grpc-wasm-12-xyz"), None);
    }

    /// Reads until a byte 1 ("calls are ready") comes, skipping heartbeats.
    fn woken(stream: &mut UnixStream, within: Duration) -> bool {
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let until = Instant::now() + within;
        let mut byte = [0u8; 1];
        while Instant::now() < until {
            if let Ok(1) = stream.read(&mut byte) {
                if byte[0] == 1 {
                    return true;
                }
            }
        }
        false
    }

    #[test]
    fn the_socket_is_in_a_fresh_private_directory() {
        let parent = std::env::temp_dir();
        let a = Notifier::listen(&parent).unwrap();
        let b = Notifier::listen(&parent).unwrap();
        let dir = a.path().parent().unwrap();
        assert_ne!(dir, b.path().parent().unwrap());
        let meta = std::fs::symlink_metadata(dir).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o777, 0o700);
        let path = a.path().to_path_buf();
        let dir = dir.to_path_buf();
        drop(a);
        assert!(!path.exists() && !dir.exists());
    }

    #[test]
    fn another_process_cannot_take_the_reader() {
        let notifier = Notifier::listen(&std::env::temp_dir()).unwrap();
        let mut ours = UnixStream::connect(notifier.path()).unwrap();
        // A stranger connects after us (here a child process; in life,
        // another local user): it would become the reader.
        let script = "import socket,sys,time\n\
                      s=socket.socket(socket.AF_UNIX)\n\
                      s.connect(sys.argv[1])\n\
                      print('connected', flush=True)\n\
                      time.sleep(5)\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(notifier.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "connected\n");
        std::thread::sleep(Duration::from_millis(200));
        notifier.wake(5);
        let got = woken(&mut ours, Duration::from_secs(2));
        let _ = child.kill();
        let _ = child.wait();
        assert!(got, "the wake-up went to the other process");
        let mut ids = [0u32; 4];
        assert_eq!(notifier.drain(&mut ids), 1);
        assert_eq!(ids[0], 5);
    }

    #[test]
    fn a_peer_in_this_process_is_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(own_peer(&a), Ok(()));
    }
}
