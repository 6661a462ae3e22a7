//! `google.api.http` templates: parse any template, match any path against
//! it, and build the request message from the variables, a query string
//! and a body, or refuse them with an error.
//!
//! Input: template, path, query, body field ("", "*" or a field name) and
//! body, separated by newlines.

#![no_main]

use grpc_wasm::http_body;
use grpc_wasm::http_rule::{request_message, response_part, Binding, Template};
use grpc_wasm::JsonOptions;
use grpc_wasm_fuzz::{on_host_stack, registry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| on_host_stack(data, run));

fn run(data: &[u8]) {
    let mut parts = data.splitn(5, |&b| b == b'\n');
    let mut text = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (template, path, query, body_field) = (text(), text(), text(), text());
    let body = parts.next().unwrap_or_default();
    let Ok(template) = Template::parse(&template) else {
        return;
    };
    let Some(vars) = template.matches(&path) else {
        return;
    };
    let method = registry()
        .method("/grpcwasm.fuzz.Fuzz/Get")
        .expect("the schema has its method");
    let binding = Binding {
        http_method: "POST".into(),
        template,
        request_http_body: http_body::at(&method.input(), &body_field),
        response_http_body: http_body::at(&method.output(), &body_field),
        response_body: body_field.clone(),
        body: body_field,
        method,
    };
    let options = JsonOptions::default();
    let body = (body, Some("application/octet-stream"));
    if let Ok(bytes) = request_message(&binding, vars, &query, body, &options) {
        let output = binding.method.output_type();
        if let Ok(printed) = output.protobuf_to_json(&bytes, &options) {
            response_part(&binding, &printed);
        }
    }
}
