//! The compiled-module cache. A `.cwasm` file is machine code that
//! wasmtime maps and runs, so whoever can write the file, or the directory
//! that holds it, owns every process that loads it. A cache entry is used
//! only when nobody but this process's user could have written it: the
//! directory and the file are opened without following symbolic links and
//! checked on the open descriptors (owner is the effective uid, no write
//! bit for group or others). Anything else is logged and the module is
//! compiled instead; the caller never sees an error for it.

use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use wasmtime::{Engine, Module};

use crate::wasm::instance::load;
use crate::wasm::HostError;

/// Why a cache directory or entry is not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("{0} is a symbolic link")]
    Symlink(PathBuf),
    #[error("{0} is owned by uid {1}, not by this process's uid {2}")]
    Owner(PathBuf, u32, u32),
    #[error("{0} is writable by group or others (mode {1:o})")]
    Writable(PathBuf, u32),
    #[error("{0} is not a {1}")]
    Kind(PathBuf, &'static str),
    #[error("cannot open {0}: {1}")]
    Io(PathBuf, String),
}

/// Where the cache lives unless the caller says otherwise:
/// `$XDG_CACHE_HOME/grpc-wasm`, else `$HOME/.cache/grpc-wasm` when `$HOME`
/// belongs to this process's user, else `<temp dir>/grpc-wasm-<euid>`.
/// nginx clears the environment of its workers (HOME included, unless an
/// `env` directive keeps it), so a worker usually takes the last one.
pub fn default_dir() -> PathBuf {
    let euid = rustix::process::geteuid().as_raw();
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = absolute("XDG_CACHE_HOME") {
        return xdg.join("grpc-wasm");
    }
    // A worker that kept root's HOME after switching users must not try
    // (and fail) to cache under it.
    let own_home = absolute("HOME").filter(|h| std::fs::metadata(h).is_ok_and(|m| m.uid() == euid));
    if let Some(home) = own_home {
        return home.join(".cache").join("grpc-wasm");
    }
    std::env::temp_dir().join(format!("grpc-wasm-{euid}"))
}

/// The cache directory for a caller's setting: none given, [`default_dir`];
/// an empty one, no cache at all.
pub fn resolve(setting: Option<&str>) -> Option<PathBuf> {
    match setting {
        None => Some(default_dir()),
        Some("") => None,
        Some(dir) => Some(PathBuf::from(dir)),
    }
}

/// The module from `dir`'s cache when a safe entry is there; otherwise
/// compiled, and stored for the next process when `dir` is safe.
pub(crate) fn load_or_compile(
    engine: &Engine,
    wasm: &[u8],
    dir: Option<&Path>,
) -> Result<Module, HostError> {
    let Some(dir) = dir else {
        return Module::new(engine, wasm).map_err(load);
    };
    let name = entry_name(engine, wasm);
    let dir_fd = match open_dir(dir) {
        Ok(fd) => fd,
        Err(refusal) => {
            note(&refusal);
            return Module::new(engine, wasm).map_err(load);
        }
    };
    match open_entry(&dir_fd, dir, &name) {
        Ok(Some(file)) => {
            // SAFETY: the file is a regular file owned by this process's
            // user, writable by nobody else, in a directory with the same
            // properties, opened without following links: only this user
            // (who can already run any code as itself) could have written
            // it, and this shim writes entries only from Module::serialize
            // for an engine with the same settings (the name carries their
            // hash). wasmtime still checks the header and refuses a
            // mismatch, which falls back to compiling.
            match unsafe { Module::deserialize_open_file(engine, file) } {
                Ok(module) => return Ok(module),
                Err(e) => note(&format!("{}: {e}", dir.join(&name).display())),
            }
        }
        Ok(None) => {}
        Err(refusal) => note(&refusal),
    }
    let module = Module::new(engine, wasm).map_err(load)?;
    if let Ok(bytes) = module.serialize() {
        if let Err(e) = store(&dir_fd, &name, &bytes) {
            note(&format!("cannot write {}: {e}", dir.join(&name).display()));
        }
    }
    Ok(module)
}

/// Same bytes and same engine settings, same name.
fn entry_name(engine: &Engine, wasm: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    wasm.hash(&mut hasher);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("grpc-wasm-{:016x}.cwasm", hasher.finish())
}

fn note(why: &dyn std::fmt::Display) {
    // nginx sends its workers' stderr to the error log.
    eprintln!("[grpc-wasm] compiled-module cache not used: {why}; compiling the module instead");
}

/// The cache directory, created private if missing, opened without
/// following a link, and checked on the descriptor (which every later step
/// uses, so the checked directory is the one written).
fn open_dir(dir: &Path) -> Result<OwnedFd, Refusal> {
    let io = |e: std::io::Error| Refusal::Io(dir.to_path_buf(), e.to_string());
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        // A link in its place is refused below, with its own reason.
        Err(_) if std::fs::symlink_metadata(dir).is_ok() => {}
        Err(e) => return Err(io(e)),
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| refusal_of(dir, e))?;
    check(dir, &file.metadata().map_err(io)?, Kind::Directory)?;
    Ok(OwnedFd::from(file))
}

/// The entry, checked; `None` when there is none yet.
fn open_entry(dir_fd: &OwnedFd, dir: &Path, name: &str) -> Result<Option<File>, Refusal> {
    let path = dir.join(name);
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = match rustix::fs::openat(dir_fd, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(refusal_of(&path, e.into())),
    };
    let file = File::from(fd);
    let metadata = file
        .metadata()
        .map_err(|e| Refusal::Io(path.clone(), e.to_string()))?;
    check(&path, &metadata, Kind::File)?;
    Ok(Some(file))
}

/// Writes a new entry beside the old name and renames it over, so a reader
/// never sees half a file; the new file is created (never reused), private,
/// in the checked directory.
fn store(dir_fd: &OwnedFd, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!("{name}.{}.{:08x}.tmp", std::process::id(), random());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir_fd, tmp.as_str(), flags, Mode::from_raw_mode(0o600))?;
    let written = File::from(fd)
        .write_all(bytes)
        .and_then(|()| Ok(rustix::fs::renameat(dir_fd, tmp.as_str(), dir_fd, name)?));
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir_fd, tmp.as_str(), AtFlags::empty());
    }
    written
}

#[derive(Clone, Copy)]
enum Kind {
    Directory,
    File,
}

fn check(path: &Path, metadata: &Metadata, kind: Kind) -> Result<(), Refusal> {
    let euid = rustix::process::geteuid().as_raw();
    let (right_kind, what) = match kind {
        Kind::Directory => (metadata.is_dir(), "directory"),
        Kind::File => (metadata.is_file(), "regular file"),
    };
    if !right_kind {
        return Err(Refusal::Kind(path.to_path_buf(), what));
    }
    if metadata.uid() != euid {
        return Err(Refusal::Owner(path.to_path_buf(), metadata.uid(), euid));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Refusal::Writable(path.to_path_buf(), mode));
    }
    Ok(())
}

/// O_NOFOLLOW answers a link with ELOOP (ENOTDIR with O_DIRECTORY); say
/// so plainly.
fn refusal_of(path: &Path, e: std::io::Error) -> Refusal {
    let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if link || e.raw_os_error() == Some(libc::ELOOP) {
        Refusal::Symlink(path.to_path_buf())
    } else {
        Refusal::Io(path.to_path_buf(), e.to_string())
    }
}

fn random() -> u32 {
    let mut bytes = [0u8; 4];
    // A clash only makes the O_EXCL create fail, which skips the store.
    let _ = getrandom::fill(&mut bytes);
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// An empty module: what the cache is asked for.
    const EMPTY: &[u8] = b"\0asm\x01\0\0\0";
    /// Another module, with one export `f`: planted under EMPTY's name, it
    /// shows whether the cache loaded the planted file.
    const PLANTED: &[u8] = &[
        0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, // header
        1, 4, 1, 0x60, 0, 0, // type: () -> ()
        3, 2, 1, 0, // one function of type 0
        7, 5, 1, 1, b'f', 0, 0, // export "f" = function 0
        10, 4, 1, 2, 0, 0x0b, // its body: end
    ];

    struct Setup {
        engine: Engine,
        root: tempdir::Dir,
    }

    mod tempdir {
        /// A private temporary directory, removed at drop.
        pub struct Dir(pub std::path::PathBuf);
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn setup() -> Setup {
        let root = std::env::temp_dir().join(format!(
            "grpc-wasm-cache-test-{}-{:08x}",
            std::process::id(),
            random()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .unwrap();
        Setup {
            engine: Engine::default(),
            root: tempdir::Dir(root),
        }
    }

    impl Setup {
        fn path(&self, name: &str) -> PathBuf {
            self.root.0.join(name)
        }

        /// A cache directory holding PLANTED's code under EMPTY's name.
        fn planted(&self, dir: &str) -> (PathBuf, PathBuf) {
            let dir = self.path(dir);
            std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
            let entry = dir.join(entry_name(&self.engine, EMPTY));
            self.write_planted(&entry);
            (dir, entry)
        }

        fn write_planted(&self, at: &Path) {
            let code = Module::new(&self.engine, PLANTED)
                .unwrap()
                .serialize()
                .unwrap();
            std::fs::write(at, code).unwrap();
            std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o600)).unwrap();
        }

        fn load(&self, dir: &Path) -> Module {
            load_or_compile(&self.engine, EMPTY, Some(dir)).unwrap()
        }
    }

    fn exports(module: &Module) -> usize {
        module.exports().count()
    }

    #[test]
    fn a_safe_entry_is_used() {
        // The control for every refusal below: the same plant, safe, loads.
        let s = setup();
        let (dir, _) = s.planted("cache");
        assert_eq!(exports(&s.load(&dir)), 1);
    }

    #[test]
    fn a_missing_directory_is_made_private_and_filled() {
        let s = setup();
        let dir = s.path("a/b/cache");
        assert_eq!(exports(&s.load(&dir)), 0);
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        let entry = std::fs::metadata(dir.join(entry_name(&s.engine, EMPTY))).unwrap();
        assert_eq!(entry.mode() & 0o777, 0o600);
        assert_eq!(entry.uid(), rustix::process::geteuid().as_raw());
        // And the next process loads it.
        assert_eq!(exports(&s.load(&dir)), 0);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    }

    #[test]
    fn an_entry_owned_by_another_user_is_refused_and_replaced() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: chown to another uid needs root");
            return;
        }
        let s = setup();
        let (dir, entry) = s.planted("cache");
        std::os::unix::fs::chown(&entry, Some(65534), Some(65534)).unwrap();
        let name = entry_name(&s.engine, EMPTY);
        let fd = open_dir(&dir).unwrap();
        assert_eq!(
            open_entry(&fd, &dir, &name).err(),
            Some(Refusal::Owner(entry.clone(), 65534, 0))
        );
        assert_eq!(exports(&s.load(&dir)), 0);
        // Our own compilation took its place.
        assert_eq!(std::fs::metadata(&entry).unwrap().uid(), 0);
        assert_eq!(exports(&s.load(&dir)), 0);
    }

    #[test]
    fn a_directory_owned_by_another_user_is_refused() {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("skipped: chown to another uid needs root");
            return;
        }
        let s = setup();
        let (dir, _) = s.planted("cache");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        assert_eq!(
            open_dir(&dir).err(),
            Some(Refusal::Owner(dir.clone(), 65534, 0))
        );
        assert_eq!(exports(&s.load(&dir)), 0);
    }

    #[test]
    fn a_group_writable_directory_is_refused_and_left_alone() {
        let s = setup();
        let (dir, entry) = s.planted("cache");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert_eq!(
            open_dir(&dir).err(),
            Some(Refusal::Writable(dir.clone(), 0o770))
        );
        assert_eq!(exports(&s.load(&dir)), 0);
        // Nothing of ours is written where others could swap it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let planted = std::fs::read(&entry).unwrap();
        assert!(!planted.is_empty());
    }

    #[test]
    fn a_world_writable_entry_is_refused() {
        let s = setup();
        let (dir, entry) = s.planted("cache");
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o602)).unwrap();
        assert_eq!(exports(&s.load(&dir)), 0);
    }

    #[test]
    fn a_symlinked_entry_is_refused() {
        let s = setup();
        let dir = s.path("cache");
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let elsewhere = s.path("planted.cwasm");
        s.write_planted(&elsewhere);
        let entry = dir.join(entry_name(&s.engine, EMPTY));
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        let fd = open_dir(&dir).unwrap();
        assert_eq!(
            open_entry(&fd, &dir, &entry_name(&s.engine, EMPTY)).err(),
            Some(Refusal::Symlink(entry.clone()))
        );
        assert_eq!(exports(&s.load(&dir)), 0);
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let s = setup();
        let (real, _) = s.planted("real");
        let link = s.path("cache");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(open_dir(&link).err(), Some(Refusal::Symlink(link.clone())));
        assert_eq!(exports(&s.load(&link)), 0);
    }

    #[test]
    fn the_setting_picks_the_directory() {
        assert_eq!(resolve(Some("")), None);
        assert_eq!(resolve(Some("/x/y")), Some(PathBuf::from("/x/y")));
        assert_eq!(resolve(None), Some(default_dir()));
    }
}
