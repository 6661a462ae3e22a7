//! The C ABI behind `resty.ffi.grpc` on stock nginx-lua (LuaJIT FFI).
//!
//! Every function catches panics and reports failure as a return value
//! with the text in `grpc_wasm_last_error()`: nothing unwinds into nginx.
//! One client per process, made on first use in each worker (after fork),
//! so no thread or socket crosses from the master.
//!
//! Strings come as pointer + length (Lua strings may hold NUL bytes); the
//! few C strings are NUL-terminated paths and PEM texts.

use rustc_hash::FxHashMap as HashMap;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};

use crate::call::{CallId, ConnId};
use crate::client::{compression_named, CallOptions, Client, Event};
use crate::notify::Notifier;
use crate::sync::lock;
use crate::transport::{Keepalive, TlsOptions};

struct Process {
    pid: u32,
    client: Client,
    notifier: Arc<Notifier>,
    socket_path: CString,
    /// The event each call last handed out, kept alive until the next one.
    current: Mutex<HashMap<u32, Event>>,
}

static PROCESS: Mutex<Option<Arc<Process>>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_error(message: impl Into<String>) {
    let text = message.into().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(text).unwrap_or_default());
}

/// Runs `f`; a panic or an error becomes -1 and the last error.
fn guard(f: impl FnOnce() -> Result<i32, String>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(message)) => {
            set_error(message);
            -1
        }
        Err(panic) => {
            let what = crate::client::panic_message(panic.as_ref());
            contained(&what);
            set_error(crate::ClientError::Panicked(what).to_string());
            -1
        }
    }
}

/// A panic caught at the C ABI: the client rebuilds what it may have left
/// half-written (`Client::after_panic`), so that the worker goes on.
fn contained(what: &str) {
    if let Ok(p) = process() {
        p.client.after_panic(what);
        p.current.clear_poison();
    }
}

/// Forks seen by this process image: a process found before the latest
/// fork belongs to the parent. Counting forks (`pthread_atfork`) instead of
/// asking for the pid spares a system call on every FFI call.
static FORKS: AtomicU32 = AtomicU32::new(0);
static WATCH_FORKS: Once = Once::new();

extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::AcqRel);
}

thread_local! {
    static CACHED: RefCell<Option<(u32, Arc<Process>)>> = const { RefCell::new(None) };
}

fn process() -> Result<Arc<Process>, String> {
    let forks = FORKS.load(Ordering::Acquire);
    let cached = CACHED.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|(seen, _)| *seen == forks)
            .map(|(_, p)| p.clone())
    });
    if let Some(p) = cached {
        return Ok(p);
    }
    let guard = lock(&PROCESS);
    match guard.as_ref() {
        Some(p) if p.pid == std::process::id() => {
            CACHED.with(|c| *c.borrow_mut() = Some((forks, p.clone())));
            Ok(p.clone())
        }
        _ => Err("grpc-wasm is not initialised in this worker (call grpc.init or any API function first)".into()),
    }
}

/// # Safety
/// `ptr` is NULL, or addresses `len` readable bytes that stay valid and
/// unchanged for `'a`.
unsafe fn bytes<'a>(ptr: *const c_char, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: not NULL, and `len` bytes are readable (this function's contract).
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }
}

/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
unsafe fn text(ptr: *const c_char) -> Option<String> {
    (!ptr.is_null()).then(|| {
        // SAFETY: not NULL, so a NUL-terminated string (this function's contract).
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Panics inside the ABI's guard when `GRPC_WASM_TEST_HOOKS` is set (else
/// -1 and an error): the tests' way to see what a panic leaves behind. Not
/// in the header: no user calls it.
///
/// cbindgen:ignore
#[no_mangle]
pub extern "C" fn grpc_wasm_test_panic() -> i32 {
    guard(|| {
        if std::env::var_os("GRPC_WASM_TEST_HOOKS").is_none() {
            return Err("test hooks are off (GRPC_WASM_TEST_HOOKS)".into());
        }
        panic!("a panic requested by a test")
    })
}

/// The shim's version (the project's), as a static C string: the Lua API
/// refuses a shim of another release.
#[no_mangle]
pub extern "C" fn grpc_wasm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The last error of this thread, as a C string (valid until the next call).
#[no_mangle]
pub extern "C" fn grpc_wasm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Loads the module and starts this worker's runtime; again in the same
/// process, does nothing. A process forked after init starts afresh (the
/// parent's threads do not exist in it).
///
/// # Safety
/// NUL-terminated strings; `cache_dir` NULL takes the default cache
/// directory and an empty one disables the cache (see
/// [`crate::host::cache::resolve`]); `socket_dir` NULL is the temp dir.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_init(
    module_path: *const c_char,
    cache_dir: *const c_char,
    socket_dir: *const c_char,
) -> i32 {
    guard(|| {
        WATCH_FORKS.call_once(|| {
            // SAFETY: registers a handler that only bumps an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(forked)) };
        });
        let mut slot = lock(&PROCESS);
        if slot.as_ref().is_some_and(|p| p.pid == std::process::id()) {
            return Ok(0);
        }
        if let Some(stale) = slot.take() {
            // The parent's runtime threads are gone in this process; dropping
            // it would wait for them.
            std::mem::forget(stale);
        }
        // SAFETY: NULL or NUL-terminated, as this function's contract says.
        let module_path = unsafe { text(module_path) }.ok_or("no module path")?;
        let wasm = std::fs::read(&module_path)
            .map_err(|e| format!("cannot read the wasm module {module_path}: {e}"))?;
        // SAFETY: as for `module_path`.
        let socket_dir = unsafe { text(socket_dir) }
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let notifier = Notifier::listen(&socket_dir)
            .map_err(|e| format!("cannot listen in {}: {e}", socket_dir.display()))?;
        let wake = {
            let notifier = notifier.clone();
            Arc::new(move |id: CallId| notifier.wake(id.0))
        };
        // SAFETY: as for `module_path`.
        let cache_dir = unsafe { text(cache_dir) };
        let cache = crate::host::cache::resolve(cache_dir.as_deref());
        let client = Client::new(&wasm, cache.as_deref(), wake).map_err(|e| e.to_string())?;
        let socket_path = CString::new(notifier.path().to_string_lossy().into_owned())
            .map_err(|e| e.to_string())?;
        *slot = Some(Arc::new(Process {
            pid: std::process::id(),
            client,
            notifier,
            socket_path,
            current: Mutex::new(HashMap::default()),
        }));
        Ok(0)
    })
}

/// The Unix socket path the worker's reader cosocket connects to.
#[no_mangle]
pub extern "C" fn grpc_wasm_socket_path() -> *const c_char {
    match process() {
        Ok(p) => p.socket_path.as_ptr(),
        Err(_) => std::ptr::null(),
    }
}

/// Takes up to `max` ready call ids into `out`; returns how many.
///
/// # Safety
/// `out` has room for `max` ids.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_ready(out: *mut u32, max: i32) -> i32 {
    guard(|| {
        let p = process()?;
        if out.is_null() || max <= 0 {
            return Ok(0);
        }
        // SAFETY: not NULL, with room for `max` ids (this function's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
        Ok(p.notifier.drain(out) as i32)
    })
}

/// Loads a `.proto` file and its imports; `include` is a list of
/// directories separated by newlines (may be NULL).
///
/// # Safety
/// NUL-terminated strings; `include` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_loadfile(path: *const c_char, include: *const c_char) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: NULL or NUL-terminated, as this function's contract says.
        let path = unsafe { text(path) }.ok_or("no path")?;
        // SAFETY: as for `path`.
        let include = unsafe { text(include) };
        let dirs: Vec<PathBuf> = include
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect();
        p.client
            .load_file(Path::new(&path), &dirs)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// # Safety
/// `data` addresses `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_load_descriptor_set(data: *const c_char, len: usize) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: `data` addresses `len` bytes (this function's contract).
        let data = unsafe { bytes(data, len) };
        p.client
            .load_descriptor_set(data)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Sets the JSON print options from a JSON object.
///
/// # Safety
/// `json` addresses `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_set_print_options(json: *const c_char, len: usize) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: `json` addresses `len` bytes (this function's contract).
        let json = unsafe { bytes(json, len) };
        let options = serde_json::from_slice(json).map_err(|e| format!("invalid options: {e}"))?;
        p.client
            .set_print_options(options)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// The cap on the response bytes each call holds for its caller
/// (`max_queued_bytes`); 0 or less restores the default.
#[no_mangle]
pub extern "C" fn grpc_wasm_set_max_queued_bytes(bytes: i64) -> i32 {
    guard(|| {
        let p = process()?;
        let bytes = usize::try_from(bytes)
            .ok()
            .filter(|b| *b > 0)
            .unwrap_or(crate::limits::DEFAULT_MAX_QUEUED_BYTES);
        p.client.set_max_queued_bytes(bytes);
        Ok(0)
    })
}

/// Keepalive interval and timeout and handshake timeout in ms, as the
/// connect functions take them: 0 or less is the default.
fn keepalive(interval_ms: i64, timeout_ms: i64, handshake_ms: i64) -> Keepalive {
    let ms = |v: i64| u64::try_from(v).unwrap_or(0);
    Keepalive::from_ms(ms(interval_ms), ms(timeout_ms), ms(handshake_ms))
}

/// What both connect functions take: one struct rather than eight
/// arguments, so that an option can be added without a new signature.
#[repr(C)]
pub struct ConnectOptions {
    /// `host:port`; the only field that may not be NULL.
    pub addr: *const c_char,
    /// TLS: the server name to verify (NULL with `ca` NULL: plaintext).
    pub host: *const c_char,
    /// TLS: a CA bundle to verify the server with (PEM file).
    pub ca: *const c_char,
    /// TLS: this side's certificate and key (PEM files), for mutual TLS.
    pub cert: *const c_char,
    pub key: *const c_char,
    /// Keepalive interval, keepalive timeout and handshake timeout, in ms;
    /// 0 or less: the default.
    pub keepalive_ms: i64,
    pub keepalive_timeout_ms: i64,
    pub handshake_timeout_ms: i64,
}

/// The address, TLS options and keepalive of a [`ConnectOptions`].
///
/// # Safety
/// `options` points to a `ConnectOptions` whose strings are NULL or
/// NUL-terminated.
unsafe fn connect_options(
    options: *const ConnectOptions,
) -> Result<(String, TlsOptions, Keepalive), String> {
    // SAFETY: `options` is NULL or points to a `ConnectOptions` (this
    // function's contract).
    let options = unsafe { options.as_ref() }.ok_or("no connect options")?;
    // SAFETY: each string is NULL or NUL-terminated (this function's contract).
    let (addr, host, ca, cert, key) = unsafe {
        (
            text(options.addr),
            text(options.host),
            text(options.ca),
            text(options.cert),
            text(options.key),
        )
    };
    let addr = addr.ok_or("no address")?;
    let tls = TlsOptions {
        host,
        ca,
        cert,
        key,
    };
    let keepalive = keepalive(
        options.keepalive_ms,
        options.keepalive_timeout_ms,
        options.handshake_timeout_ms,
    );
    Ok((addr, tls, keepalive))
}

/// Opens a connection (lazily: the first call connects). Returns its id.
///
/// # Safety
/// `options` points to a `ConnectOptions` whose strings are NULL or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_connect(options: *const ConnectOptions) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: what this function's contract promises.
        let (addr, tls, keepalive) = unsafe { connect_options(options) }?;
        let id = p
            .client
            .connect(&addr, &tls, &keepalive)
            .map_err(|e| e.to_string())?;
        Ok(id.0 as i32)
    })
}

/// Like [`grpc_wasm_connect`], for a connection whose socket the caller
/// owns (a cosocket): HTTP/2 and TLS run in the calling thread, fed with
/// [`grpc_wasm_wire_input`] and drained with [`grpc_wasm_wire_output`].
///
/// # Safety
/// As [`grpc_wasm_connect`].
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_wire_connect(options: *const ConnectOptions) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: what this function's contract promises.
        let (addr, tls, keepalive) = unsafe { connect_options(options) }?;
        let id = p
            .client
            .connect_wire(&addr, &tls, &keepalive)
            .map_err(|e| e.to_string())?;
        Ok(id.0 as i32)
    })
}

/// Writes the woken ids to `out`; those that do not fit take the
/// notifier's path.
///
/// # Safety
/// `out` is NULL or has room for `max` ids.
unsafe fn hand_out(p: &Process, woken: Vec<CallId>, out: *mut u32, max: i32) -> i32 {
    let room = if out.is_null() {
        0
    } else {
        max.max(0) as usize
    };
    let (now, later) = woken.split_at(woken.len().min(room));
    if !now.is_empty() {
        // SAFETY: not NULL, so with room for `max` ids (this function's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(out, room) };
        for (slot, id) in out.iter_mut().zip(now) {
            *slot = id.0;
        }
    }
    for id in later {
        p.notifier.wake(id.0);
    }
    now.len() as i32
}

/// Bytes read from a wire connection's socket. The calls that got events
/// are written to `out` (room for `max`); returns how many.
///
/// # Safety
/// `data` addresses `len` bytes; `out` has room for `max` ids.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_wire_input(
    conn: u32,
    data: *const c_char,
    len: usize,
    out: *mut u32,
    max: i32,
) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: `data` addresses `len` bytes (this function's contract).
        let data = unsafe { bytes(data, len) };
        let woken = p
            .client
            .wire_input(ConnId(conn), data)
            .map_err(|e| e.to_string())?;
        // SAFETY: `out` has room for `max` ids (this function's contract).
        Ok(unsafe { hand_out(&p, woken, out, max) })
    })
}

/// A wire connection's state: 1 when it has bytes for its socket, 2 when
/// its HTTP/2 connection is over (drop the socket, reset, dial again),
/// else 0; -1 for an unknown connection.
#[no_mangle]
pub extern "C" fn grpc_wasm_wire_pending(conn: u32) -> i32 {
    guard(|| {
        let p = process()?;
        match p
            .client
            .wire_state(ConnId(conn))
            .map_err(|e| e.to_string())?
        {
            (_, true) => Ok(2),
            (true, false) => Ok(1),
            (false, false) => Ok(0),
        }
    })
}

thread_local! {
    static OUTPUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static METRICS: RefCell<String> = const { RefCell::new(String::new()) };
    static DESCRIBED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Starts loading the services of connection `conn`'s server through
/// server reflection: `services` (may be NULL: every service it lists)
/// names them, one per line; `timeout_ms` is the caller's deadline (the
/// module's default when not positive). Returns a call id (> 0) whose end
/// (`grpc_wasm_next_event`) is the load's; then `grpc_wasm_reflected`.
///
/// # Safety
/// `services` addresses `services_len` bytes, or is NULL.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_reflect(
    conn: u32,
    services: *const c_char,
    services_len: usize,
    timeout_ms: i64,
) -> i32 {
    guard(|| {
        let p = process()?;
        let wanted = (!services.is_null()).then(|| {
            // SAFETY: not NULL, so it addresses its length (this function's contract).
            let raw = unsafe { bytes(services, services_len) };
            String::from_utf8_lossy(raw)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        });
        let id = p
            .client
            .reflect(ConnId(conn), wanted.as_deref(), reflect_timeout(timeout_ms))
            .map_err(|e| e.to_string())?;
        Ok(id.0 as i32)
    })
}

/// A caller's deadline for a reflection load, the default when not positive.
pub(crate) fn reflect_timeout(timeout_ms: i64) -> std::time::Duration {
    let ms = u64::try_from(timeout_ms)
        .ok()
        .filter(|ms| *ms > 0)
        .unwrap_or(grpc_wasm::limits::DEFAULT_TIMEOUT_MS);
    std::time::Duration::from_millis(ms)
}

/// Adds what the reflection load of call `id` found (after its successful
/// end) to what is loaded; the services it loaded, as a JSON array (NULL
/// on failure, see [`grpc_wasm_last_error`]). Valid until the next call of
/// this function or `grpc_wasm_describe` on this thread.
///
/// # Safety
/// `len` points to a writable size.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_reflected(id: u32, len: *mut usize) -> *const c_char {
    // SAFETY: `len` points to a writable size (this function's contract).
    unsafe {
        described(len, || {
            let services = process()?
                .client
                .reflected(CallId(id))
                .map_err(|e| e.to_string())?;
            Ok(serde_json::to_vec(&services).unwrap_or_default())
        })
    }
}

/// What is loaded, as JSON: the services (with their methods) when `name`
/// is empty, else the service, method, message or enum called `name`
/// (NULL when none is, see [`grpc_wasm_last_error`]). Valid until the
/// next call of this function or `grpc_wasm_reflected` on this thread.
///
/// # Safety
/// `name` addresses `name_len` bytes (or is NULL with 0); `len` points to
/// a writable size.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_describe(
    name: *const c_char,
    name_len: usize,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: `name` addresses its length (this function's contract).
    let name = unsafe { bytes(name, name_len) };
    // SAFETY: `len` points to a writable size (this function's contract).
    unsafe {
        described(len, || {
            let name = std::str::from_utf8(name).map_err(|_| "the name is not UTF-8")?;
            process()?.client.describe(name).map_err(|e| e.to_string())
        })
    }
}

/// An OpenAPI 3.1 document of what is loaded (NULL on failure, see
/// [`grpc_wasm_last_error`]): `options` is JSON, `{"title", "stream_format"
/// ("ndjson", "sse" or "array"), "services" (a list)}`, each optional.
/// Valid until the next call of this function, `grpc_wasm_describe` or
/// `grpc_wasm_reflected` on this thread.
///
/// # Safety
/// `options` addresses `options_len` bytes (or is NULL with 0); `len`
/// points to a writable size.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_openapi(
    options: *const c_char,
    options_len: usize,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: `options` addresses its length (this function's contract).
    let options = unsafe { bytes(options, options_len) };
    // SAFETY: `len` points to a writable size (this function's contract).
    unsafe { described(len, || openapi(&process()?.client, options)) }
}

/// The document for the options a caller gave as JSON (both ways in).
pub(crate) fn openapi(client: &Client, options: &[u8]) -> Result<Vec<u8>, String> {
    use serde_json::Value;
    let options: Value = match options {
        b"" | b"null" => Value::Object(serde_json::Map::new()),
        text => serde_json::from_slice(text).map_err(|e| format!("openapi options: {e}"))?,
    };
    let Value::Object(options) = options else {
        return Err("openapi options must be an object".into());
    };
    if let Some(unknown) = options
        .keys()
        .find(|k| !["title", "stream_format", "services"].contains(&k.as_str()))
    {
        return Err(format!(
            "openapi options: unknown option '{unknown}'; the options are title, stream_format, services"
        ));
    }
    let title = match options.get("title") {
        None => "grpc-wasm",
        Some(Value::String(title)) => title,
        Some(_) => return Err("openapi options: title must be a string".into()),
    };
    let stream_format = match options.get("stream_format") {
        None => grpc_wasm::http_rule::StreamFormat::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            "openapi options: stream_format must be \"ndjson\", \"sse\" or \"array\"".to_string()
        })?,
    };
    let services: Option<Vec<String>> = match options.get("services") {
        None => None,
        Some(v) => Some(serde_json::from_value(v.clone()).map_err(|_| {
            "openapi options: services must be a list of service names".to_string()
        })?),
    };
    client
        .openapi(title, stream_format, services.as_deref())
        .map_err(|e| e.to_string())
}

/// `f`'s bytes, kept in this thread's `DESCRIBED` for the caller to read;
/// NULL (and the last error) when it fails.
///
/// # Safety
/// `len` is NULL or points to a writable size.
unsafe fn described(len: *mut usize, f: impl FnOnce() -> Result<Vec<u8>, String>) -> *const c_char {
    let mut ptr = std::ptr::null();
    let mut size = 0;
    guard(|| {
        let bytes = f()?;
        DESCRIBED.with(|d| {
            let mut d = d.borrow_mut();
            *d = bytes;
            ptr = d.as_ptr();
            size = d.len();
        });
        Ok(0)
    });
    if !len.is_null() {
        // SAFETY: not NULL, so it points to a usize (this function's contract).
        unsafe { *len = size };
    }
    ptr.cast()
}

/// This worker's metrics as text, one a line (NULL on failure, see
/// [`grpc_wasm_last_error`]); valid until the next call of this function
/// on this thread.
///
/// # Safety
/// `len` points to a writable size.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_metrics(len: *mut usize) -> *const c_char {
    let mut ptr = std::ptr::null();
    let mut size = 0;
    guard(|| {
        let p = process()?;
        METRICS.with(|m| {
            let mut m = m.borrow_mut();
            *m = p.client.metrics();
            ptr = m.as_ptr();
            size = m.len();
        });
        Ok(0)
    });
    if !len.is_null() {
        // SAFETY: not NULL, so it points to a usize (this function's contract).
        unsafe { *len = size };
    }
    ptr.cast()
}

/// The bytes a wire connection has for its socket (NULL when none); valid
/// until the next call of this function on this thread.
///
/// # Safety
/// `len` points to a writable size.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_wire_output(conn: u32, len: *mut usize) -> *const c_char {
    let mut ptr = std::ptr::null();
    let rc = guard(|| {
        let p = process()?;
        OUTPUT.with(|o| {
            let mut o = o.borrow_mut();
            p.client
                .wire_output(ConnId(conn), &mut o)
                .map_err(|e| e.to_string())?;
            if !o.is_empty() {
                ptr = o.as_ptr();
            }
            if !len.is_null() {
                // SAFETY: not NULL, so it points to a usize (this function's contract).
                unsafe { *len = o.len() };
            }
            Ok::<(), String>(())
        })?;
        Ok(0)
    });
    if rc != 0 && !len.is_null() {
        // SAFETY: as above.
        unsafe { *len = 0 };
    }
    ptr.cast()
}

/// A wire connection's socket is gone: its calls fail with UNAVAILABLE and
/// `reason`; the next socket starts a fresh HTTP/2 connection. Woken calls
/// as for [`grpc_wasm_wire_input`].
///
/// # Safety
/// `reason` is NUL-terminated; `out` has room for `max` ids.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_wire_reset(
    conn: u32,
    reason: *const c_char,
    out: *mut u32,
    max: i32,
) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: NULL or NUL-terminated (this function's contract).
        let reason = unsafe { text(reason) }.unwrap_or_else(|| "the connection failed".into());
        let woken = p
            .client
            .wire_reset(ConnId(conn), &reason)
            .map_err(|e| e.to_string())?;
        // SAFETY: `out` has room for `max` ids (this function's contract).
        Ok(unsafe { hand_out(&p, woken, out, max) })
    })
}

/// The keepalive clock of a wire connection, for its socket's owner to
/// call when its socket is up and then whenever `next_ms` has passed (or
/// anything happened): it sends PINGs and ends a connection whose server
/// does not answer (then [`grpc_wasm_wire_pending`] says 2). `next_ms` gets
/// the ms until the next tick is due, or -1 when none is before a call
/// starts. Woken calls as for [`grpc_wasm_wire_input`].
///
/// # Safety
/// `out` has room for `max` ids; `next_ms` points to a writable i64.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_wire_tick(
    conn: u32,
    out: *mut u32,
    max: i32,
    next_ms: *mut i64,
) -> i32 {
    guard(|| {
        let p = process()?;
        let (woken, next) = p
            .client
            .wire_tick(ConnId(conn))
            .map_err(|e| e.to_string())?;
        if !next_ms.is_null() {
            let next = next.map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX));
            // SAFETY: the caller gave a writable i64 (checked non-NULL).
            unsafe { next_ms.write(next) };
        }
        // SAFETY: `out` has room for `max` ids (this function's contract).
        Ok(unsafe { hand_out(&p, woken, out, max) })
    })
}

#[no_mangle]
pub extern "C" fn grpc_wasm_conn_close(conn: u32) {
    let _ = guard(|| {
        process()?.client.close_conn(ConnId(conn));
        Ok(0)
    });
}

/// Whether a request header named in `grpc.init{propagate}` may carry on
/// as metadata (the core's rule: not the transport's, gRPC's or the
/// proxy's own): 0, or -1 with the reason as the last error. Needs no
/// [`grpc_wasm_init`], so that the name is refused where it is given,
/// even in nginx's master process.
///
/// # Safety
/// `name` addresses `len` bytes (or is NULL with length 0).
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_check_propagate(name: *const c_char, len: usize) -> i32 {
    guard(|| {
        // SAFETY: `name` addresses `len` bytes (this function's contract).
        let name = unsafe { bytes(name, len) };
        let name = std::str::from_utf8(name).map_err(|_| "the header name is not UTF-8")?;
        grpc_wasm::metadata::check_propagated(name).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Starts a call. `body` NULL: a stream whose messages follow. `metadata`
/// is its keys and values in turn, each as its length in decimal, `:` and
/// its bytes (see [`split_pairs`]); `propagated` the same, for the served
/// request's headers named to carry on (see
/// [`grpc_wasm_check_propagate`]); `json_options` (may be NULL) a comma-separated
/// list (`emit_defaults,int64_as_number,...`); `compression` (may be NULL:
/// none) `gzip` or `identity`. Returns the call id (> 0).
///
/// # Safety
/// Each pointer addresses its length in bytes (or is NULL with length 0).
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_start(
    conn: u32,
    path: *const c_char,
    path_len: usize,
    body: *const c_char,
    body_len: usize,
    timeout_ms: i64,
    metadata: *const c_char,
    metadata_len: usize,
    propagated: *const c_char,
    propagated_len: usize,
    json_options: *const c_char,
    compression: *const c_char,
) -> i32 {
    guard(|| {
        let p = process()?;
        // SAFETY: each pointer addresses its length in bytes or is NULL,
        // and `json_options` and `compression` are NULL or NUL-terminated
        // (this function's contract).
        let (path, body, metadata, propagated, json_options, compression) = unsafe {
            (
                bytes(path, path_len),
                (!body.is_null()).then(|| bytes(body, body_len)),
                bytes(metadata, metadata_len),
                bytes(propagated, propagated_len),
                text(json_options),
                text(compression),
            )
        };
        let path = std::str::from_utf8(path).map_err(|_| "the method path is not UTF-8")?;
        let compression = compression.as_deref().map(compression_named).transpose()?;
        let options = CallOptions {
            timeout_ms: (timeout_ms > 0).then_some(timeout_ms as u64),
            metadata: split_pairs(metadata)?,
            propagated: split_pairs(propagated)?,
            json_options,
            compression: compression.unwrap_or_default(),
        };
        let id = p
            .client
            .start(ConnId(conn), path, body, &options)
            .map_err(|e| e.to_string())?;
        Ok(id.0 as i32)
    })
}

/// Metadata as `resty.ffi.grpc` passes it: keys and values in turn, each
/// as its length in decimal, `:` and its bytes. Lengths, not separators,
/// so that no byte of a value can start an entry of its own: the value is
/// what the metadata rule (`grpc_wasm::metadata::check_entry`) then sees.
pub(crate) fn split_pairs(mut raw: &[u8]) -> Result<Vec<(String, String)>, &'static str> {
    let mut pairs = Vec::new();
    while !raw.is_empty() {
        let key = length_prefixed(&mut raw)?;
        pairs.push((key, length_prefixed(&mut raw)?));
    }
    Ok(pairs)
}

/// One `<length>:<bytes>` part of [`split_pairs`]'s input, taken off `raw`.
fn length_prefixed(raw: &mut &[u8]) -> Result<String, &'static str> {
    const MALFORMED: &str = "metadata: malformed length-prefixed pairs";
    let colon = raw.iter().position(|b| *b == b':').ok_or(MALFORMED)?;
    let len: usize = std::str::from_utf8(&raw[..colon])
        .ok()
        .and_then(|digits| digits.parse().ok())
        .ok_or(MALFORMED)?;
    let rest = &raw[colon + 1..];
    let part = rest.get(..len).ok_or(MALFORMED)?;
    *raw = &rest[len..];
    Ok(String::from_utf8_lossy(part).into_owned())
}

/// # Safety
/// `json` addresses `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_send(
    id: u32,
    json: *const c_char,
    len: usize,
    compress: i32,
) -> i32 {
    guard(|| {
        // SAFETY: `json` addresses `len` bytes (this function's contract).
        let json = unsafe { bytes(json, len) };
        process()?
            .client
            .send(CallId(id), json, compress != 0)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// The bytes a stream's caller waits for before its next send (see
/// `Client::send_backlog`): 0, go on; -1, the call is over or unknown.
/// Never fails.
#[no_mangle]
pub extern "C" fn grpc_wasm_send_backlog(id: u32) -> i64 {
    let backlog = catch_unwind(|| process().ok()?.client.send_backlog(CallId(id)));
    match backlog {
        Ok(Some(n)) => i64::try_from(n).unwrap_or(i64::MAX),
        Ok(None) => -1,
        Err(panic) => {
            contained(&crate::client::panic_message(panic.as_ref()));
            -1
        }
    }
}

#[no_mangle]
pub extern "C" fn grpc_wasm_close_send(id: u32) -> i32 {
    guard(|| {
        process()?
            .client
            .close_send(CallId(id))
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// An event handed to Lua; the pointers stay valid until the next
/// `grpc_wasm_next_event` or `grpc_wasm_close` for the same call.
#[repr(C)]
pub struct EventView {
    /// 1: a streamed message; 2: the end (reply).
    pub kind: i32,
    pub http_status: i32,
    pub body: *const c_char,
    pub body_len: usize,
    /// The reply's headers as `key\0value\0` pairs.
    pub headers: *const c_char,
    pub headers_len: usize,
    /// The reply's gRPC status code (`LocalReply::grpc_code`) for an end;
    /// -1 for a message.
    pub code: i32,
    /// 1 when taking this event let the call's stream be read again: its
    /// connection's socket may have bytes to send (flow-control credit).
    pub resumed: i32,
}

/// The call's next event: 1 and `out` filled, or 0 when none has arrived.
///
/// # Safety
/// `out` points to an `EventView`.
#[no_mangle]
pub unsafe extern "C" fn grpc_wasm_next_event(id: u32, out: *mut EventView) -> i32 {
    guard(|| {
        let p = process()?;
        if out.is_null() {
            return Err("no event buffer".into());
        }
        let (event, resumed) = p.client.take_event(CallId(id));
        let Some(event) = event else {
            return Ok(0);
        };
        let resumed = i32::from(resumed.is_some());
        let mut current = lock(&p.current);
        current.insert(id, event);
        let view = match current.get(&id) {
            Some(Event::Message(json)) => EventView {
                kind: 1,
                http_status: 200,
                body: json.as_ptr().cast(),
                body_len: json.len(),
                headers: std::ptr::null(),
                headers_len: 0,
                code: -1,
                resumed,
            },
            Some(Event::End(reply)) => {
                let flat = reply.headers.flat();
                EventView {
                    kind: 2,
                    http_status: reply.http_status as i32,
                    body: reply.body.as_ptr().cast(),
                    body_len: reply.body.len(),
                    headers: flat.as_ptr().cast(),
                    headers_len: flat.len(),
                    code: reply.grpc_code().as_i32(),
                    resumed,
                }
            }
            None => return Ok(0),
        };
        // SAFETY: `out` points to an `EventView` (this function's contract).
        unsafe { out.write(view) };
        Ok(1)
    })
}

/// Ends (or forgets) a call; a running call is cancelled.
#[no_mangle]
pub extern "C" fn grpc_wasm_close(id: u32) {
    let _ = guard(|| {
        let p = process()?;
        lock(&p.current).remove(&id);
        p.client.close(CallId(id));
        Ok(0)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn metadata_values_keep_every_byte_whatever_they_hold() {
        let raw = b"1:a24:x\0authorization\0Bearer x5:x-bin0:";
        assert_eq!(
            split_pairs(raw),
            Ok(pairs(&[("a", "x\0authorization\0Bearer x"), ("x-bin", "")]))
        );
        assert_eq!(split_pairs(b""), Ok(Vec::new()));
    }

    #[test]
    fn malformed_metadata_is_refused_not_guessed() {
        let malformed = Err("metadata: malformed length-prefixed pairs");
        for raw in [
            &b"1:a"[..],
            b"1:a9:x",
            b"a:b1:c",
            b"1:a1",
            b"-1:a1:b",
            b"1:a1:b2",
        ] {
            assert_eq!(
                split_pairs(raw),
                malformed,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}
