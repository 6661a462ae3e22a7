//! A schema: what has been loaded, described, and messages converted with it.

use std::collections::hash_map::{Entry, HashMap};

use grpc_wasm::json::MessageType;
use grpc_wasm::{JsonOptions, Registry};
use wasm_bindgen::prelude::*;

use crate::call::Call;
use grpc_wasm::describe;

/// Every file loaded, plus google/rpc's status and error details, which
/// decode every call's error details.
#[wasm_bindgen]
pub struct Schema {
    registry: Registry,
    /// Types converted before, with their codec choices made once.
    types: HashMap<String, MessageType>,
}

/// A freed schema's pool leaves with it (the core keeps printing layouts
/// per pool until the pool's owner lets it go).
impl Drop for Schema {
    fn drop(&mut self) {
        grpc_wasm::json::forget_layouts(self.registry.pool());
    }
}

impl Default for Schema {
    fn default() -> Self {
        Schema::new()
    }
}

#[wasm_bindgen]
impl Schema {
    #[wasm_bindgen(constructor)]
    pub fn new() -> Schema {
        Schema {
            registry: Registry::default(),
            types: HashMap::new(),
        }
    }

    /// Whether this build compiles `.proto` sources.
    #[wasm_bindgen(js_name = hasCompiler)]
    pub fn has_compiler() -> bool {
        cfg!(feature = "compiler")
    }

    /// Compiles `.proto` files given as names and sources (two lists of the
    /// same length); imports are resolved among them, files loaded before,
    /// and the bundled google/protobuf, google/api and google/rpc files.
    /// Errors name the file, line and column.
    #[wasm_bindgen(js_name = addProto)]
    pub fn add_proto(&mut self, names: Vec<String>, sources: Vec<String>) -> Result<(), JsError> {
        #[cfg(feature = "compiler")]
        {
            if names.len() != sources.len() {
                return Err(JsError::new("addProto: as many names as sources"));
            }
            let files = names
                .iter()
                .map(String::as_str)
                .zip(sources.iter().map(String::as_str));
            self.registry
                .add_sources(files)
                .map_err(|e| JsError::new(&e.to_string()))
        }
        #[cfg(not(feature = "compiler"))]
        {
            let _ = (names, sources);
            Err(JsError::new(
                "this build has no .proto compiler: load a descriptor set, or use the full build",
            ))
        }
    }

    /// Adds the files of a binary `google.protobuf.FileDescriptorSet`.
    #[wasm_bindgen(js_name = addDescriptorSet)]
    pub fn add_descriptor_set(&mut self, bytes: &[u8]) -> Result<(), JsError> {
        self.registry
            .add_descriptor_set(bytes)
            .map_err(|e| JsError::new(&e.to_string()))
    }

    /// Everything loaded, as a binary `FileDescriptorSet`.
    #[wasm_bindgen(js_name = descriptorSet)]
    pub fn descriptor_set(&self) -> Vec<u8> {
        self.registry.encode_descriptor_set()
    }

    /// Every service with its methods, as JSON.
    pub fn services(&self) -> String {
        describe::services(self.registry.pool()).to_string()
    }

    /// A service, method (`/pkg.Svc/Method` or `pkg.Svc.Method`), message or
    /// enum by its full name, as JSON.
    pub fn describe(&self, name: &str) -> Result<String, JsError> {
        describe::describe(self.registry.pool(), name)
            .map(|value| value.to_string())
            .ok_or_else(|| JsError::new(&format!("nothing named '{name}' is loaded")))
    }

    /// An OpenAPI 3.1 document (JSON text) of the REST API a transcoder
    /// serves for this schema: `options` are `JsonOptions::bits` (how it
    /// prints), `stream_format` `ndjson`, `sse` or `array`, `services`
    /// only these (all when absent).
    pub fn openapi(
        &self,
        title: &str,
        stream_format: &str,
        options: u32,
        services: Option<Vec<String>>,
    ) -> Result<String, JsError> {
        let stream_format = serde_json::from_value(serde_json::Value::from(stream_format))
            .map_err(|_| JsError::new("streamFormat must be 'ndjson', 'sse' or 'array'"))?;
        let json = JsonOptions::from_bits(options);
        let options = grpc_wasm::openapi::Options {
            json: &json,
            stream_format,
            title,
        };
        let document =
            grpc_wasm::openapi::document_of(&self.registry, services.as_deref(), &options)
                .map_err(|e| JsError::new(&e))?;
        Ok(String::from_utf8_lossy(&document).into_owned())
    }

    /// JSON → protobuf for the message type `type_name`; `options` are
    /// `JsonOptions::bits`.
    pub fn encode(
        &mut self,
        type_name: &str,
        json: &str,
        options: u32,
    ) -> Result<Vec<u8>, JsError> {
        let message_type = self.message_type(type_name)?;
        message_type
            .json_to_protobuf(json.as_bytes(), &JsonOptions::from_bits(options))
            .map_err(|e| JsError::new(&e.to_string()))
    }

    /// Protobuf → JSON for the message type `type_name`.
    pub fn decode(
        &mut self,
        type_name: &str,
        bytes: &[u8],
        options: u32,
    ) -> Result<String, JsError> {
        let message_type = self.message_type(type_name)?;
        message_type
            .protobuf_to_json(bytes, &JsonOptions::from_bits(options))
            .map_err(|e| JsError::new(&e.to_string()))
    }

    /// Starts a call of `path` over `protocol` (`grpc`, `grpc-web`,
    /// `grpc-web-text`, `connect`) with `codec` (`proto`, `json`).
    pub fn call(
        &self,
        path: &str,
        protocol: &str,
        codec: &str,
        options: u32,
        max_message: Option<u32>,
    ) -> Result<Call, JsValue> {
        Call::new(&self.registry, path, protocol, codec, options, max_message)
    }
}

impl Schema {
    fn message_type(&mut self, type_name: &str) -> Result<&MessageType, JsError> {
        match self.types.entry(type_name.to_string()) {
            Entry::Occupied(known) => Ok(known.into_mut()),
            Entry::Vacant(new) => {
                let found = self
                    .registry
                    .message(type_name)
                    .map_err(|e| JsError::new(&e.to_string()))?;
                Ok(new.insert(MessageType::new(found)))
            }
        }
    }
}
