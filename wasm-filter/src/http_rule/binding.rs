//! A method's bindings, built from its `google.api.http` option (its rule
//! and `additional_bindings`), each checked against the request message.

use prost_reflect::Value as Reflect;

use super::*;
use crate::descriptors::{Method, StreamingKind};
use crate::http_body::{self, At};
use crate::Registry;

/// The variables a matched path binds: each field path and its text.
pub type PathVars = Vec<(Vec<String>, String)>;

/// One HTTP binding of a method.
#[derive(Debug, Clone)]
pub struct Binding {
    pub http_method: String,
    pub template: Template,
    /// "" (no body), "*" (the whole request) or a field name.
    pub body: String,
    /// "" (the whole response) or a field name.
    pub response_body: String,
    pub method: Method,
    /// Where the request holds the HttpBody the HTTP body fills raw.
    pub request_http_body: Option<At>,
    /// Where the response holds the HttpBody that is the HTTP body.
    pub response_http_body: Option<At>,
}

impl Binding {
    /// Whether the binding takes requests of `http_method`: its own, or
    /// any (`custom { kind: "*" }`), as in Envoy.
    pub fn takes(&self, http_method: &str) -> bool {
        self.http_method == http_method || self.http_method == "*"
    }

    /// [`Template::spans`] for this binding. Envoy keys a binding by its
    /// HTTP method and verb together and falls back to the bare key `*`: a
    /// `*` binding matches whatever verb the request has, unless it names
    /// a verb itself, when it matches nothing.
    pub fn spans(&self, request: &RequestPath) -> Option<Vec<(usize, usize)>> {
        if self.http_method != "*" {
            return self.template.spans(request);
        }
        if self.template.verb().is_some() {
            return None;
        }
        self.template.spans_of(&request.parts)
    }

    /// Which of two bindings that match one request Envoy's path matcher
    /// chooses: by their templates (see [`Template::precedence`]), then an
    /// exact HTTP method before `*`. Equal: neither (Envoy answers a path
    /// bound twice as bound to nothing).
    pub fn precedence(&self, other: &Binding) -> std::cmp::Ordering {
        let any = |b: &Binding| b.http_method == "*";
        self.template
            .precedence(&other.template)
            .then(any(self).cmp(&any(other)))
    }
}

/// The bindings a method declares with `option (google.api.http)`, and
/// why each one it cannot use was left out: one bad binding must not take
/// the others down.
pub fn bindings_of(method: &Method) -> (Vec<Binding>, Vec<String>) {
    let (mut out, mut left_out) = (Vec::new(), Vec::new());
    let options = method.descriptor().options();
    let Some(ext) = http_rule_extension(method) else {
        return (out, left_out);
    };
    if !options.has_extension(&ext) {
        return (out, left_out);
    }
    if let Reflect::Message(rule) = options.get_extension(&ext).into_owned() {
        collect(method, &rule, &mut out, &mut left_out);
    }
    (out, left_out)
}

pub(super) fn http_rule_extension(method: &Method) -> Option<prost_reflect::ExtensionDescriptor> {
    let pool = method.descriptor().parent_pool().clone();
    pool.get_extension_by_name("google.api.http")
}

/// Whether the method declares `option (google.api.http)`, whatever its
/// bindings became: Envoy's `auto_mapping` maps only the methods that do
/// not.
pub fn declares_bindings(method: &Method) -> bool {
    http_rule_extension(method).is_some_and(|ext| method.descriptor().options().has_extension(&ext))
}

pub(super) fn collect(
    method: &Method,
    rule: &prost_reflect::DynamicMessage,
    out: &mut Vec<Binding>,
    left_out: &mut Vec<String>,
) {
    let text = |name: &str| {
        rule.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let pattern = ["get", "put", "post", "delete", "patch"]
        .into_iter()
        .find(|verb| rule.has_field_by_name(verb))
        .map(|verb| (verb.to_ascii_uppercase(), text(verb)))
        .or_else(|| {
            if !rule.has_field_by_name("custom") {
                return None;
            }
            let custom = rule.get_field_by_name("custom")?;
            let custom = custom.as_message()?;
            let field = |n: &str| {
                custom
                    .get_field_by_name(n)
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            };
            Some((field("kind"), field("path")))
        });
    if let Some((http_method, path)) = pattern {
        let binding = Template::parse(&path).and_then(|template| {
            let (body, response_body) = (text("body"), text("response_body"));
            // Raw bodies for unary and server-streaming methods: a client
            // stream's body is read as JSON messages.
            let raw = matches!(
                method.streaming(),
                StreamingKind::Unary | StreamingKind::ServerStreaming
            );
            let request_http_body = match body.as_str() {
                "" => None,
                selector => http_body::at(&method.input(), selector).filter(|_| raw),
            };
            let binding = Binding {
                http_method: http_method.clone(),
                template,
                response_http_body: http_body::at(&method.output(), &response_body).filter(|_| raw),
                request_http_body,
                body,
                response_body,
                method: method.clone(),
            };
            check_fields(&binding).map(|()| binding)
        });
        match binding {
            Ok(binding) => out.push(binding),
            Err(e) => left_out.push(format!("{} ({http_method} {path}): {e}", method.path())),
        }
    } else {
        left_out.push(format!(
            "{}: a google.api.http rule without a pattern (get, put, post, delete, patch or custom)",
            method.path()
        ));
    }
    if let Some(Reflect::List(more)) = rule
        .get_field_by_name("additional_bindings")
        .map(|v| v.into_owned())
    {
        for extra in more.iter().filter_map(Reflect::as_message) {
            collect(method, extra, out, left_out);
        }
    }
}

/// `body` names a field of the request and `response_body` one of the
/// response: a top-level one as http.proto says, or a dotted path through
/// singular message fields as Envoy's transcoder reads it (its own tests
/// bind `nested.content`). A name that is no such path would print `null`
/// for every answer.
pub(super) fn check_fields(binding: &Binding) -> Result<(), String> {
    let body = binding.body.as_str();
    if !matches!(body, "" | "*")
        && http_body::singular_path(&binding.method.input(), body).is_none()
    {
        return Err(format!(
            "body '{body}' names no field of {} (a field, or a dotted path through singular message fields, at most {} deep)",
            binding.method.input().full_name(),
            http_body::MAX_BODY_PATH
        ));
    }
    let response = binding.response_body.as_str();
    if !response.is_empty()
        && http_body::singular_path(&binding.method.output(), response).is_none()
    {
        return Err(format!(
            "response_body '{response}' names no field of {} (a field, or a dotted path through singular message fields, at most {} deep)",
            binding.method.output().full_name(),
            http_body::MAX_BODY_PATH
        ));
    }
    Ok(())
}

/// The bindings of the exposed methods, and the ones left out with why.
pub fn collect_bindings(
    registry: &Registry,
    services: Option<&[String]>,
) -> Result<(Vec<Binding>, Vec<String>), String> {
    let (mut out, mut left_out) = (Vec::new(), Vec::new());
    for service in registry.pool().services() {
        if services.is_some_and(|list| !list.iter().any(|s| s == service.full_name())) {
            continue;
        }
        for method in service.methods() {
            let method = registry
                .method(&format!("/{}/{}", service.full_name(), method.name()))
                .map_err(|e| e.to_string())?;
            let (bindings, bad) = bindings_of(&method);
            out.extend(bindings);
            left_out.extend(bad);
        }
    }
    left_out.extend(bound_twice(&out));
    Ok((out, left_out))
}

/// Bindings of one HTTP method and the same paths: Envoy's transcoder
/// answers such a path as bound to none of them (see `chosen_binding`), and
/// so does the filter; an operator is told at load time.
pub fn bound_twice(bindings: &[Binding]) -> Vec<String> {
    let mut first = std::collections::HashMap::new();
    let mut out = Vec::new();
    for binding in bindings {
        let shape = binding.template.shape();
        let key = (binding.http_method.as_str(), shape);
        match first.get(&key) {
            Some(earlier) => out.push(format!(
                "{} ({} {}): {} binds the same paths, and Envoy binds such a path to neither",
                binding.method.path(),
                key.0,
                key.1,
                earlier,
            )),
            None => {
                first.insert(key, binding.method.path());
            }
        }
    }
    out
}
