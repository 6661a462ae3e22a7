//! The lua-resty-ffi runtime contract: `libffi_init(cfg, tq)` starts a
//! thread that takes tasks with `ngx_http_lua_ffi_task_poll`, reads each
//! with `ngx_http_lua_ffi_get_req` and answers it exactly once with
//! `ngx_http_lua_ffi_respond` (rc 0 = ok; the response from `malloc`, which
//! lua-resty-ffi frees). A NULL poll means the queue is gone: the thread
//! answers the tasks it still holds and ends.
//!
//! OpenResty exports the three functions; they are looked up at init with
//! `dlsym`, so the same library also loads into stock nginx, which lacks them.
//!
//! A task is a JSON object with an `op`. `next` waits for a call's next
//! event; the task is answered when the event arrives (from the transport
//! thread), so a waiting Lua coroutine costs no thread. Every `next` ends
//! by its `timeout` (ms; the caller passes the call's deadline and some
//! slack, [`DEFAULT_WAIT`] when absent): a lost wake-up, or a call that
//! never ends, must not hold a Lua thread forever.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::call::{CallId, ConnId};
use crate::client::{Client, Event};
use crate::sync::lock;
use crate::transport::TlsOptions;

type Poll = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type GetReq = unsafe extern "C" fn(*mut c_void, *mut c_int) -> *mut c_char;
type Respond = unsafe extern "C" fn(*mut c_void, c_int, *mut c_char, c_int);

#[derive(Clone, Copy)]
struct Abi {
    poll: Poll,
    get_req: GetReq,
    respond: Respond,
}

/// A task pointer, answered exactly once (the type is not Clone).
struct Task(*mut c_void);
// SAFETY: lua-resty-ffi lets any thread answer a task.
unsafe impl Send for Task {}

impl Task {
    fn answer(self, abi: &Abi, rc: c_int, body: &[u8]) {
        let (ptr, len) = match malloc_copy(body) {
            Some(ptr) => (ptr, body.len() as c_int),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: the task came from poll and is answered once (self is moved).
        unsafe { (abi.respond)(self.0, rc, ptr, len) };
    }
}

/// A malloc'ed copy for lua-resty-ffi to free; NULL for an empty body
/// (a non-NULL pointer with length 0 would be read as a C string).
fn malloc_copy(body: &[u8]) -> Option<*mut c_char> {
    if body.is_empty() || body.len() > c_int::MAX as usize {
        return None;
    }
    // SAFETY: a fresh allocation of body.len() bytes, filled before use.
    unsafe {
        let ptr = libc::malloc(body.len()) as *mut u8;
        if ptr.is_null() {
            return None;
        }
        std::ptr::copy_nonoverlapping(body.as_ptr(), ptr, body.len());
        Some(ptr as *mut c_char)
    }
}

use crate::limits::DEFAULT_WAIT;
const WAIT_EXPIRED: &[u8] = b"timeout waiting for the call's next event";

/// A `next` task waiting for an event of its call, until `until`.
struct Parked {
    task: Task,
    until: Instant,
}

struct Runtime {
    abi: Abi,
    client: Client,
    parked: Mutex<HashMap<u32, Parked>>,
    /// Wakes the expiry thread when a task is parked or the runtime ends.
    expiry: Condvar,
    stopped: AtomicBool,
}

/// # Safety
/// `T` is a function pointer type matching the symbol's real signature.
unsafe fn symbol<T>(name: &CStr) -> Option<T> {
    // SAFETY: a lookup by a NUL-terminated name in the loaded objects.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: `T` is a function pointer of the symbol's type (this
    // function's contract), the same size as the pointer dlsym returned.
    (!ptr.is_null()).then(|| unsafe { std::mem::transmute_copy(&ptr) })
}

/// # Safety
/// Called by lua-resty-ffi: `cfg` is NULL or a NUL-terminated string that
/// is freed after this returns; `tq` is the task queue.
#[no_mangle]
pub unsafe extern "C" fn libffi_init(cfg: *mut c_char, tq: *mut c_void) -> c_int {
    let cfg = (!cfg.is_null()).then(|| {
        // SAFETY: not NULL, so NUL-terminated (this function's contract).
        unsafe { CStr::from_ptr(cfg) }
            .to_string_lossy()
            .into_owned()
    });
    let tq = Task(tq);
    // SAFETY: `tq` is lua-resty-ffi's task queue, as `start` requires.
    let started = catch_unwind(AssertUnwindSafe(|| unsafe { start(cfg.as_deref(), tq) }));
    match started {
        Ok(Ok(())) => 0,
        Ok(Err(message)) => {
            eprintln!("[grpc-wasm] libffi_init: {message}");
            // lua-resty-ffi hands Lua only the return code; resty.ffi.grpc
            // reads the text with grpc_wasm_last_error on this same thread.
            crate::ffi::set_error(message);
            1
        }
        Err(_) => {
            crate::ffi::set_error("libffi_init: internal error (panic)");
            2
        }
    }
}

/// # Safety
/// `tq` is lua-resty-ffi's task queue for this runtime.
unsafe fn start(cfg: Option<&str>, tq: Task) -> Result<(), String> {
    // SAFETY: each field's type is the C signature lua-resty-ffi exports
    // under that name.
    let (poll, get_req, respond) = unsafe {
        (
            symbol(c"ngx_http_lua_ffi_task_poll"),
            symbol(c"ngx_http_lua_ffi_get_req"),
            symbol(c"ngx_http_lua_ffi_respond"),
        )
    };
    let abi = Abi {
        poll: poll
            .ok_or("ngx_http_lua_ffi_task_poll not found (not OpenResty with lua-resty-ffi?)")?,
        get_req: get_req.ok_or("ngx_http_lua_ffi_get_req not found")?,
        respond: respond.ok_or("ngx_http_lua_ffi_respond not found")?,
    };
    let cfg: Value = match cfg {
        Some(text) if !text.trim().is_empty() => {
            serde_json::from_str(text).map_err(|e| format!("cfg is not JSON: {e}"))?
        }
        _ => Value::Null,
    };
    // resty.ffi.grpc says its version; a shim of another release refuses
    // it rather than misread its tasks.
    if let Some(lua) = cfg["version"].as_str() {
        let shim = env!("CARGO_PKG_VERSION");
        if lua != shim {
            return Err(format!(
                "resty.ffi.grpc is {lua}, and liblua_shim.so is {shim}: install both from the same release"
            ));
        }
    }
    let module = cfg["module"]
        .as_str()
        .map(str::to_string)
        .or_else(|| std::env::var("GRPC_WASM_MODULE").ok())
        .ok_or("no module path (cfg.module or GRPC_WASM_MODULE)")?;
    let wasm =
        std::fs::read(&module).map_err(|e| format!("cannot read the module {module}: {e}"))?;
    let cache = crate::host::cache::resolve(cfg["cache_dir"].as_str());
    let runtime: Arc<Mutex<Option<Arc<Runtime>>>> = Arc::new(Mutex::new(None));
    let wake = {
        let runtime = runtime.clone();
        Arc::new(move |id: CallId| {
            if let Some(rt) = lock(&runtime).clone() {
                rt.wake(id.0);
            }
        })
    };
    let client = Client::new(&wasm, cache.as_deref(), wake).map_err(|e| e.to_string())?;
    if let Some(cap) = cfg["max_queued_bytes"].as_u64().filter(|c| *c > 0) {
        client.set_max_queued_bytes(usize::try_from(cap).unwrap_or(usize::MAX));
    }
    let rt = Arc::new(Runtime {
        abi,
        client,
        parked: Mutex::new(HashMap::new()),
        expiry: Condvar::new(),
        stopped: AtomicBool::new(false),
    });
    *lock(&runtime) = Some(rt.clone());
    let weak = Arc::downgrade(&rt);
    std::thread::Builder::new()
        .name("grpc-wasm-expiry".into())
        .spawn(move || expire(weak))
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("grpc-wasm-ffi".into())
        .spawn(move || {
            serve(&rt, tq);
            // Nothing may keep the runtime alive through the wake closure.
            lock(&runtime).take();
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn serve(rt: &Arc<Runtime>, tq: Task) {
    loop {
        // SAFETY: tq is the queue given to libffi_init, valid until poll returns NULL.
        let task = unsafe { (rt.abi.poll)(tq.0) };
        if task.is_null() {
            break;
        }
        let mut len: c_int = 0;
        // SAFETY: the task is live until answered; the request is copied at once.
        let request = unsafe {
            let ptr = (rt.abi.get_req)(task, &mut len);
            if ptr.is_null() || len <= 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(ptr as *const u8, len as usize).to_vec()
            }
        };
        let task = Task(task);
        let outcome = catch_unwind(AssertUnwindSafe(|| rt.handle(&request)));
        match outcome {
            Ok(Reply::Now(Ok(body))) => task.answer(&rt.abi, 0, &body),
            Ok(Reply::Now(Err(message))) => task.answer(&rt.abi, 1, message.as_bytes()),
            Ok(Reply::Wait(id, wait)) => rt.park(id, task, wait),
            Err(panic) => {
                rt.client
                    .after_panic(&crate::client::panic_message(panic.as_ref()));
                task.answer(&rt.abi, 2, b"internal error (panic) in grpc-wasm; the task was answered and the runtime goes on")
            }
        }
    }
    // The queue is gone; tasks still waiting get their answer anyway.
    let parked: Vec<Task> = lock(&rt.parked).drain().map(|(_, p)| p.task).collect();
    rt.stopped.store(true, Ordering::Release);
    rt.expiry.notify_all();
    for task in parked {
        task.answer(&rt.abi, 1, b"the grpc-wasm runtime was unloaded");
    }
}

/// Answers the `next` tasks whose wait has run out, until the runtime ends.
fn expire(rt: Weak<Runtime>) {
    loop {
        let Some(rt) = rt.upgrade() else { return };
        let mut parked = lock(&rt.parked);
        if rt.stopped.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let due: Vec<u32> = parked
            .iter()
            .filter(|(_, p)| p.until <= now)
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            let next = parked.values().map(|p| p.until).min();
            // A second at most, so that a dropped runtime is noticed.
            let wait = next
                .map_or(Duration::from_secs(1), |t| t.saturating_duration_since(now))
                .min(Duration::from_secs(1));
            drop(rt.expiry.wait_timeout(parked, wait));
            continue;
        }
        let tasks: Vec<Task> = due
            .iter()
            .filter_map(|id| parked.remove(id))
            .map(|p| p.task)
            .collect();
        drop(parked);
        for task in tasks {
            task.answer(&rt.abi, 1, WAIT_EXPIRED);
        }
    }
}

enum Reply {
    Now(Result<Vec<u8>, String>),
    /// Answered when call `id` has an event, or when the wait runs out.
    Wait(u32, Duration),
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request[name]
        .as_str()
        .ok_or_else(|| format!("missing string field '{name}'"))
}

fn number(request: &Value, name: &str) -> Result<u32, String> {
    request[name]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("missing number field '{name}'"))
}

/// The served request's headers a call carries on: length-prefixed pairs
/// in base64 (the FFI path's form; a header value need not be UTF-8,
/// which the task's JSON must be), none when absent.
fn propagated_pairs(request: &Value) -> Result<Vec<(String, String)>, String> {
    use base64::Engine;
    let Some(text) = request["propagated"].as_str() else {
        return Ok(Vec::new());
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("propagated: not base64: {e}"))?;
    crate::ffi::split_pairs(&bytes).map_err(str::to_string)
}

fn optional(request: &Value, name: &str) -> Option<String> {
    request[name].as_str().map(str::to_string)
}

impl Runtime {
    fn handle(&self, raw: &[u8]) -> Reply {
        let request: Value = match serde_json::from_slice(raw) {
            Ok(v) => v,
            Err(e) => return Reply::Now(Err(format!("the task is not JSON: {e}"))),
        };
        let op = request["op"].as_str().unwrap_or_default();
        if op == "next" {
            let wait = match &request["timeout"] {
                Value::Null => Ok(DEFAULT_WAIT),
                v => v
                    .as_u64()
                    .map(Duration::from_millis)
                    .ok_or_else(|| "'timeout' must be a number of milliseconds".to_string()),
            };
            return match (number(&request, "id"), wait) {
                (Ok(id), Ok(wait)) => Reply::Wait(id, wait),
                (Err(e), _) | (_, Err(e)) => Reply::Now(Err(e)),
            };
        }
        Reply::Now(self.run(op, &request))
    }

    fn run(&self, op: &str, r: &Value) -> Result<Vec<u8>, String> {
        let c = &self.client;
        let done = |result: Result<(), crate::ClientError>| {
            result.map(|()| Vec::new()).map_err(|e| e.to_string())
        };
        match op {
            "loadfile" => {
                let include: Vec<PathBuf> = r["include"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .map(PathBuf::from)
                    .collect();
                done(c.load_file(Path::new(field(r, "path")?), &include))
            }
            "descriptor_set" => {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(field(r, "base64")?)
                    .map_err(|e| e.to_string())?;
                done(c.load_descriptor_set(&bytes))
            }
            "metrics" => Ok(c.metrics().into_bytes()),
            "json_options" => {
                done(c.set_print_options(r["options"].as_object().cloned().unwrap_or_default()))
            }
            "connect" => {
                let tls = TlsOptions {
                    host: optional(r, "host"),
                    ca: optional(r, "ca"),
                    cert: optional(r, "cert"),
                    key: optional(r, "priv_key"),
                };
                let ms = |key: &str| r[key].as_u64().unwrap_or(0);
                let keepalive = crate::transport::Keepalive::from_ms(
                    ms("keepalive_interval"),
                    ms("keepalive_timeout"),
                    ms("handshake_timeout"),
                );
                c.connect(field(r, "addr")?, &tls, &keepalive)
                    .map(|id| id.to_string().into_bytes())
                    .map_err(|e| e.to_string())
            }
            "conn_close" => {
                c.close_conn(ConnId(number(r, "conn")?));
                Ok(Vec::new())
            }
            "start" => {
                let pairs = |name: &str| -> Vec<(String, String)> {
                    r[name]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                };
                let body = optional(r, "body");
                let compression = r["compression"].as_str().map(crate::compression_named);
                let options = crate::CallOptions {
                    timeout_ms: r["timeout"].as_u64(),
                    metadata: pairs("metadata"),
                    propagated: propagated_pairs(r)?,
                    json_options: optional(r, "json"),
                    compression: compression.transpose()?.unwrap_or_default(),
                };
                let id = c.start(
                    ConnId(number(r, "conn")?),
                    field(r, "path")?,
                    body.as_deref().map(str::as_bytes),
                    &options,
                );
                id.map(|id| id.to_string().into_bytes())
                    .map_err(|e| e.to_string())
            }
            "reflect" => {
                let services: Option<Vec<String>> = r["services"].as_array().map(|list| {
                    list.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                });
                let timeout = crate::ffi::reflect_timeout(r["timeout"].as_i64().unwrap_or(0));
                c.reflect(ConnId(number(r, "conn")?), services.as_deref(), timeout)
                    .map(|id| id.to_string().into_bytes())
                    .map_err(|e| e.to_string())
            }
            "reflected" => c
                .reflected(CallId(number(r, "id")?))
                .map(|services| serde_json::to_vec(&services).unwrap_or_default())
                .map_err(|e| e.to_string()),
            "openapi" => crate::ffi::openapi(c, r["options"].to_string().as_bytes()),
            "describe" => c
                .describe(r["name"].as_str().unwrap_or_default())
                .map_err(|e| e.to_string()),
            "send" => {
                let compress = r["compress"].as_bool().unwrap_or(true);
                done(c.send(
                    CallId(number(r, "id")?),
                    field(r, "body")?.as_bytes(),
                    compress,
                ))
            }
            "close_send" => done(c.close_send(CallId(number(r, "id")?))),
            "send_backlog" => {
                let backlog = c.send_backlog(CallId(number(r, "id")?));
                Ok(backlog.map_or("-1".into(), |n| n.to_string()).into_bytes())
            }
            "close" => {
                let id = number(r, "id")?;
                c.close(CallId(id));
                if let Some(parked) = lock(&self.parked).remove(&id) {
                    parked.task.answer(&self.abi, 1, b"the call was closed");
                }
                Ok(Vec::new())
            }
            "panic" if std::env::var_os("GRPC_WASM_TEST_HOOKS").is_some() => {
                panic!("a panic requested by a test")
            }
            other => Err(format!("unknown op '{other}'")),
        }
    }

    /// Parks a `next` task for `wait` at most, or answers it at once when
    /// an event is waiting or the call is unknown (nothing would wake it).
    fn park(&self, id: u32, task: Task, wait: Duration) {
        let mut parked = lock(&self.parked);
        if let Some(event) = self.client.next_event(CallId(id)) {
            drop(parked);
            return task.answer(&self.abi, 0, &encode(&event));
        }
        if !self.client.has_call(CallId(id)) {
            drop(parked);
            return task.answer(
                &self.abi,
                1,
                crate::ClientError::UnknownCall.to_string().as_bytes(),
            );
        }
        let until = Instant::now() + wait;
        if let Some(old) = parked.insert(id, Parked { task, until }) {
            old.task
                .answer(&self.abi, 1, b"another next() replaced this one");
        }
        self.expiry.notify_all();
    }

    /// A call has an event: the parked task of that call gets it.
    fn wake(&self, id: u32) {
        let mut parked = lock(&self.parked);
        let Some(waiting) = parked.remove(&id) else {
            return;
        };
        match self.client.next_event(CallId(id)) {
            Some(event) => {
                drop(parked);
                waiting.task.answer(&self.abi, 0, &encode(&event));
            }
            None => {
                parked.insert(id, waiting);
            }
        }
    }
}

/// An event for Lua: `M\n<json>` for a message; `E <http status> <gRPC
/// code> <headers length>\n<key\0value\0...><body>` for the end.
fn encode(event: &Event) -> Vec<u8> {
    match event {
        Event::Message(json) => [b"M\n".as_slice(), json].concat(),
        Event::End(reply) => {
            let headers = reply.headers.flat();
            let head = format!(
                "E {} {} {}\n",
                reply.http_status,
                reply.grpc_code().as_i32(),
                headers.len()
            );
            [head.as_bytes(), headers, &reply.body].concat()
        }
    }
}
