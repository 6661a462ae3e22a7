//! One call: its request headers and messages, and its response read into
//! messages (as JSON) and a final status.

use std::time::Duration;

use grpc_wasm::json::JsonOptions;
use grpc_wasm::limits::DEFAULT_MAX_MESSAGE_BYTES;
use grpc_wasm::web::{self, Codec, Event, Protocol, ResponseReader, Wire};
use grpc_wasm::{Code, Metadata, MetadataValue, Method, Registry, Status, StreamingKind};
use wasm_bindgen::prelude::*;

use crate::held::Share;
use crate::outcome::{events_json, outcome_json, status_json};

/// A call in progress. Methods that fail throw the JSON text of a status
/// (`{code, name, message, details}`), which the JavaScript side turns
/// into a `GrpcError`.
#[wasm_bindgen]
pub struct Call {
    registry: Registry,
    method: Method,
    wire: Wire,
    reader: ResponseReader,
    options: JsonOptions,
    metadata: Metadata,
    held: Share,
}

impl Call {
    pub(crate) fn new(
        registry: &Registry,
        path: &str,
        protocol: &str,
        codec: &str,
        options: u32,
        max_message: Option<u32>,
    ) -> Result<Call, JsValue> {
        let unknown = |what: &str, name: &str| {
            throw(
                registry,
                Status::new(Code::InvalidArgument, format!("unknown {what} '{name}'")),
            )
        };
        let protocol =
            Protocol::from_name(protocol).ok_or_else(|| unknown("protocol", protocol))?;
        let codec = Codec::from_name(codec).ok_or_else(|| unknown("codec", codec))?;
        let method = registry
            .method(path)
            .map_err(|e| throw(registry, Status::new(Code::Unimplemented, e.to_string())))?;
        let wire = Wire::new(protocol, codec, method.streaming());
        let max = max_message.map_or(DEFAULT_MAX_MESSAGE_BYTES, |m| m as usize);
        Ok(Call {
            registry: registry.clone(),
            reader: ResponseReader::new(wire, max),
            wire,
            method,
            options: JsonOptions::from_bits(options),
            metadata: Metadata::new(),
            held: Share::default(),
        })
    }
}

#[wasm_bindgen]
impl Call {
    /// `unary`, `server_streaming`, `client_streaming` or `bidi_streaming`.
    #[wasm_bindgen(getter)]
    pub fn kind(&self) -> String {
        match self.method.streaming() {
            StreamingKind::Unary => "unary",
            StreamingKind::ServerStreaming => "server_streaming",
            StreamingKind::ClientStreaming => "client_streaming",
            StreamingKind::Bidirectional => "bidi_streaming",
        }
        .to_string()
    }

    /// The method's path, `/pkg.Service/Method`.
    #[wasm_bindgen(getter)]
    pub fn path(&self) -> String {
        self.method.path().to_string()
    }

    /// Adds request metadata with a text value (a `-bin` key takes it as
    /// its raw bytes).
    #[wasm_bindgen(js_name = addMetadata)]
    pub fn add_metadata(&mut self, key: &str, value: &str) -> Result<(), JsValue> {
        self.append(key, MetadataValue::Ascii(value.to_string()))
    }

    /// Adds request metadata with bytes; the key must end in `-bin`.
    #[wasm_bindgen(js_name = addBinaryMetadata)]
    pub fn add_binary_metadata(&mut self, key: &str, value: &[u8]) -> Result<(), JsValue> {
        self.append(key, MetadataValue::Binary(value.to_vec()))
    }

    /// The request headers, flat: name, value, name, value...
    #[wasm_bindgen(js_name = requestHeaders)]
    pub fn request_headers(&self, timeout_ms: Option<f64>) -> Vec<String> {
        let timeout = timeout_ms
            .filter(|ms| ms.is_finite() && *ms > 0.0)
            .map(|ms| Duration::from_millis(ms.ceil() as u64));
        web::request_headers(&self.wire, timeout, &self.metadata)
            .into_iter()
            .flat_map(|(name, value)| [name, value])
            .collect()
    }

    /// One request message, from its JSON, as the body (or the next piece
    /// of it) that this call's wire wants.
    #[wasm_bindgen(js_name = encodeRequest)]
    pub fn encode_request(&self, json: &str) -> Result<Vec<u8>, JsValue> {
        web::encode_message(
            &self.wire,
            self.method.input_type(),
            json.as_bytes(),
            &self.options,
        )
        .map_err(|e| self.request_error(e))
    }

    /// The query string of a Connect GET for this request.
    #[wasm_bindgen(js_name = getQuery)]
    pub fn get_query(&self, json: &str) -> Result<String, JsValue> {
        web::get_query(&self.wire, &self.method, json.as_bytes(), &self.options)
            .map_err(|e| self.request_error(e))
    }

    /// The response's status line and headers (flat: name, value, ...;
    /// names lower-case). Returns events JSON: `{messages, end, more}`.
    pub fn headers(&mut self, http_status: u16, headers: Vec<String>) -> String {
        let headers = pairs(headers);
        let events = self.reader.headers(http_status, &headers);
        self.events(events)
    }

    /// The next body chunk. Returns events JSON.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        let events = self.reader.push(chunk);
        self.events(events)
    }

    /// The next messages of what was pushed, when the last events said
    /// `more`: a chunk of many messages is read a batch at a time (each
    /// about the message limit), so that memory holds one batch.
    pub fn pull(&mut self) -> String {
        let events = self.reader.pull();
        self.events(events)
    }

    /// The end of the body, with HTTP/2 trailers when there are any.
    /// Returns events JSON, whose `end` is then set.
    pub fn finish(&mut self, trailers: Option<Vec<String>>) -> String {
        let trailers = trailers.map(pairs);
        let events = self.reader.finish(trailers.as_deref());
        self.events(events)
    }

    /// Ends the call locally: `DEADLINE_EXCEEDED` after `deadline_ms`.
    #[wasm_bindgen(js_name = deadlineStatus)]
    pub fn deadline_status(&self, deadline_ms: f64) -> String {
        let status = Status::deadline_exceeded(deadline_ms.max(0.0) as u64);
        status_json(&self.registry, &status, &self.options).to_string()
    }

    /// A stream the server reset with HTTP/2 error code `reason`.
    #[wasm_bindgen(js_name = resetStatus)]
    pub fn reset_status(&self, reason: u32) -> String {
        let status = Status::from_h2_reset(reason);
        status_json(&self.registry, &status, &self.options).to_string()
    }

    /// Ends the call locally with the code named `code` (its canonical
    /// name, e.g. "CANCELLED"; UNKNOWN for any other text) and `message`:
    /// a cancellation, a network failure, a kind the transport cannot carry.
    #[wasm_bindgen(js_name = localStatus)]
    pub fn local_status(&self, code: &str, message: &str) -> String {
        let status = Status::new(Code::from_name(code).unwrap_or(Code::Unknown), message);
        status_json(&self.registry, &status, &self.options).to_string()
    }
}

impl Call {
    fn append(&mut self, key: &str, value: MetadataValue) -> Result<(), JsValue> {
        if web::is_protocol_request_key(&key.to_ascii_lowercase()) {
            let message = format!("metadata key '{key}' is a header the protocol sets itself");
            return Err(throw(
                &self.registry,
                Status::new(Code::InvalidArgument, message),
            ));
        }
        self.metadata.append(key, value).map_err(|e| {
            throw(
                &self.registry,
                Status::new(Code::InvalidArgument, e.to_string()),
            )
        })
    }

    fn request_error(&self, error: grpc_wasm::Error) -> JsValue {
        let message = format!("the request cannot be sent: {error}");
        throw(&self.registry, Status::new(Code::InvalidArgument, message))
    }

    /// Messages become JSON with the call's options; one that cannot ends
    /// the call `INTERNAL`, as gRPC's own clients answer a response they
    /// cannot parse.
    fn events(&mut self, mut events: Vec<Event>) -> String {
        if let Err(message) = self.held.set(self.reader.held()) {
            let outcome = self
                .reader
                .fail(Status::new(Code::ResourceExhausted, message));
            events = vec![Event::End(outcome)];
            // Ended, the reader holds nothing: shrinking its share cannot fail.
            let _ = self.held.set(self.reader.held());
        }
        let mut messages = Vec::new();
        let mut end = None;
        for event in events {
            match event {
                Event::Message(bytes) if end.is_none() => match self.message_json(&bytes) {
                    Ok(text) => messages.push(text),
                    Err(e) => {
                        let status = Status::new(
                            Code::Internal,
                            format!("the response cannot be read: {e}"),
                        );
                        let outcome = self.reader.fail(status);
                        end = Some(outcome_json(&self.registry, &outcome, &self.options));
                    }
                },
                Event::Message(_) => {}
                Event::End(outcome) if end.is_none() => {
                    end = Some(outcome_json(&self.registry, &outcome, &self.options));
                }
                Event::End(_) => {}
            }
        }
        events_json(&messages, end, self.reader.has_more())
    }

    fn message_json(&self, bytes: &[u8]) -> Result<String, grpc_wasm::Error> {
        let output = self.method.output_type();
        match self.wire.codec {
            Codec::Proto => output.protobuf_to_json(bytes, &self.options),
            Codec::Json => {
                // A newer server may send fields this schema lacks, as
                // protobuf's binary form would skip them.
                let read = JsonOptions {
                    ignore_unknown_fields: true,
                    ..JsonOptions::default()
                };
                let protobuf = output.json_to_protobuf(bytes, &read)?;
                output.protobuf_to_json(&protobuf, &self.options)
            }
        }
    }
}

pub(crate) fn pairs(flat: Vec<String>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut items = flat.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        out.push((name.to_ascii_lowercase(), value));
    }
    out
}

/// A status as the value thrown to JavaScript.
pub(crate) fn throw(registry: &Registry, status: Status) -> JsValue {
    JsValue::from_str(&status_json(registry, &status, &JsonOptions::default()).to_string())
}
