//! A proxy-wasm host for the grpc-wasm module, on wasmtime: the shim drives
//! the very filter that runs in Envoy, in callout mode. A Lua call becomes
//! an HTTP context (request headers and a JSON body); the module answers it
//! with `proxy_grpc_call` / `proxy_grpc_stream`, which the transport carries
//! out, and ends it with a local reply.

pub mod cache;
mod imports;
pub mod metrics;
pub mod state;

use std::path::Path;

use grpc_wasm::contract::Action;
use wasmtime::{Config, Engine, Linker, Module, Store, TypedFunc};

pub use imports::DELIVER_FUNCTION;
pub use state::{GrpcCommand, LocalReply, Outputs};
use state::{HostState, HttpContext, TokenKind};

use crate::call::{CallId, GrpcEvent, HeaderBlock, Token};

use crate::limits::{CONTEXT_ID_PROBES, MAX_CONTEXT_ID};
use crate::wasm::instance::{export, instantiate, load, trap};
use crate::wasm::wasi;
pub use crate::wasm::HostError;

/// The one root context (one plugin configuration per host).
pub const ROOT_ID: u32 = 1;

struct Exports {
    context_create: TypedFunc<(u32, u32), ()>,
    configure: TypedFunc<(u32, u32), u32>,
    request_headers: TypedFunc<(u32, u32, u32), u32>,
    request_body: TypedFunc<(u32, u32, u32), u32>,
    /// Optional, as every proxy-wasm callback is.
    done: Option<TypedFunc<u32, u32>>,
    delete: TypedFunc<u32, ()>,
    grpc_initial: TypedFunc<(u32, u32, u32), ()>,
    grpc_receive: TypedFunc<(u32, u32, u32), ()>,
    grpc_trailing: TypedFunc<(u32, u32, u32), ()>,
    grpc_close: TypedFunc<(u32, u32, u32), ()>,
    tick: TypedFunc<u32, ()>,
    proto_imports: TypedFunc<(u32, u32, u32, u32), u32>,
    descriptor_set: TypedFunc<u32, u32>,
    scratch: TypedFunc<u32, u32>,
    result: TypedFunc<(), u64>,
}

/// One instance of the module with its root context.
pub struct ProxyHost {
    store: Store<HostState>,
    exports: Exports,
    next_context: u32,
    /// Kept to make a fresh instance after a trap.
    module: Module,
    memory_limit: Option<usize>,
}

impl ProxyHost {
    /// Compiles (or loads from `cache_dir`, see [`cache`]) and instantiates the module.
    pub fn new(wasm: &[u8], cache_dir: Option<&Path>) -> Result<Self, HostError> {
        let engine = Engine::new(&Config::new()).map_err(load)?;
        let module = cache::load_or_compile(&engine, wasm, cache_dir)?;
        Self::instantiate(module, None)
    }

    /// Replaces this instance with a fresh one of the same module, as
    /// after a trap, when the old one's state cannot be trusted. The new
    /// one is not configured yet.
    pub fn restart(&mut self) -> Result<(), HostError> {
        let fresh = Self::instantiate(self.module.clone(), self.memory_limit)?;
        let (last_id, last_token) = (self.next_context, self.store.data().next_token);
        let metrics = std::mem::take(&mut self.store.data_mut().metrics);
        *self = fresh;
        // The metrics count on: the fresh module defines the same names
        // again, and gets the same ids.
        self.store.data_mut().metrics = metrics;
        // Ids and tokens keep counting: a late transport event of an old
        // call must not reach a new call that took its token.
        self.next_context = last_id;
        self.store.data_mut().next_token = last_token;
        Ok(())
    }

    /// Caps the module's memory (`None`: no cap); growth past it fails in
    /// the module, which traps on allocation failure. For tests.
    #[doc(hidden)]
    pub fn limit_memory(&mut self, bytes: Option<usize>) {
        self.memory_limit = bytes;
        self.store.data_mut().limits = limits(bytes);
    }

    /// Whether the messages the module sends from now on go uncompressed
    /// (their caller's choice, for the message being fed).
    pub fn send_uncompressed(&mut self, on: bool) {
        self.store.data_mut().uncompressed_sends = on;
    }

    /// The module's metrics as text (see [`metrics::Metrics::text`]).
    pub fn metrics_text(&self) -> String {
        self.store.data().metrics.text()
    }

    /// The module's memory size in bytes.
    pub fn memory_size(&self) -> usize {
        self.store
            .data()
            .memory
            .map_or(0, |memory| memory.data_size(&self.store))
    }

    fn instantiate(module: Module, memory_limit: Option<usize>) -> Result<Self, HostError> {
        let engine = module.engine().clone();
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).map_err(load)?;
        imports::add_to_linker(&mut linker).map_err(load)?;
        let state = HostState {
            limits: limits(memory_limit),
            ..HostState::default()
        };
        let (mut store, instance, memory) = instantiate(&engine, &module, linker, state)?;
        store.limiter(|state| &mut state.limits);
        let allocate = export(&instance, &mut store, "proxy_on_memory_allocate")?;
        store.data_mut().memory = Some(memory);
        store.data_mut().allocate = Some(allocate);
        let exports = Exports {
            context_create: export(&instance, &mut store, "proxy_on_context_create")?,
            configure: export(&instance, &mut store, "proxy_on_configure")?,
            request_headers: export(&instance, &mut store, "proxy_on_request_headers")?,
            request_body: export(&instance, &mut store, "proxy_on_request_body")?,
            done: export(&instance, &mut store, "proxy_on_done").ok(),
            delete: export(&instance, &mut store, "proxy_on_delete")?,
            grpc_initial: export(
                &instance,
                &mut store,
                "proxy_on_grpc_receive_initial_metadata",
            )?,
            grpc_receive: export(&instance, &mut store, "proxy_on_grpc_receive")?,
            grpc_trailing: export(
                &instance,
                &mut store,
                "proxy_on_grpc_receive_trailing_metadata",
            )?,
            grpc_close: export(&instance, &mut store, "proxy_on_grpc_close")?,
            tick: export(&instance, &mut store, "proxy_on_tick")?,
            proto_imports: export(&instance, &mut store, "grpc_wasm_proto_imports")?,
            descriptor_set: export(&instance, &mut store, "grpc_wasm_descriptor_set")?,
            scratch: export(&instance, &mut store, "grpc_wasm_buffer")?,
            result: export(&instance, &mut store, "grpc_wasm_result")?,
        };
        check_version(module_version(&instance, &mut store, memory)?.as_deref())?;
        let start: TypedFunc<(u32, u32), u32> = export(&instance, &mut store, "proxy_on_vm_start")?;
        exports
            .context_create
            .call(&mut store, (ROOT_ID, 0))
            .map_err(trap)?;
        start.call(&mut store, (ROOT_ID, 0)).map_err(trap)?;
        Ok(ProxyHost {
            store,
            exports,
            next_context: ROOT_ID,
            module,
            memory_limit,
        })
    }

    /// (Re)configures the root context; the module's own reason on refusal.
    pub fn configure(&mut self, config: &[u8]) -> Result<(), HostError> {
        let state = self.store.data_mut();
        state.plugin_config = config.to_vec();
        state.effective = ROOT_ID;
        state.last_error.clear();
        let ok = checked!(
            self,
            self.exports
                .configure
                .call(&mut self.store, (ROOT_ID, config.len() as u32))
        )?;
        // The module reads its configuration only while configuring: a
        // copy kept would hold every .proto source (or a refused set) for
        // nothing.
        self.store.data_mut().plugin_config = Vec::new();
        if ok == 1 {
            Ok(())
        } else {
            let reason = std::mem::take(&mut self.store.data_mut().last_error);
            Err(HostError::Core(
                reason
                    .trim_start_matches("grpc-wasm: bad configuration: ")
                    .to_string(),
            ))
        }
    }

    /// The imports of a `.proto` source, by the module's own parser.
    pub fn proto_imports(&mut self, name: &str, source: &str) -> Result<Vec<String>, HostError> {
        let ptr = self.write_scratch(&[name.as_bytes(), source.as_bytes()])?;
        let args = (
            ptr,
            name.len() as u32,
            ptr + name.len() as u32,
            source.len() as u32,
        );
        let code = checked!(self, self.exports.proto_imports.call(&mut self.store, args))?;
        let text = String::from_utf8_lossy(&self.core_result(code)?).into_owned();
        Ok(text
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Every file the module is configured with, as an encoded
    /// `FileDescriptorSet`.
    pub fn descriptor_set(&mut self) -> Result<Vec<u8>, HostError> {
        let code = checked!(
            self,
            self.exports.descriptor_set.call(&mut self.store, ROOT_ID)
        )?;
        self.core_result(code)
    }

    /// `parts` one after the other in the module's scratch buffer; its address.
    fn write_scratch(&mut self, parts: &[&[u8]]) -> Result<u32, HostError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(total).map_err(|_| HostError::BadBuffer)?;
        let ptr = checked!(self, self.exports.scratch.call(&mut self.store, len))?;
        let memory = self
            .store
            .data()
            .memory
            .ok_or(HostError::MissingExport("memory"))?;
        let dst = memory
            .data_mut(&mut self.store)
            .get_mut(ptr as usize..ptr as usize + total)
            .ok_or_else(|| HostError::Trap("scratch buffer out of bounds".into()))?;
        let mut at = 0;
        for part in parts {
            dst[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(ptr)
    }

    /// The output of the core export that returned `code`: its result
    /// bytes, or its error text as [`HostError::Core`].
    fn core_result(&mut self, code: u32) -> Result<Vec<u8>, HostError> {
        let memory = self
            .store
            .data()
            .memory
            .ok_or(HostError::MissingExport("memory"))?;
        let packed = checked!(self, self.exports.result.call(&mut self.store, ()))?;
        let (at, len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        let bytes = memory
            .data(&self.store)
            .get(at..at.saturating_add(len))
            .ok_or(HostError::BadBuffer)?
            .to_vec();
        if code != 0 {
            return Err(HostError::Core(
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
        Ok(bytes)
    }

    /// A token for a stream the client runs itself (a reflection load),
    /// from the module's own count, so that no call of the module's ever
    /// holds it too; [`ProxyHost::release_token`] gives it back.
    pub fn reserve_token(&mut self) -> Token {
        self.store.data_mut().token(TokenKind::Stream)
    }

    pub fn release_token(&mut self, token: Token) {
        self.store.data_mut().release(token);
    }

    /// An id for the next context: above the root's, at most `i32::MAX` (the
    /// C ABI returns ids as signed numbers, negative meaning failure), and
    /// never one the module still runs or the caller still holds (`busy`).
    /// After `i32::MAX` the ids start over.
    pub fn reserve_id(&mut self, busy: impl Fn(CallId) -> bool) -> Result<CallId, HostError> {
        for _ in 0..CONTEXT_ID_PROBES {
            self.next_context = match self.next_context {
                n if (ROOT_ID + 1..MAX_CONTEXT_ID).contains(&n) => n + 1,
                _ => ROOT_ID + 1,
            };
            let id = self.next_context;
            if !self.store.data().http.contains_key(&id) && !busy(CallId(id)) {
                return Ok(CallId(id));
            }
        }
        Err(HostError::Busy(CONTEXT_ID_PROBES))
    }

    /// Makes `last` the id [`ProxyHost::reserve_id`] counts on from (tests
    /// start it near the wrap).
    #[doc(hidden)]
    pub fn set_last_id(&mut self, last: u32) {
        self.next_context = last;
    }

    /// Opens HTTP context `id` (from [`ProxyHost::reserve_id`]) with these
    /// request headers; with a body, the request ends with it.
    pub fn open(
        &mut self,
        call: CallId,
        headers: HeaderBlock,
        body: Option<&[u8]>,
    ) -> Result<(), HostError> {
        let id = call.0;
        let count = headers.len() as u32;
        self.store.data_mut().http.insert(
            id,
            HttpContext {
                request_headers: headers,
                request_body: Vec::new(),
            },
        );
        checked!(
            self,
            self.exports
                .context_create
                .call(&mut self.store, (id, ROOT_ID))
        )?;
        self.store.data_mut().effective = id;
        let action = checked!(
            self,
            self.exports
                .request_headers
                .call(&mut self.store, (id, count, 0))
        )?;
        if Action::try_from(action) == Ok(Action::Continue)
            && self
                .store
                .data()
                .outputs
                .replies
                .iter()
                .all(|(c, _)| *c != call)
        {
            // The module let the request go on to the route's upstream; the
            // shim has none, as a proxy with no route for the path.
            self.store
                .data_mut()
                .outputs
                .replies
                .push((call, no_route()));
            return Ok(());
        }
        if let Some(body) = body {
            self.body(call, body, true)?;
        }
        Ok(())
    }

    /// More request body for a context (a streamed message), or its end.
    pub fn body(&mut self, call: CallId, bytes: &[u8], end: bool) -> Result<(), HostError> {
        let id = call.0;
        let state = self.store.data_mut();
        let Some(http) = state.http.get_mut(&id) else {
            return Ok(());
        };
        http.request_body.extend_from_slice(bytes);
        let size = http.request_body.len() as u32;
        state.effective = id;
        checked!(
            self,
            self.exports
                .request_body
                .call(&mut self.store, (id, size, end as u32))
        )?;
        Ok(())
    }

    /// Ends a context: the module cancels whatever it still runs for it.
    pub fn finish(&mut self, call: CallId) -> Result<(), HostError> {
        let id = call.0;
        if self.store.data_mut().http.contains_key(&id) {
            self.store.data_mut().effective = id;
            if let Some(done) = &self.exports.done {
                let result = done.call(&mut self.store, id);
                checked!(self, result)?;
            }
            checked!(self, self.exports.delete.call(&mut self.store, id))?;
            self.store.data_mut().http.remove(&id);
        }
        Ok(())
    }

    /// Hands a transport event to the module's root context.
    pub fn grpc_event(&mut self, token: Token, event: GrpcEvent) -> Result<(), HostError> {
        let raw = token.0;
        self.store.data_mut().effective = ROOT_ID;
        let root = ROOT_ID;
        match event {
            GrpcEvent::InitialMetadata(map) => {
                let n = map.len() as u32;
                self.store.data_mut().grpc_initial = map;
                checked!(
                    self,
                    self.exports
                        .grpc_initial
                        .call(&mut self.store, (root, raw, n))
                )
            }
            GrpcEvent::Message(bytes) => {
                let n = bytes.len() as u32;
                self.store.data_mut().message_arrived(token);
                self.store.data_mut().grpc_message = bytes;
                checked!(
                    self,
                    self.exports
                        .grpc_receive
                        .call(&mut self.store, (root, raw, n))
                )
            }
            GrpcEvent::TrailingMetadata(map) => {
                let n = map.len() as u32;
                self.store.data_mut().grpc_trailing = map;
                checked!(
                    self,
                    self.exports
                        .grpc_trailing
                        .call(&mut self.store, (root, raw, n))
                )
            }
            GrpcEvent::Close(code, message) => {
                self.store.data_mut().release(token);
                self.store.data_mut().grpc_status = (code, message);
                checked!(
                    self,
                    self.exports
                        .grpc_close
                        .call(&mut self.store, (root, raw, code))
                )
            }
        }
    }

    pub fn tick(&mut self) -> Result<(), HostError> {
        self.store.data_mut().effective = ROOT_ID;
        checked!(self, self.exports.tick.call(&mut self.store, ROOT_ID))
    }

    /// How many gRPC tokens are held (calls and streams not yet over).
    #[doc(hidden)]
    pub fn live_tokens(&self) -> usize {
        self.store.data().live_tokens.len()
    }

    /// The tick period the module asked for (0: none).
    pub fn tick_ms(&self) -> u32 {
        self.store.data().tick_ms
    }

    /// Takes what the module asked for since the last call.
    pub fn take_outputs(&mut self) -> Outputs {
        std::mem::take(&mut self.store.data_mut().outputs)
    }
}

fn limits(memory: Option<usize>) -> wasmtime::StoreLimits {
    let builder = wasmtime::StoreLimitsBuilder::new();
    match memory {
        Some(bytes) => builder.memory_size(bytes).build(),
        None => builder.build(),
    }
}

/// `$call` (a call into the module), through [`ProxyHost::checked`]; a
/// macro because the call borrows the store that `checked` reads after.
macro_rules! checked {
    ($host:expr, $call:expr) => {{
        let result = $call;
        $host.checked(result)
    }};
}
use checked;

impl ProxyHost {
    /// A call's result, failed if the module trapped anywhere in it, also
    /// in a nested call the host made (its allocator, from a host function).
    fn checked<T>(&mut self, result: wasmtime::Result<T>) -> Result<T, HostError> {
        let result = result.map_err(trap);
        match self.store.data_mut().trapped.take() {
            Some(reason) => Err(HostError::Trap(reason)),
            None => result,
        }
    }
}

/// What a proxy answers for a request no route takes: a bare 404. (The
/// module itself answers paths it cannot read when a shim configures it;
/// this is only the host's last word.)
fn no_route() -> LocalReply {
    LocalReply {
        http_status: 404,
        body: Vec::new(),
        headers: HeaderBlock::default(),
    }
}

/// The version a module says it is (`grpc_wasm_module_version`); `None` for a
/// module from before it said.
fn module_version(
    instance: &wasmtime::Instance,
    store: &mut Store<HostState>,
    memory: wasmtime::Memory,
) -> Result<Option<String>, HostError> {
    let Ok(version) = instance.get_typed_func::<(), u64>(&mut *store, "grpc_wasm_module_version")
    else {
        return Ok(None);
    };
    let packed = version.call(&mut *store, ()).map_err(trap)?;
    let (addr, len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
    let bytes = memory
        .data(&*store)
        .get(addr..addr.saturating_add(len))
        .ok_or(HostError::BadBuffer)?;
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// The shim runs only the module of its own release: the two agree on
/// the host's contract (its functions, properties and foreign functions),
/// which changes between versions.
fn check_version(module: Option<&str>) -> Result<(), HostError> {
    let shim = env!("CARGO_PKG_VERSION");
    match module {
        Some(version) if version == shim => Ok(()),
        other => Err(HostError::Load(format!(
            "the module is grpc-wasm {}, and liblua_shim.so is {shim}: install both from the same release",
            other.unwrap_or("from before 0.1.0 (it has no grpc_wasm_module_version)")
        ))),
    }
}

#[cfg(test)]
mod version_tests {
    #[test]
    fn only_the_modules_of_the_shims_own_version_load() {
        let mine = env!("CARGO_PKG_VERSION");
        assert!(super::check_version(Some(mine)).is_ok());
        assert_eq!(
            super::check_version(Some("0.0.1")).unwrap_err().to_string(),
            format!("cannot load the wasm module: the module is grpc-wasm 0.0.1, and liblua_shim.so is {mine}: install both from the same release")
        );
        assert!(super::check_version(None)
            .unwrap_err()
            .to_string()
            .contains("from before 0.1.0"));
    }
}
