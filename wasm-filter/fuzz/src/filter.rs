//! The proxy-wasm filter's callbacks driven through the native mock host,
//! in any order and with any contents: each input is one HTTP stream on a
//! transcoding or a callout root, a byte-coded list of callbacks (request
//! and response headers, bodies and trailers, the gRPC callbacks, ticks
//! with time passing), then its deletion. The request headers come at most
//! once, as from every proxy; anything else may repeat or come early.
//!
//! Besides not panicking: every local reply has an HTTP status, JSON
//! replies and each line of NDJSON ones parse, and a stream is answered
//! at most once.

use std::cell::Cell;
use std::rc::Rc;

use grpc_wasm::contract::{BufferType, MapType};
use grpc_wasm::proxy::filter::{
    proxy_on_configure, proxy_on_context_create, proxy_on_delete, proxy_on_grpc_close,
    proxy_on_grpc_receive, proxy_on_grpc_receive_initial_metadata,
    proxy_on_grpc_receive_trailing_metadata, proxy_on_request_body, proxy_on_request_headers,
    proxy_on_request_trailers, proxy_on_response_body, proxy_on_response_headers,
    proxy_on_response_trailers, proxy_on_tick,
};
use grpc_wasm::proxy::host::install;
use grpc_wasm::proxy::host::mock::MockHost;

const TRANSCODING: u32 = 1;
const CALLOUT: u32 = 2;
/// Callbacks per input at most: enough for any order that matters.
const MAX_STEPS: usize = 32;

const HELLOWORLD: &str = include_str!("../../../protos/helloworld.proto");
const LIBRARY: &str = include_str!("../../../protos/library.proto");
const ROUTE_GUIDE: &str = include_str!("../../../protos/route_guide.proto");

/// Requests the roots know, every streaming kind and HTTP binding shape
/// among them, and one they do not.
const REQUESTS: [(&str, &str); 10] = [
    ("POST", "/helloworld.Greeter/SayHello"),
    ("GET", "/v1/shelves/12"),
    ("POST", "/v1/shelves/1/books?book.title=x"),
    ("GET", "/v1/search/a/b?page_size=3"),
    ("GET", "/v1/shelves/1/books:stream"),
    ("POST", "/routeguide.RouteGuide/ListFeatures"),
    ("POST", "/routeguide.RouteGuide/RecordRoute"),
    ("POST", "/routeguide.RouteGuide/RouteChat"),
    ("DELETE", "/v1/shelves/1/books/2"),
    ("GET", "/healthz"),
];

const CONTENT_TYPES: [&str; 4] = [
    "application/json",
    "application/grpc",
    "text/plain",
    "application/grpc+proto",
];

/// Input bytes read as the steps' choices; past its end every read is 0.
struct Choices<'a>(&'a [u8]);

impl<'a> Choices<'a> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        *first
    }

    fn flag(&mut self) -> bool {
        self.byte() & 1 != 0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::from(self.byte()) % from.len()]
    }

    /// Up to 255 bytes, their length first.
    fn bytes(&mut self) -> &'a [u8] {
        let len = usize::from(self.byte()).min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        taken
    }

    fn text(&mut self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

thread_local! {
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
    static NEXT_CONTEXT: Cell<u32> = const { Cell::new(100) };
}

/// A fresh mock proxy as the host; on ngx_wasm_module it has the property
/// by which the filter recognizes that host.
fn new_host(ngx: bool) -> Rc<MockHost> {
    let host = Rc::new(MockHost::default());
    if ngx {
        host.state
            .borrow_mut()
            .properties
            .insert(b"ngx\0hostname".to_vec(), b"fuzz".to_vec());
    }
    install(host.clone());
    host
}

/// Both roots, configured once per thread (the filter keeps them, as a VM
/// does); the host kind is learnt then too.
fn configure(ngx: bool) {
    if CONFIGURED.with(Cell::get) {
        return;
    }
    let host = new_host(ngx);
    let protos = serde_json::json!({
        "helloworld.proto": HELLOWORLD,
        "library.proto": LIBRARY,
        "route_guide.proto": ROUTE_GUIDE,
    });
    let configs = [
        (
            TRANSCODING,
            serde_json::json!({"protos": protos.clone(), "loopback_cluster": "inner"}),
        ),
        (
            CALLOUT,
            serde_json::json!({"protos": protos, "callout": {"upstream": "up", "timeout_ms": 1000}}),
        ),
    ];
    for (root, config) in configs {
        let config = config.to_string();
        host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
        proxy_on_context_create(root, 0);
        let loaded = proxy_on_configure(root, config.len() as u32);
        assert_eq!(loaded, 1, "{:?}", host.state.borrow().logs);
    }
    CONFIGURED.with(|c| c.set(true));
}

fn headers(choices: &mut Choices, pseudo: &[(&str, String)]) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = pseudo
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    for _ in 0..choices.byte() % 4 {
        let name = choices.pick(&[
            "content-type",
            "content-length",
            "grpc-timeout",
            "grpc-metadata-user",
            "grpc-encoding",
            "x-grpc-wasm-json-options",
            "x-grpc-wasm-original-path",
            "transfer-encoding",
        ]);
        let value = if choices.flag() {
            choices.pick(&CONTENT_TYPES).to_string()
        } else {
            choices.text()
        };
        headers.push((name.to_string(), value));
    }
    headers
}

fn set_map(host: &MockHost, map: MapType, headers: &[(String, String)]) {
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    host.set_map(map, &pairs);
}

/// A body: JSON-ish text, or gRPC frames around arbitrary bytes.
fn body(choices: &mut Choices) -> Vec<u8> {
    let raw = choices.bytes();
    if !choices.flag() {
        return raw.to_vec();
    }
    let compressed = choices.byte() & 1;
    let mut framed = vec![compressed];
    framed.extend((raw.len() as u32).to_be_bytes());
    framed.extend(raw);
    if choices.flag() {
        // Cut the frame short.
        framed.truncate(usize::from(choices.byte()) % framed.len().max(1));
    }
    framed
}

/// The next chunk of a body the host buffers: what it holds grows (or,
/// `drained`, starts again, as after the filter took it); returns its size.
fn more_body(choices: &mut Choices, host: &MockHost, kind: BufferType, drained: bool) -> u32 {
    let mut held = host.buffer_bytes(kind).unwrap_or_default();
    if drained {
        held.clear();
    }
    held.extend(body(choices));
    host.set_buffer_bytes(kind, &held);
    held.len() as u32
}

fn token(choices: &mut Choices, host: &MockHost) -> u32 {
    let state = host.state.borrow();
    match state.opened.len() {
        0 => u32::from(choices.byte()),
        n => state.opened[usize::from(choices.byte()) % n].token,
    }
}

/// One callback, chosen and filled by the input.
fn step(choices: &mut Choices, host: &MockHost, root: u32, context: u32) {
    let end = choices.flag();
    match choices.byte() % 12 {
        // Proxies call it once per stream, first; a repeat is a no-op.
        0 if host
            .state
            .borrow()
            .maps
            .contains_key(&MapType::HttpRequestHeaders) => {}
        0 => {
            let (method, path) = choices.pick(&REQUESTS);
            let pseudo = [
                (":method", method.to_string()),
                (":path", path.to_string()),
                (":authority", "fuzz".to_string()),
                ("content-type", choices.pick(&CONTENT_TYPES).to_string()),
            ];
            let headers = headers(choices, &pseudo);
            set_map(host, MapType::HttpRequestHeaders, &headers);
            proxy_on_request_headers(context, headers.len() as u32, u32::from(end));
        }
        1 => {
            let size = more_body(choices, host, BufferType::HttpRequestBody, false);
            proxy_on_request_body(context, size, u32::from(end));
        }
        2 => {
            let status = choices.pick(&["200", "503", "404", "413", "", "abc"]);
            let mut pseudo = vec![
                (":status", status.to_string()),
                ("content-type", choices.pick(&CONTENT_TYPES).to_string()),
            ];
            if choices.flag() {
                pseudo.push(("grpc-status", choices.text()));
                pseudo.push(("grpc-message", choices.text()));
            }
            let headers = headers(choices, &pseudo);
            set_map(host, MapType::HttpResponseHeaders, &headers);
            proxy_on_response_headers(context, headers.len() as u32, u32::from(end));
        }
        3 => {
            let drained = choices.flag();
            let size = more_body(choices, host, BufferType::HttpResponseBody, drained);
            proxy_on_response_body(context, size, u32::from(end));
        }
        4 => {
            let pseudo = [
                ("grpc-status", choices.text()),
                ("grpc-message", choices.text()),
                ("grpc-status-details-bin", choices.text()),
            ];
            let headers = headers(choices, &pseudo);
            set_map(host, MapType::HttpResponseTrailers, &headers);
            proxy_on_response_trailers(context, headers.len() as u32);
        }
        5 => {
            let token = token(choices, host);
            let metadata = headers(choices, &[]);
            set_map(host, MapType::GrpcReceiveInitialMetadata, &metadata);
            proxy_on_grpc_receive_initial_metadata(root, token, metadata.len() as u32);
        }
        6 => {
            let token = token(choices, host);
            let message = choices.bytes();
            host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, message);
            proxy_on_grpc_receive(root, token, message.len() as u32);
        }
        7 => {
            let token = token(choices, host);
            let details = choices.text();
            let metadata = headers(choices, &[("grpc-status-details-bin", details)]);
            set_map(host, MapType::GrpcReceiveTrailingMetadata, &metadata);
            proxy_on_grpc_receive_trailing_metadata(root, token, metadata.len() as u32);
        }
        8 => {
            let token = token(choices, host);
            let code = u32::from(choices.byte()) % 20;
            let message = choices.bytes().to_vec();
            host.state.borrow_mut().status = Some((code, message));
            proxy_on_grpc_close(root, token, code);
        }
        9 => {
            let later = u64::from(choices.byte()) * 10_000_000;
            host.state.borrow_mut().now_nanos += later;
            proxy_on_tick(root);
        }
        10 => {
            let headers = headers(choices, &[]);
            set_map(host, MapType::HttpRequestTrailers, &headers);
            proxy_on_request_trailers(context, headers.len() as u32);
        }
        _ => {
            // A callback for a stream the filter does not know.
            proxy_on_request_body(context + 1, 0, 1);
        }
    }
}

/// Runs one input on a filter in this host kind (`ngx`: ngx_wasm_module).
pub fn run(data: &[u8], ngx: bool) {
    configure(ngx);
    let host = new_host(ngx);
    let mut choices = Choices(data);
    let root = if choices.flag() { CALLOUT } else { TRANSCODING };
    let context = NEXT_CONTEXT.with(|n| {
        let id = n.get();
        n.set(id.wrapping_add(2).max(100));
        id
    });
    proxy_on_context_create(context, root);
    for _ in 0..MAX_STEPS {
        if choices.done() {
            break;
        }
        step(&mut choices, &host, root, context);
    }
    proxy_on_delete(context);
    let state = host.state.borrow();
    assert!(
        state.replies.len() <= 1,
        "a stream answered twice: {:?}",
        state.replies
    );
    for reply in &state.replies {
        assert!(
            (200..=599).contains(&reply.http_status),
            "reply status {}",
            reply.http_status
        );
        let content_type = reply
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.as_slice())
            .unwrap_or_default();
        let parses = |text: &[u8]| serde_json::from_slice::<serde_json::Value>(text).is_ok();
        if content_type.starts_with(b"application/json") {
            assert!(
                parses(&reply.body),
                "a JSON reply that does not parse: {:?}",
                String::from_utf8_lossy(&reply.body)
            );
        }
        if content_type == b"application/x-ndjson" {
            assert!(
                reply
                    .body
                    .split(|b| *b == b'\n')
                    .all(|line| line.is_empty() || parses(line)),
                "an NDJSON reply with a line that does not parse: {:?}",
                String::from_utf8_lossy(&reply.body)
            );
        }
    }
}
