//! A typed client of the core module's own exports (`grpc_wasm_*`, see
//! wasm-filter/src/exports.rs): load protos, JSON → protobuf, protobuf → JSON,
//! protobuf → protobuf.

use grpc_wasm::JsonOptions;
use wasmtime::{Engine, Linker, Memory, Module, Store, TypedFunc};

use super::instance::{export, instantiate, load, trap, HostError};
use super::wasi;

/// One instance of the core module.
pub struct CoreModule {
    store: Store<()>,
    memory: Memory,
    buffer: TypedFunc<u32, u32>,
    result: TypedFunc<(), u64>,
    load_proto: TypedFunc<(u32, u32, u32, u32), u32>,
    json_to_proto: TypedFunc<(u32, u32, u32, u32), u32>,
    proto_to_json: TypedFunc<(u32, u32, u32, u32), u32>,
    proto_to_proto: TypedFunc<(u32, u32, u32, u32), u32>,
    set_json_options: TypedFunc<u32, u32>,
}

impl CoreModule {
    /// Compiles and instantiates the module from its bytes.
    pub fn new(wasm: &[u8]) -> Result<Self, HostError> {
        let engine = Engine::default();
        let module = Module::new(&engine, wasm).map_err(load)?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).map_err(load)?;
        // The same module is also a proxy-wasm filter; its proxy_* imports
        // are never reached through the core's own exports, so any call to
        // one is a host bug and traps.
        let (mut store, instance, memory) = instantiate(&engine, &module, linker, ())?;
        Ok(CoreModule {
            buffer: export(&instance, &mut store, "grpc_wasm_buffer")?,
            result: export(&instance, &mut store, "grpc_wasm_result")?,
            load_proto: export(&instance, &mut store, "grpc_wasm_load_proto")?,
            json_to_proto: export(&instance, &mut store, "grpc_wasm_json_to_proto")?,
            proto_to_json: export(&instance, &mut store, "grpc_wasm_proto_to_json")?,
            proto_to_proto: export(&instance, &mut store, "grpc_wasm_proto_to_proto")?,
            set_json_options: export(&instance, &mut store, "grpc_wasm_set_json_options")?,
            store,
            memory,
        })
    }

    /// Compiles one `.proto` file into the module's registry.
    pub fn load_proto(&mut self, name: &str, source: &str) -> Result<(), HostError> {
        let f = self.load_proto.clone();
        self.call2(&f, name.as_bytes(), source.as_bytes()).map(drop)
    }

    /// Sets the JSON options of the calls that follow.
    pub fn set_json_options(&mut self, options: &JsonOptions) -> Result<(), HostError> {
        let code = self
            .set_json_options
            .call(&mut self.store, options.bits())
            .map_err(trap)?;
        self.result(code).map(drop)
    }

    pub fn json_to_proto(&mut self, type_name: &str, json: &[u8]) -> Result<Vec<u8>, HostError> {
        let f = self.json_to_proto.clone();
        self.call2(&f, type_name.as_bytes(), json)
    }

    pub fn proto_to_json(&mut self, type_name: &str, message: &[u8]) -> Result<Vec<u8>, HostError> {
        let f = self.proto_to_json.clone();
        self.call2(&f, type_name.as_bytes(), message)
    }

    /// Decodes a message and encodes it again deterministically.
    pub fn proto_to_proto(
        &mut self,
        type_name: &str,
        message: &[u8],
    ) -> Result<Vec<u8>, HostError> {
        let f = self.proto_to_proto.clone();
        self.call2(&f, type_name.as_bytes(), message)
    }

    /// Both inputs go into the module's scratch buffer in one write.
    fn call2(
        &mut self,
        f: &TypedFunc<(u32, u32, u32, u32), u32>,
        a: &[u8],
        b: &[u8],
    ) -> Result<Vec<u8>, HostError> {
        let total = a
            .len()
            .checked_add(b.len())
            .filter(|&t| t <= u32::MAX as usize)
            .ok_or(HostError::BadBuffer)?;
        let ptr = self
            .buffer
            .call(&mut self.store, total as u32)
            .map_err(trap)?;
        let data = self.memory.data_mut(&mut self.store);
        let start = ptr as usize;
        let dst = start
            .checked_add(total)
            .and_then(|end| data.get_mut(start..end))
            .ok_or(HostError::BadBuffer)?;
        dst[..a.len()].copy_from_slice(a);
        dst[a.len()..].copy_from_slice(b);
        let code = f
            .call(
                &mut self.store,
                (ptr, a.len() as u32, ptr + a.len() as u32, b.len() as u32),
            )
            .map_err(trap)?;
        self.result(code)
    }

    fn result(&mut self, code: u32) -> Result<Vec<u8>, HostError> {
        let packed = self.result.call(&mut self.store, ()).map_err(trap)?;
        let (ptr, len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        let data = self.memory.data(&self.store);
        let bytes = ptr
            .checked_add(len)
            .and_then(|end| data.get(ptr..end))
            .ok_or(HostError::BadBuffer)?
            .to_vec();
        match code {
            0 => Ok(bytes),
            _ => Err(HostError::Core(
                String::from_utf8_lossy(&bytes).into_owned(),
            )),
        }
    }
}
