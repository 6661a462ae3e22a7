//! Server reflection for the npm package (`loadFromReflection`): the
//! core's reflection [`Loader`] over calls the JavaScript side carries.
//! Each round is one call whose body holds every request the load can
//! ask at that point, sent whole and half-closed, so that it needs no
//! request streaming: gRPC over node:http2, and gRPC-Web over fetch
//! (through Envoy's `grpc_web` filter), carry it alike. Servers answer a
//! reflection stream's requests in order and end it once the client has
//! half-closed; what the answers ask next goes in the next round.

use grpc_wasm::limits::MAX_REFLECTED_BYTES;
use grpc_wasm::reflection::{Loader, ReflectionError, METHOD};
use grpc_wasm::web::{self, Codec, Event, Protocol, ResponseReader, Wire};
use grpc_wasm::{Code, JsonOptions, Metadata, Registry, Status, StreamingKind};
use serde_json::json;
use wasm_bindgen::prelude::*;

use crate::outcome::status_json;

/// One load, round by round. Each method that reads returns the state
/// as JSON: `{"state": "reading"}` (read on), `"next"` (this call is
/// over: start the next round), `"complete"` (stop reading: the set is
/// ready) or `"failed"` with `"status"`.
#[wasm_bindgen]
pub struct Reflection {
    loader: Option<Loader>,
    wire: Wire,
    reader: Option<ResponseReader>,
    /// The requests the next round sends, encoded: what the loader asked
    /// for by the end of the round before.
    next: Vec<Vec<u8>>,
    complete: bool,
    registry: Registry,
}

#[wasm_bindgen]
impl Reflection {
    /// A load of `services` (every service the server lists when absent),
    /// over `protocol` (`grpc`, `grpc-web`, `grpc-web-text`).
    #[wasm_bindgen(constructor)]
    pub fn new(services: Option<Vec<String>>, protocol: &str) -> Result<Reflection, JsValue> {
        let registry = Registry::default();
        let protocol = Protocol::from_name(protocol)
            .filter(|p| *p != Protocol::Connect)
            .ok_or_else(|| {
                let message =
                    format!("reflection over '{protocol}': use 'grpc' (node:http2) or 'grpc-web'");
                throw(&registry, Status::new(Code::InvalidArgument, message))
            })?;
        let mut loader = Loader::new(
            grpc_wasm::reflection::Version::V1,
            services.as_deref(),
            Registry::bundled_files(),
        );
        Ok(Reflection {
            next: loader.requests(),
            loader: Some(loader),
            wire: Wire::new(protocol, Codec::Proto, StreamingKind::Bidirectional),
            reader: None,
            complete: false,
            registry,
        })
    }

    /// The path of the next round's call (it changes when the server
    /// speaks only `v1alpha`).
    #[wasm_bindgen(getter)]
    pub fn path(&self) -> String {
        let service = self.loader.as_ref().map_or("", |l| l.version().service());
        format!("/{service}/{METHOD}")
    }

    /// The request headers of a round, flat: name, value, ...
    #[wasm_bindgen(js_name = requestHeaders)]
    pub fn request_headers(&self, timeout_ms: Option<f64>) -> Vec<String> {
        let timeout = timeout_ms
            .filter(|ms| ms.is_finite() && *ms > 0.0)
            .map(|ms| std::time::Duration::from_millis(ms.ceil() as u64));
        web::request_headers(&self.wire, timeout, &Metadata::new())
            .into_iter()
            .flat_map(|(name, value)| [name, value])
            .collect()
    }

    /// Starts a round: the body of its call, every request enveloped.
    #[wasm_bindgen(js_name = startRound)]
    pub fn start_round(&mut self) -> Result<Vec<u8>, JsValue> {
        self.reader = Some(ResponseReader::new(self.wire, MAX_REFLECTED_BYTES));
        let mut body = Vec::new();
        for request in std::mem::take(&mut self.next) {
            let framed = web::envelope(&self.wire, request)
                .map_err(|e| throw(&self.registry, Status::new(Code::Internal, e.to_string())))?;
            body.extend_from_slice(&framed);
        }
        Ok(body)
    }

    /// The round's response status line and headers (flat).
    pub fn headers(&mut self, http_status: u16, headers: Vec<String>) -> String {
        let headers = crate::call::pairs(headers);
        let events = self.with_reader(|r| r.headers(http_status, &headers));
        self.read(events)
    }

    /// The next body chunk of the round.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let events = self.with_reader(|r| r.push(chunk));
        self.read(events)
    }

    /// The end of the round's body, with its HTTP/2 trailers if any.
    pub fn finish(&mut self, trailers: Option<Vec<String>>) -> String {
        let trailers = trailers.map(crate::call::pairs);
        let events = self.with_reader(|r| r.finish(trailers.as_deref()));
        self.read(events)
    }

    /// The loaded set, once complete: an encoded `FileDescriptorSet`.
    #[wasm_bindgen(js_name = descriptorSet)]
    pub fn descriptor_set(&mut self) -> Result<Vec<u8>, JsValue> {
        let loader = self
            .loader
            .take()
            .filter(|_| self.complete)
            .ok_or_else(|| {
                let status = Status::new(Code::FailedPrecondition, "the load is not complete");
                throw(&self.registry, status)
            })?;
        loader
            .finish()
            .map(|reflected| reflected.descriptor_set)
            .map_err(|e| throw(&self.registry, Status::new(e.code(), e.to_string())))
    }
}

impl Reflection {
    /// The reader's events for `f`, and every batch it held back.
    fn with_reader(&mut self, f: impl FnOnce(&mut ResponseReader) -> Vec<Event>) -> Vec<Event> {
        let Some(reader) = self.reader.as_mut() else {
            return Vec::new();
        };
        let mut events = f(reader);
        while reader.has_more() {
            events.extend(reader.pull());
        }
        events
    }

    fn read(&mut self, events: Vec<Event>) -> String {
        for event in events {
            let step = match event {
                Event::Message(bytes) => self.answer(&bytes),
                Event::End(outcome) => self.end(&outcome.status),
            };
            if let Some(state) = step {
                self.reader = None;
                return state;
            }
        }
        json!({"state": "reading"}).to_string()
    }

    /// One answer; a state when the round ends with it.
    fn answer(&mut self, bytes: &[u8]) -> Option<String> {
        let loader = self.loader.as_mut()?;
        // What the answer asks next waits in the loader for the next round:
        // this round's requests are all sent already.
        match loader.on_message(bytes) {
            Ok(()) if loader.is_complete() => {
                self.complete = true;
                Some(json!({"state": "complete"}).to_string())
            }
            Ok(()) => None,
            Err(e) => Some(self.failed(&e)),
        }
    }

    /// The round's call ended with `status`.
    fn end(&mut self, status: &Status) -> Option<String> {
        let loader = self.loader.as_mut()?;
        if status.code == Code::Ok && loader.is_answered() && !loader.is_complete() {
            self.next = loader.requests();
            if !self.next.is_empty() {
                return Some(json!({"state": "next"}).to_string());
            }
        }
        match loader.on_close(status.code, &status.message) {
            Ok(Some(_)) => {
                // The other version, from the start.
                self.next = loader.requests();
                Some(json!({"state": "next"}).to_string())
            }
            Ok(None) => {
                self.complete = true;
                Some(json!({"state": "complete"}).to_string())
            }
            Err(e) => Some(self.failed(&e)),
        }
    }

    fn failed(&self, error: &ReflectionError) -> String {
        let status = Status::new(error.code(), error.to_string());
        let status = status_json(&self.registry, &status, &JsonOptions::default());
        json!({"state": "failed", "status": status}).to_string()
    }
}

fn throw(registry: &Registry, status: Status) -> JsValue {
    crate::call::throw(registry, status)
}
