//! The filter's own work per request, natively, for a profiler: the
//! proxy-wasm callbacks of one transcoded request, in Envoy's order,
//! through the core's in-memory proxy (`grpc_wasm::proxy::host::mock`),
//! repeated. Under callgrind it says where the module spends a request's
//! instructions, which Envoy's count (`make bench-envoy-instructions`)
//! cannot: V8's compiled code has no symbols there.
//!
//! Usage: `filter-profile [hello|books|book] [REQUESTS]`
//! (`make bench-filter-profile` runs it under callgrind).

use std::rc::Rc;

use grpc_wasm::contract::{BufferType, MapType};
use grpc_wasm::framing::{encode_frame, Compression};
use grpc_wasm::proxy::filter::{
    proxy_on_configure, proxy_on_context_create, proxy_on_delete, proxy_on_done,
    proxy_on_grpc_close, proxy_on_grpc_receive, proxy_on_request_body, proxy_on_request_headers,
    proxy_on_response_body, proxy_on_response_headers, proxy_on_response_trailers,
};
use grpc_wasm::proxy::host::install;
use grpc_wasm::proxy::host::mock::MockHost;

const ROOT: u32 = 1;

struct Case {
    /// Request headers after the pseudo-headers' method and path.
    method: &'static str,
    path: &'static str,
    body: &'static [u8],
    /// The upstream's message, unframed.
    reply: Vec<u8>,
    expected: &'static str,
}

fn case(name: &str) -> Option<Case> {
    let delimited = |field: u8, bytes: &[u8]| {
        let mut out = vec![(field << 3) | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    };
    let mut book = delimited(1, b"shelves/1/books/1");
    book.extend(delimited(2, b"a"));
    book.extend(delimited(3, b"t"));
    book.extend([4 << 3, 1]);
    book.extend(delimited(5, b"tag-0"));
    book.extend([6 << 3, 0xac, 0x02]);
    let book_json = r#"{"name":"shelves/1/books/1","author":"a","title":"t","genre":"FICTION","tags":["tag-0"],"pages":"300"}"#;
    Some(match name {
        "hello" => Case {
            method: "POST",
            path: "/helloworld.Greeter/SayHello",
            body: br#"{"name":"world"}"#,
            reply: delimited(1, b"Hello world!"),
            expected: r#"{"message":"Hello world!"}"#,
        },
        "books" => Case {
            method: "GET",
            path: "/v1/shelves/1/books?page.size=1",
            body: b"",
            reply: delimited(1, &book),
            expected: Box::leak(format!(r#"{{"books":[{book_json}]}}"#).into_boxed_str()),
        },
        "book" => Case {
            method: "POST",
            path: "/v1/shelves/2/books",
            body: br#"{"author":"a","title":"t","genre":"FICTION","pages":"300","tags":["tag-0"]}"#,
            reply: book,
            expected: book_json,
        },
        _ => return None,
    })
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "books".into());
    let requests: u32 = match args.next() {
        Some(n) => n.parse().map_err(|e| format!("REQUESTS: {e}"))?,
        None => 2000,
    };
    let case = case(&name).ok_or(format!("no case {name}: hello, books or book"))?;
    // A bodiless binding is called back through Envoy's internal listener,
    // as docs/envoy.md configures it.
    let config = serde_json::json!({
        "protos": {
            "helloworld.proto": include_str!("../../../protos/helloworld.proto"),
            "library.proto": include_str!("../../../protos/library.proto"),
        },
        "loopback_cluster": "loopback",
    })
    .to_string();
    let host = Rc::new(MockHost::default());
    host.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    install(host.clone());
    proxy_on_context_create(ROOT, 0);
    if proxy_on_configure(ROOT, config.len() as u32) != 1 {
        return Err(format!("not configured: {:?}", host.state.borrow().logs));
    }
    let frame = encode_frame(&case.reply, Compression::Identity).map_err(|e| e.to_string())?;
    for id in 2..requests + 2 {
        one_request(&host, id, &case, &frame)?;
    }
    println!("{requests} requests of {name}");
    Ok(())
}

fn one_request(host: &MockHost, id: u32, case: &Case, frame: &[u8]) -> Result<(), String> {
    proxy_on_context_create(id, ROOT);
    let headers = [
        (":method", case.method),
        (":path", case.path),
        (":authority", "test"),
        ("content-type", "application/json"),
    ];
    host.set_map(MapType::HttpRequestHeaders, &headers);
    let bodiless = case.body.is_empty();
    proxy_on_request_headers(id, headers.len() as u32, u32::from(bodiless));
    let body = if bodiless {
        called_out(host, case)?
    } else {
        host.set_buffer_bytes(BufferType::HttpRequestBody, case.body);
        proxy_on_request_body(id, case.body.len() as u32, 1);
        transcoded(host, id, frame)
    };
    if body != case.expected.as_bytes() {
        return Err(format!(
            "request {id}: {:?}; replies {:?}",
            String::from_utf8_lossy(&body),
            host.state.borrow().replies
        ));
    }
    proxy_on_done(id);
    proxy_on_delete(id);
    // The mock records what the filter did: forgotten, so that it does not
    // grow with the requests.
    let mut state = host.state.borrow_mut();
    state.replies.clear();
    state.opened.clear();
    state.sent.clear();
    state.logs.clear();
    Ok(())
}

/// Transcoding mode: the answer comes back through the stream.
fn transcoded(host: &MockHost, id: u32, frame: &[u8]) -> Vec<u8> {
    let response = [(":status", "200"), ("content-type", "application/grpc")];
    host.set_map(MapType::HttpResponseHeaders, &response);
    proxy_on_response_headers(id, response.len() as u32, 0);
    host.set_buffer_bytes(BufferType::HttpResponseBody, frame);
    proxy_on_response_body(id, frame.len() as u32, 0);
    host.set_map(MapType::HttpResponseTrailers, &[("grpc-status", "0")]);
    proxy_on_response_trailers(id, 1);
    host.buffer_bytes(BufferType::HttpResponseBody)
        .unwrap_or_default()
}

/// Callout mode: the filter's call answers, and the filter replies.
fn called_out(host: &MockHost, case: &Case) -> Result<Vec<u8>, String> {
    let token = match host.state.borrow().opened.as_slice() {
        [call] => call.token,
        other => return Err(format!("expected one call, got {other:?}")),
    };
    host.set_buffer_bytes(BufferType::GrpcReceiveBuffer, &case.reply);
    proxy_on_grpc_receive(ROOT, token, case.reply.len() as u32);
    host.state.borrow_mut().status = Some((0, Vec::new()));
    proxy_on_grpc_close(ROOT, token, 0);
    match host.state.borrow().replies.as_slice() {
        [reply] => Ok(reply.body.clone()),
        other => Err(format!("expected one reply, got {other:?}")),
    }
}
