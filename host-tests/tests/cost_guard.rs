//! What one request costs the filter, held to budgets committed here: the
//! host calls it makes (each a crossing that costs Envoy thousands of
//! instructions) and its heap allocations, natively, through the mock
//! proxy in Envoy's callback order, after a first request has warmed what
//! the filter keeps between requests. Both are deterministic, so the
//! budgets are exact (allocations within 2, for std's own growth from one
//! toolchain to the next): a change that adds a call or allocations fails
//! here and updates its budget in the same commit, on purpose; one that
//! takes some away fails too, so that the budget follows it down.
//! Instructions stay in `make bench-*` (callgrind), as they vary by build.

use std::collections::BTreeMap;
use std::rc::Rc;

use grpc_wasm::contract::{BufferType, MapType};
use grpc_wasm::proxy::filter::*;
use grpc_wasm::proxy::host::install;
use grpc_wasm::proxy::host::mock::MockHost;
use host_tests::amplification::{allocations, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ALLOCATION_TOLERANCE: usize = 2;
const ROOT: u32 = 1;
const HTTP: u32 = 2;

/// A unary call transcoded both ways (`POST /helloworld.Greeter/SayHello`,
/// `{"name":"ann"}`): its host calls by name, and its allocations.
const SAY_HELLO_CALLS: &[(&str, u32)] = &[
    ("current_time_nanos", 2),
    ("get_buffer", 2),
    ("get_header_pairs", 3),
    ("record_metric", 1),
    ("replace_header", 4),
    ("set_buffer", 2),
];
const SAY_HELLO_ALLOCATIONS: usize = 35;

/// A GET of a binding without a body (`GET /v1/shelves/7?view=full`),
/// called back through the loopback cluster.
const GET_SHELF_CALLS: &[(&str, u32)] = &[
    ("current_time_nanos", 3),
    ("get_buffer", 1),
    ("get_header_pairs", 1),
    ("get_property", 2),
    ("get_status", 1),
    ("grpc_close", 1),
    ("grpc_send", 1),
    ("grpc_stream", 1),
    ("record_metric", 1),
    ("send_local_response", 1),
    ("set_effective_context", 1),
];
// The mock's record of the call it opened (names, metadata) is most of it.
const GET_SHELF_ALLOCATIONS: usize = 94;

const HELLOWORLD: &str = include_str!("../../protos/helloworld.proto");
const SHELVES: &str = include_str!("../../protos/shelf_binding.proto");

fn frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    frame
}

/// A configured filter on a mock Envoy.
fn envoy(config: serde_json::Value) -> Rc<MockHost> {
    let host = Rc::new(MockHost::default());
    let config = config.to_string();
    host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    install(host.clone());
    proxy_on_context_create(ROOT, 0);
    assert_eq!(proxy_on_configure(ROOT, config.len() as u32), 1);
    host
}

fn say_hello(host: &MockHost) {
    in_filter(|| proxy_on_context_create(HTTP, ROOT));
    let headers = [
        (":method", "POST"),
        (":path", "/helloworld.Greeter/SayHello"),
        (":authority", "test"),
        ("content-type", "application/json"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    in_filter(|| proxy_on_request_headers(HTTP, headers.len() as u32, 0));
    let body = br#"{"name":"ann"}"#;
    host.set_buffer_bytes(BufferType::HttpRequestBody, body);
    in_filter(|| proxy_on_request_body(HTTP, body.len() as u32, 1));
    let headers = [(":status", "200"), ("content-type", "application/grpc")];
    host.set_map(MapType::HttpResponseHeaders, &headers);
    in_filter(|| proxy_on_response_headers(HTTP, headers.len() as u32, 0));
    let reply = frame(b"\x0a\x06hi ann");
    host.set_buffer_bytes(BufferType::HttpResponseBody, &reply);
    in_filter(|| proxy_on_response_body(HTTP, reply.len() as u32, 0));
    host.set_buffer_bytes(BufferType::HttpResponseBody, &reply);
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    in_filter(|| proxy_on_response_trailers(HTTP, 1));
    let body = host.buffer_bytes(BufferType::HttpResponseBody);
    assert_eq!(body.as_deref(), Some(&br#"{"message":"hi ann"}"#[..]));
    in_filter(|| proxy_on_done(HTTP));
    in_filter(|| proxy_on_log(HTTP));
    in_filter(|| proxy_on_delete(HTTP));
}

fn get_shelf(host: &MockHost) {
    in_filter(|| proxy_on_context_create(HTTP, ROOT));
    let headers = [
        (":method", "GET"),
        (":path", "/v1/shelves/7?view=full"),
        (":authority", "test"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    in_filter(|| proxy_on_request_headers(HTTP, headers.len() as u32, 1));
    let token = host.state.borrow().opened.last().map(|call| call.token);
    let token = token.expect("a call through the loopback");
    let shelf = b"\x08\x07";
    host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, shelf);
    in_filter(|| proxy_on_grpc_receive(ROOT, token, shelf.len() as u32));
    host.state.borrow_mut().status = Some((0, Vec::new()));
    in_filter(|| proxy_on_grpc_close(ROOT, token, 0));
    let replies = host.state.borrow().replies.len();
    assert_eq!(replies, 1);
    in_filter(|| proxy_on_done(HTTP));
    in_filter(|| proxy_on_log(HTTP));
    in_filter(|| proxy_on_delete(HTTP));
    host.state.borrow_mut().replies.clear();
}

thread_local! {
    static IN_FILTER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs a callback of the filter, counting its allocations (the mock's
/// own bookkeeping inside host calls among them, a few per request; the
/// test's setting of maps and buffers between callbacks not).
fn in_filter<T>(callback: impl FnOnce() -> T) -> T {
    let before = allocations();
    let out = callback();
    IN_FILTER.with(|n| n.set(n.get() + allocations() - before));
    out
}

/// The host calls and allocations of the second of two requests.
fn cost_of(host: &MockHost, request: fn(&MockHost)) -> (BTreeMap<&'static str, u32>, usize) {
    request(host);
    let before = host.state.borrow().host_calls.clone();
    IN_FILTER.with(|n| n.set(0));
    request(host);
    let allocated = IN_FILTER.with(|n| n.get());
    let after = host.state.borrow().host_calls.clone();
    let calls = after
        .into_iter()
        .map(|(name, n)| (name, n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    (calls, allocated)
}

fn check(
    name: &str,
    (calls, allocated): (BTreeMap<&'static str, u32>, usize),
    budget: (&[(&str, u32)], usize),
) {
    let calls: Vec<(&str, u32)> = calls.into_iter().collect();
    let total: u32 = calls.iter().map(|(_, n)| n).sum();
    let (budget_calls, budget_allocations) = budget;
    assert_eq!(
        calls.as_slice(),
        budget_calls,
        "{name}: {total} host calls per request, not the budget's: update it on purpose, in the \
         commit that changes them"
    );
    // Host calls are the filter's alone; allocations also depend on how
    // std grows its collections, which a new toolchain may change a little.
    assert!(
        allocated.abs_diff(budget_allocations) <= ALLOCATION_TOLERANCE,
        "{name}: {allocated} allocations per request, not the budget's {budget_allocations} \
         (within {ALLOCATION_TOLERANCE}): update it on purpose, in the commit that changes them"
    );
}

// One test: the allocation count is the process's, and tests run on
// threads of their own.
#[test]
fn each_request_costs_what_its_budget_says() {
    let host = envoy(serde_json::json!({"protos": {"helloworld.proto": HELLOWORLD}}));
    check(
        "SayHello",
        cost_of(&host, say_hello),
        (SAY_HELLO_CALLS, SAY_HELLO_ALLOCATIONS),
    );
    let host = envoy(serde_json::json!({
        "protos": {"shelves.proto": SHELVES},
        "loopback_cluster": "inner",
    }));
    check(
        "GET /v1/shelves/7",
        cost_of(&host, get_shelf),
        (GET_SHELF_CALLS, GET_SHELF_ALLOCATIONS),
    );
}
