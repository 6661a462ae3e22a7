//! The core's JSON ⇄ protobuf conversions behind one interface, run either
//! natively (the rlib) or inside the `.wasm` that the hosts run, through the
//! module's own exports under wasmtime (`lua_shim::CoreModule`). The
//! reference suites (protobuf's conformance suite, the differential test)
//! drive both, because wasm32 differs from the native build in `usize`,
//! floats and allocation.
//!
//! `CORE_WASM=<path to grpc_wasm.wasm>` selects the module; without it the
//! engine is native.
//!
//! Each driver includes this file as a module of its own (see there), and
//! uses only part of it.
#![allow(dead_code)]

use grpc_wasm::json::{decode_message, json_to_protobuf, protobuf_to_json};
use grpc_wasm::{encode_deterministic, JsonOptions, Registry};
use lua_shim::{CoreModule, HostError};

use host_tests::BoxError;

/// Why a conversion gave no answer.
#[derive(Debug)]
pub enum EngineError {
    /// The core refused the input; the text is its reason.
    Refused(String),
    /// The engine itself failed (the module trapped, or answered out of
    /// bounds): this says nothing about the input, so a suite must never
    /// count it as a rejection.
    Broken(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Refused(reason) => f.write_str(reason),
            EngineError::Broken(reason) => write!(f, "the engine failed: {reason}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<HostError> for EngineError {
    fn from(e: HostError) -> EngineError {
        match e {
            HostError::Core(reason) => EngineError::Refused(reason),
            other => EngineError::Broken(other.to_string()),
        }
    }
}

fn refused(e: impl std::fmt::Display) -> EngineError {
    EngineError::Refused(e.to_string())
}

/// The environment variable that names the `.wasm` to run instead of the rlib.
pub const CORE_WASM: &str = "CORE_WASM";

/// Where the core runs.
pub enum Engine {
    Native(Registry),
    // Boxed: a module instance is far larger than a registry handle.
    Wasm(Box<CoreModule>),
}

impl Engine {
    /// The engine `CORE_WASM` selects, with `.proto` sources (name, text)
    /// compiled in order.
    pub fn from_env(sources: &[(String, String)]) -> Result<Engine, BoxError> {
        match std::env::var_os(CORE_WASM) {
            Some(path) => {
                let wasm =
                    std::fs::read(&path).map_err(|e| format!("{}: {e}", path.to_string_lossy()))?;
                let mut core = CoreModule::new(&wasm)?;
                for (name, text) in sources {
                    core.load_proto(name, text)?;
                }
                Ok(Engine::Wasm(Box::new(core)))
            }
            None => {
                let mut registry = Registry::new()?;
                registry.add_sources(sources.iter().map(|(n, s)| (n.as_str(), s.as_str())))?;
                Ok(Engine::Native(registry))
            }
        }
    }

    /// JSON → protobuf (deterministic).
    pub fn json_to_proto(
        &mut self,
        type_name: &str,
        json: &[u8],
        options: &JsonOptions,
    ) -> Result<Vec<u8>, EngineError> {
        match self {
            Engine::Native(registry) => {
                let desc = registry.message(type_name).map_err(refused)?;
                json_to_protobuf(&desc, json, options).map_err(refused)
            }
            Engine::Wasm(core) => {
                core.set_json_options(options)?;
                Ok(core.json_to_proto(type_name, json)?)
            }
        }
    }

    /// protobuf → JSON.
    pub fn proto_to_json(
        &mut self,
        type_name: &str,
        bytes: &[u8],
        options: &JsonOptions,
    ) -> Result<String, EngineError> {
        match self {
            Engine::Native(registry) => {
                let desc = registry.message(type_name).map_err(refused)?;
                protobuf_to_json(&desc, bytes, options).map_err(refused)
            }
            Engine::Wasm(core) => {
                core.set_json_options(options)?;
                let json = core.proto_to_json(type_name, bytes)?;
                String::from_utf8(json).map_err(|_| {
                    EngineError::Broken("the module wrote JSON that is not UTF-8".into())
                })
            }
        }
    }

    /// protobuf → protobuf: decoded, then encoded deterministically.
    pub fn proto_to_proto(
        &mut self,
        type_name: &str,
        bytes: &[u8],
    ) -> Result<Vec<u8>, EngineError> {
        match self {
            Engine::Native(registry) => {
                let desc = registry.message(type_name).map_err(refused)?;
                decode_message(&desc, bytes)
                    .map(|m| encode_deterministic(&m))
                    .map_err(refused)
            }
            Engine::Wasm(core) => Ok(core.proto_to_proto(type_name, bytes)?),
        }
    }

    /// Which build this is, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Native(_) => "native",
            Engine::Wasm(_) => "wasm",
        }
    }
}
