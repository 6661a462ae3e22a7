//! An OpenAPI 3.1 document of what a transcoder serves, built from the
//! loaded descriptors and their `google.api.http` bindings: each binding
//! an operation, and `POST /pkg.Service/Method` for every method, as the
//! filter serves them; schemas as the core prints JSON with the options in
//! force ([`schema`]); errors as `google.rpc.Status`. Built once per
//! configuration, bounded in messages and bytes.

mod schema;

use std::collections::{BTreeMap, BTreeSet};

use prost_reflect::{Cardinality, DescriptorPool, Kind, MessageDescriptor};
use serde_json::{json, Map, Value};

use crate::descriptors::{Method, StreamingKind};
use crate::http_body;
use crate::http_rule::{collect_bindings, fields_on, Binding, PathParam, StreamFormat};
use crate::json::JsonOptions;
use crate::limits::{
    MAX_OPENAPI_BYTES, MAX_OPENAPI_OPERATIONS, MAX_OPENAPI_QUERY_DEPTH, MAX_OPENAPI_QUERY_FIELDS,
    MAX_OPENAPI_QUERY_FIELDS_ALL,
};
use crate::Registry;
use schema::{property_name, Components};

/// What shapes the document: the JSON options and stream format the
/// transcoder runs with, and its title.
pub struct Options<'a> {
    pub json: &'a JsonOptions,
    pub stream_format: StreamFormat,
    pub title: &'a str,
}

const NDJSON: &str = "application/x-ndjson";
const STATUS: &str = "google.rpc.Status";

/// The document of `services` of `registry` (all when `None`), as a
/// transcoder serves them.
pub fn document_of(
    registry: &Registry,
    services: Option<&[String]>,
    options: &Options,
) -> Result<Vec<u8>, String> {
    let (bindings, _) = collect_bindings(registry, services)?;
    let exposed = |service: &str| services.is_none_or(|list| list.iter().any(|s| s == service));
    let mut methods: Vec<Method> = registry
        .methods_by_path()
        .into_values()
        .filter(|m| exposed(m.service_name()))
        .collect();
    methods.sort_by(|a, b| a.path().cmp(b.path()));
    document(registry.pool(), &methods, &bindings, options)
}

/// The document, as JSON text, for `methods` (those served) and their
/// `bindings`. A path bound twice alike is left out: Envoy binds it to
/// neither binding (`http_rule::bound_twice`).
pub fn document(
    pool: &DescriptorPool,
    methods: &[Method],
    bindings: &[Binding],
    options: &Options,
) -> Result<Vec<u8>, String> {
    let mut builder = Builder {
        query_budget: MAX_OPENAPI_QUERY_FIELDS_ALL,
        operations: 0,
        status: json!({}),
        components: Components::new(options.json),
        options,
        paths: BTreeMap::new(),
        ids: BTreeSet::new(),
    };
    let status = pool
        .get_message_by_name(STATUS)
        .map(|status| builder.components.message(&status))
        .unwrap_or_else(|| json!({}));
    builder.status = status.clone();
    let mut shapes: BTreeMap<(String, String), usize> = BTreeMap::new();
    for binding in bindings {
        *shapes
            .entry((binding.http_method.clone(), binding.template.shape()))
            .or_default() += 1;
    }
    for binding in bindings {
        if shapes[&(binding.http_method.clone(), binding.template.shape())] == 1 {
            builder.binding(binding, &status);
        }
    }
    for method in methods {
        builder.at_its_path(method, &status);
    }
    if builder.operations > MAX_OPENAPI_OPERATIONS {
        return Err(format!(
            "the document would hold more than {MAX_OPENAPI_OPERATIONS} operations"
        ));
    }
    let paths: Map<String, Value> = builder
        .paths
        .into_iter()
        .map(|(path, operations)| (path, Value::Object(operations)))
        .collect();
    let schemas = builder.components.finish()?;
    let document = json!({
        "openapi": "3.1.0",
        "info": { "title": options.title, "version": crate::VERSION },
        "paths": paths,
        "components": { "schemas": schemas },
    });
    let text = document.to_string();
    if text.len() > MAX_OPENAPI_BYTES {
        return Err(format!(
            "the OpenAPI document would hold {} bytes, over the limit of {MAX_OPENAPI_BYTES}",
            text.len()
        ));
    }
    Ok(text.into_bytes())
}

struct Builder<'a> {
    /// Request fields all operations may still look at for query
    /// parameters ([`MAX_OPENAPI_QUERY_FIELDS_ALL`]).
    query_budget: usize,
    operations: usize,
    components: Components<'a>,
    /// `google.rpc.Status`'s schema.
    status: Value,
    options: &'a Options<'a>,
    paths: BTreeMap<String, Map<String, Value>>,
    ids: BTreeSet<String>,
}

impl Builder<'_> {
    fn binding(&mut self, binding: &Binding, status: &Value) {
        if self.operations > MAX_OPENAPI_OPERATIONS {
            return;
        }
        let (path, params) = binding.template.openapi_path();
        for verb in verbs(&binding.http_method) {
            if self
                .paths
                .get(&path)
                .is_some_and(|ops| ops.contains_key(verb))
            {
                // Bound twice alike: the filter binds the path to neither.
                continue;
            }
            self.operations += 1;
            let operation = self.operation(binding, &params, status);
            self.paths
                .entry(path.clone())
                .or_default()
                .insert(verb.to_string(), operation);
        }
    }

    /// `POST /pkg.Service/Method`, unless a binding took it.
    fn at_its_path(&mut self, method: &Method, status: &Value) {
        if self.operations > MAX_OPENAPI_OPERATIONS {
            return;
        }
        self.operations += 1;
        let path = method.path().to_string();
        if self
            .paths
            .get(&path)
            .is_some_and(|ops| ops.contains_key("post"))
        {
            return;
        }
        let input = self.components.message(&method.input());
        let body = match method.streaming() {
            StreamingKind::ClientStreaming | StreamingKind::Bidirectional => {
                json!({ "type": "array", "items": input })
            }
            _ => input,
        };
        let mut operation = self.common(method, status);
        operation["requestBody"] = json!({ "content": { "application/json": { "schema": body } } });
        operation["responses"]["200"] = self.response(method, None, "");
        self.paths
            .entry(path)
            .or_default()
            .insert("post".into(), operation);
    }

    fn operation(&mut self, binding: &Binding, params: &[PathParam], status: &Value) -> Value {
        let method = &binding.method;
        let mut operation = self.common(method, status);
        let input = method.input();
        let mut parameters: Vec<Value> =
            params.iter().map(|p| self.path_param(&input, p)).collect();
        if binding.body != "*" && binding.request_http_body.is_none() {
            let bound: Vec<Vec<String>> = params.iter().map(|p| p.field_path.clone()).collect();
            let allowed = MAX_OPENAPI_QUERY_FIELDS.min(self.query_budget);
            let mut query = Query {
                allowed,
                looked_at: 0,
                on_way: vec![input.full_name().to_string()],
                bound: &bound,
                body: &binding.body,
                out: &mut parameters,
            };
            query.walk(self, &input, &mut Vec::new(), &mut Vec::new());
            let (looked_at, allowed) = (query.looked_at, query.allowed);
            self.query_budget -= looked_at;
            if looked_at == allowed {
                operation["description"] = json!(format!(
                    "Query parameters past the first {allowed} fields of the request are left out."
                ));
            }
        }
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        if let Some(body) = self.request_body(binding) {
            operation["requestBody"] = body;
        }
        operation["responses"]["200"] = self.response(
            method,
            binding.response_http_body.map(|_| ()),
            &binding.response_body,
        );
        operation
    }

    /// What every operation of a method has: its id, tag, deprecation and
    /// error response.
    fn common(&mut self, method: &Method, status: &Value) -> Value {
        let base = format!(
            "{}_{}",
            method.service_name().replace('.', "_"),
            method.name()
        );
        let mut id = base.clone();
        let mut n = 1;
        while !self.ids.insert(id.clone()) {
            n += 1;
            id = format!("{base}_{n}");
        }
        let mut operation = json!({
            "operationId": id,
            "tags": [method.service_name()],
            "responses": {
                "default": {
                    "description": "The call failed: its gRPC status.",
                    "content": { "application/json": { "schema": status } },
                },
            },
        });
        let streams = matches!(
            method.streaming(),
            StreamingKind::ServerStreaming | StreamingKind::Bidirectional
        );
        if streams {
            // A stream that fails after messages: its status comes in the
            // stream, after them.
            if self.options.stream_format == StreamFormat::Array {
                let array = self.response(method, None, "")["content"]["application/json"]
                    ["schema"]
                    .clone();
                operation["responses"]["default"]["content"]["application/json"]["schema"] =
                    json!({ "anyOf": [status, array] });
            } else {
                let (media, _) = self.stream_media();
                operation["responses"]["default"]["content"][media] = json!({ "schema": {} });
            }
        }
        let options = method
            .descriptor()
            .method_descriptor_proto()
            .options
            .as_ref();
        if options.and_then(|o| o.deprecated) == Some(true) {
            operation["deprecated"] = json!(true);
        }
        operation
    }

    fn path_param(&mut self, input: &MessageDescriptor, param: &PathParam) -> Value {
        let field = fields_on(input, &param.field_path).and_then(|f| f.last().cloned());
        let schema = match field {
            Some(field) if param.whole => self.components.kind(&field.kind()),
            _ => json!({ "type": "string" }),
        };
        let field = param.field_path.join(".");
        let description = match (param.whole, param.rest, field.is_empty()) {
            (true, _, _) => format!("`{field}`"),
            (false, true, true) => "The rest of the path.".to_string(),
            (false, true, false) => format!("The rest of the path, in `{field}`."),
            (false, false, true) => "One segment of the path.".to_string(),
            (false, false, false) => format!("One segment of `{field}`."),
        };
        json!({
            "name": param.name,
            "in": "path",
            "required": true,
            "description": description,
            "schema": schema,
        })
    }

    fn request_body(&mut self, binding: &Binding) -> Option<Value> {
        if binding.request_http_body.is_some() {
            return Some(json!({ "content": { "*/*": { "schema": {} } } }));
        }
        let input = binding.method.input();
        let schema = match binding.body.as_str() {
            "" => return None,
            "*" => self.components.message(&input),
            path => {
                let fields = http_body::singular_path(&input, path)?;
                self.components.field(fields.last()?)
            }
        };
        let schema = match binding.method.streaming() {
            StreamingKind::ClientStreaming | StreamingKind::Bidirectional => {
                json!({ "type": "array", "items": schema })
            }
            _ => schema,
        };
        Some(json!({ "content": { "application/json": { "schema": schema } } }))
    }

    /// The 200 answer: the output (or its `response_body` field, or an
    /// HttpBody's raw bytes), one message or a stream of them.
    fn response(&mut self, method: &Method, raw: Option<()>, response_body: &str) -> Value {
        if raw.is_some() {
            return json!({
                "description": "The response's HttpBody, its own content type.",
                "content": { "*/*": { "schema": {} } },
            });
        }
        let output = method.output();
        let one = match response_body {
            "" => self.components.message(&output),
            path => match http_body::singular_path(&output, path).and_then(|f| f.last().cloned()) {
                Some(field) => self.components.field(&field),
                None => json!({}),
            },
        };
        let streams = matches!(
            method.streaming(),
            StreamingKind::ServerStreaming | StreamingKind::Bidirectional
        );
        if !streams {
            return json!({
                "description": "OK",
                "content": { "application/json": { "schema": one } },
            });
        }
        match self.options.stream_format {
            StreamFormat::Array => json!({
                "description": "The messages of the stream, as one JSON array; a stream that fails after messages ends it with `{\"error\": status}`.",
                "content": { "application/json": { "schema": {
                    "type": "array",
                    "items": { "anyOf": [one, self.stream_error()] },
                } } },
            }),
            StreamFormat::Ndjson | StreamFormat::Sse => {
                let (media, description) = self.stream_media();
                json!({
                    "description": description,
                    // OpenAPI 3.1 has no schema for the items of a
                    // stream: `x-itemSchema` is each document's (3.2's
                    // `itemSchema`).
                    "content": { media: { "schema": {}, "x-itemSchema": one } },
                })
            }
        }
    }

    /// A stream's media type as the filter sends it, and what it holds.
    fn stream_media(&self) -> (&'static str, &'static str) {
        match self.options.stream_format {
            StreamFormat::Sse => (
                "text/event-stream",
                "The messages of the stream as server-sent events, each `data:` one JSON document; a failure after messages is a last event with its `google.rpc.Status`.",
            ),
            _ => (
                NDJSON,
                "The messages of the stream, one JSON document a line, as they arrive; a failure after messages is a last line with its `google.rpc.Status`.",
            ),
        }
    }

    /// The last element of an array stream that failed after messages.
    fn stream_error(&mut self) -> Value {
        let status = self.status.clone();
        json!({ "type": "object", "properties": { "error": status }, "required": ["error"] })
    }
}

/// The OpenAPI operations of a binding's HTTP method: `*` takes the five
/// that carry bindings.
fn verbs(http_method: &str) -> Vec<&'static str> {
    match http_method {
        "GET" => vec!["get"],
        "PUT" => vec!["put"],
        "POST" => vec!["post"],
        "DELETE" => vec!["delete"],
        "PATCH" => vec!["patch"],
        "HEAD" => vec!["head"],
        "OPTIONS" => vec!["options"],
        "TRACE" => vec!["trace"],
        "*" => vec!["get", "put", "post", "delete", "patch"],
        _ => Vec::new(),
    }
}

/// The query parameters of an operation: the request's fields that the
/// path and the body leave, nested ones dotted.
struct Query<'q> {
    /// The messages entered, outermost first.
    on_way: Vec<String>,
    /// Fields looked at, bounded by [`MAX_OPENAPI_QUERY_FIELDS`]: a set
    /// of many wide messages each holding the next would otherwise make
    /// an operation of more parameters than memory holds.
    looked_at: usize,
    allowed: usize,
    bound: &'q [Vec<String>],
    body: &'q str,
    out: &'q mut Vec<Value>,
}

impl Query<'_> {
    fn walk(
        &mut self,
        builder: &mut Builder,
        message: &MessageDescriptor,
        names: &mut Vec<String>,
        proto_names: &mut Vec<String>,
    ) {
        if names.len() >= MAX_OPENAPI_QUERY_DEPTH {
            return;
        }
        for field in message.fields() {
            if self.looked_at == self.allowed {
                return;
            }
            self.looked_at += 1;
            proto_names.push(field.name().to_string());
            names.push(property_name(&field, builder.options.json));
            if !self.taken(proto_names) {
                self.field(builder, &field, names, proto_names);
            }
            names.pop();
            proto_names.pop();
        }
    }

    /// Bound in the path, or under the body.
    fn taken(&self, proto_names: &[String]) -> bool {
        let dotted = proto_names.join(".");
        self.bound.iter().any(|b| b.join(".") == dotted)
            || (!self.body.is_empty()
                && (dotted == self.body || dotted.starts_with(&format!("{}.", self.body))))
    }

    fn field(
        &mut self,
        builder: &mut Builder,
        field: &prost_reflect::FieldDescriptor,
        names: &mut Vec<String>,
        proto_names: &mut Vec<String>,
    ) {
        if field.is_map() {
            return;
        }
        let repeated = field.cardinality() == Cardinality::Repeated;
        if let Kind::Message(inner) = field.kind() {
            let scalar_like = is_scalar_like(&inner);
            if repeated && !scalar_like {
                return;
            }
            if !scalar_like {
                // A message already on the way is not entered again.
                let name = inner.full_name().to_string();
                if self.on_way.contains(&name) {
                    return;
                }
                self.on_way.push(name);
                self.walk(builder, &inner, names, proto_names);
                self.on_way.pop();
                return;
            }
        }
        let schema = match field.kind() {
            // What a query parameter may say: an enum's names, or numbers.
            Kind::Enum(e) => {
                let mut accepted: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
                accepted.extend(e.values().map(|v| v.number().to_string()));
                let one = json!({ "type": "string", "enum": accepted });
                if repeated {
                    json!({ "type": "array", "items": one })
                } else {
                    one
                }
            }
            _ => builder.components.field(field),
        };
        let mut parameter = json!({
            "name": names.join("."),
            "in": "query",
            // `?flag` and `?q=` are read, as empty text (a bool: true).
            "allowEmptyValue": true,
            "schema": schema,
        });
        if repeated {
            parameter["explode"] = json!(true);
        }
        self.out.push(parameter);
    }
}

/// Well-known types that a query parameter sets from one text.
fn is_scalar_like(message: &MessageDescriptor) -> bool {
    matches!(
        message.full_name(),
        "google.protobuf.Timestamp"
            | "google.protobuf.Duration"
            | "google.protobuf.FieldMask"
            | "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

#[cfg(all(test, feature = "compiler"))]
mod tests;
