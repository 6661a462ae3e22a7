//! `google.api.http` bindings: path templates, and the request message
//! assembled from path variables, query parameters and the body.
//!
//! Template grammar (from google/api/http.proto's documentation):
//! `Template = "/" Segments [ ":" Verb ]`, `Segment = "*" | "**" | LITERAL |
//! Variable`, `Variable = "{" FieldPath [ "=" Segments ] "}"`.

use prost_reflect::{Kind, MessageDescriptor, Value as Reflect};
use serde_json::{Map, Value};

use super::http_body::{self, At};
use crate::descriptors::{Method, StreamingKind};
use crate::json::JsonOptions;
use crate::limits::{MAX_FIELD_PATH_BYTES, MAX_NESTING};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `*`: exactly one segment.
    Single,
    /// `**`: the rest of the path.
    Multi,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Variable {
    field_path: Vec<String>,
    /// Template segments [start, end) that the variable covers.
    start: usize,
    end: usize,
}

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
    variables: Vec<Variable>,
    verb: Option<String>,
}

impl Template {
    pub fn parse(text: &str) -> Result<Template, String> {
        let err = |why: &str| format!("invalid path template '{text}': {why}");
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| err("must start with '/'"))?;
        let (body, verb) = split_verb(rest);
        if verb == Some("") {
            return Err(err("a ':' must be followed by a verb"));
        }
        let mut template = Template {
            segments: Vec::new(),
            variables: Vec::new(),
            verb: verb.map(str::to_string),
        };
        // `/` alone (or `/:verb`) is the root: no segments.
        if body.is_empty() {
            return Ok(template);
        }
        let mut i = 0;
        let chars: Vec<char> = body.chars().collect();
        while i <= chars.len() {
            if chars.get(i) == Some(&'{') {
                let close = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or_else(|| err("unclosed '{'"))?
                    + i;
                let inner: String = chars[i + 1..close].iter().collect();
                template.variable(&inner).map_err(|e| err(&e))?;
                i = close + 1;
            } else {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '/')
                    .map_or(chars.len(), |p| p + i);
                let segment: String = chars[i..end].iter().collect();
                template
                    .segments
                    .push(literal_or_wildcard(&segment).map_err(|e| err(&e))?);
                i = end;
            }
            match chars.get(i) {
                Some('/') => i += 1,
                None => break,
                Some(c) => return Err(err(&format!("unexpected '{c}'"))),
            }
        }
        let multi = template.segments.iter().position(|s| *s == Segment::Multi);
        if multi.is_some_and(|m| m + 1 != template.segments.len()) {
            return Err(err("'**' must be the last segment"));
        }
        Ok(template)
    }

    fn variable(&mut self, inner: &str) -> Result<(), String> {
        let (path, pattern) = inner.split_once('=').unwrap_or((inner, "*"));
        if path.is_empty() || pattern.contains('{') {
            return Err("bad variable".into());
        }
        let start = self.segments.len();
        for segment in pattern.split('/') {
            self.segments.push(literal_or_wildcard(segment)?);
        }
        let field_path = path.split('.').map(str::to_string).collect();
        self.variables.push(Variable {
            field_path,
            start,
            end: self.segments.len(),
        });
        Ok(())
    }

    /// The custom verb the template ends with (`:move`), if any.
    pub fn verb(&self) -> Option<&str> {
        self.verb.as_deref()
    }

    /// The variable bindings when `path` (without the query) matches.
    pub fn matches(&self, path: &str) -> Option<PathVars> {
        self.matches_verb(path, true, UrlUnescape::default())
    }

    /// [`Template::matches`], where `verb` says whether a `:verb` ending
    /// the path is one (see [`RequestPath::parse`]). `unescape` says which
    /// escapes a variable of several segments keeps.
    pub fn matches_verb(&self, path: &str, verb: bool, unescape: UrlUnescape) -> Option<PathVars> {
        let request = RequestPath::parse(path, verb)?;
        let spans = self.spans(&request)?;
        self.bind(&request, &spans, unescape).ok()
    }

    /// For each template segment, the request segments it takes, when the
    /// template matches `request`. As in Envoy's path matcher, segments are
    /// compared raw (undecoded), `*` takes any one segment (an empty one of
    /// `//` too) and a final `**` the rest, none included.
    pub fn spans(&self, request: &RequestPath) -> Option<Vec<(usize, usize)>> {
        if request.verb != self.verb.as_deref() {
            return None;
        }
        self.spans_of(&request.parts)
    }

    /// [`Template::spans`] for the request's segments alone, its verb aside.
    fn spans_of(&self, parts: &[&str]) -> Option<Vec<(usize, usize)>> {
        let mut spans = Vec::with_capacity(self.segments.len());
        let mut at = 0;
        for segment in &self.segments {
            match segment {
                Segment::Literal(l) if parts.get(at) == Some(&l.as_str()) => {
                    spans.push((at, at + 1));
                    at += 1;
                }
                Segment::Single if at < parts.len() => {
                    spans.push((at, at + 1));
                    at += 1;
                }
                Segment::Multi => {
                    spans.push((at, parts.len()));
                    at = parts.len();
                }
                _ => return None,
            }
        }
        (at == parts.len()).then_some(spans)
    }

    /// The variables' values in a request that [`Template::spans`] matched.
    /// A variable whose escapes decode to bytes that are not UTF-8 is
    /// refused, naming it.
    pub fn bind(
        &self,
        request: &RequestPath,
        spans: &[(usize, usize)],
        unescape: UrlUnescape,
    ) -> Result<PathVars, String> {
        let bindings = self.variables.iter().map(|v| {
            let (from, to) = (spans[v.start].0, spans[v.end - 1].1);
            // One segment is unescaped whole, as http.proto and Envoy do;
            // a `**` is several even where it takes one (Envoy's rule).
            let several = to - from > 1
                || self.segments[v.start..v.end]
                    .iter()
                    .any(|s| matches!(s, Segment::Multi));
            let unescape = if several {
                unescape
            } else {
                UrlUnescape::AllCharacters
            };
            let value = request.parts[from..to]
                .iter()
                .map(|p| percent_decode_value(p, unescape))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    format!(
                        "path variable '{}': its escapes decode to bytes that are not UTF-8",
                        v.field_path.join(".")
                    )
                })?
                .join("/");
            Ok((v.field_path.clone(), value))
        });
        bindings.collect()
    }

    /// The template with its variables as the segments they match
    /// (`/v1/users/*`): two templates of one shape match the same paths.
    pub fn shape(&self) -> String {
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            out.push_str(match segment {
                Segment::Literal(l) => l,
                Segment::Single => "*",
                Segment::Multi => "**",
            });
        }
        if out.is_empty() {
            out.push('/');
        }
        if let Some(verb) = &self.verb {
            out.push(':');
            out.push_str(verb);
        }
        out
    }

    /// How Envoy's path matcher orders templates that match one path: it
    /// walks a tree of segments trying a literal before `*` and `*` before
    /// `**`, and backtracks, so the template whose segment kinds come
    /// first, segment by segment, wins; one that ends where another goes
    /// on (with a `**` taking nothing) comes first. Where two are equal,
    /// they are the same path in that tree.
    pub fn precedence(&self, other: &Template) -> std::cmp::Ordering {
        let rank = |s: &Segment| match s {
            Segment::Literal(_) => 0,
            Segment::Single => 1,
            Segment::Multi => 2,
        };
        let mine = self.segments.iter().map(rank);
        mine.cmp(other.segments.iter().map(rank))
    }
}

/// A request path as Envoy's path matcher splits it: its segments, and its
/// custom verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    parts: Vec<&'a str>,
    verb: Option<&'a str>,
}

impl<'a> RequestPath<'a> {
    /// `path` without its query. `verb` says whether a `:verb` ending the
    /// path is one: a verb that no binding registers is path text, as in
    /// Envoy (`/v1/{name}` takes `/v1/a:b` whole). Trailing `/`s are
    /// dropped (`/v1/shelves/` is `/v1/shelves`), as Envoy drops them.
    pub fn parse(path: &'a str, verb: bool) -> Option<RequestPath<'a>> {
        let rest = path.strip_prefix('/')?;
        let (body, verb) = if verb { split_verb(rest) } else { (rest, None) };
        let body = body.trim_end_matches('/');
        let parts = if body.is_empty() {
            Vec::new()
        } else {
            body.split('/').collect()
        };
        Some(RequestPath { parts, verb })
    }
}

/// The `:verb` a request path ends with, if any.
pub fn path_verb(path: &str) -> Option<&str> {
    split_verb(path.strip_prefix('/')?).1
}

/// The verb is what follows the last ':' of the last segment.
fn split_verb(path: &str) -> (&str, Option<&str>) {
    let last = path.rfind('/').map_or(0, |i| i + 1);
    match path[last..].rfind(':') {
        Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
        None => (path, None),
    }
}

fn literal_or_wildcard(segment: &str) -> Result<Segment, String> {
    match segment {
        "*" => Ok(Segment::Single),
        "**" => Ok(Segment::Multi),
        "" => Err("empty segment".into()),
        s if s.contains(['{', '}', '*']) => Err(format!("bad segment '{s}'")),
        s => Ok(Segment::Literal(s.to_string())),
    }
}

/// Which `%XX` escapes of a variable of several segments stay as they
/// are: Envoy's `url_unescape_spec`, and its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UrlUnescape {
    /// The reserved characters of RFC 6570 (`!#$&'()*+,/:;=?@[]`) stay
    /// escaped.
    #[default]
    AllCharactersExceptReserved,
    /// Only `%2F` stays, as http.proto describes.
    AllCharactersExceptSlash,
    AllCharacters,
}

impl UrlUnescape {
    fn keeps(self, byte: u8) -> bool {
        match self {
            UrlUnescape::AllCharactersExceptReserved => b"!#$&'()*+,/:;=?@[]".contains(&byte),
            UrlUnescape::AllCharactersExceptSlash => byte == b'/',
            UrlUnescape::AllCharacters => false,
        }
    }
}

/// Whether `raw` (a path as the client sent it, with its query) is what
/// a host that decodes paths shows as `decoded`: the same path, nothing
/// rewritten in between, so that its escapes can be trusted.
/// Segment by segment: a `%2F` that nginx decoded into two segments (and
/// routed as two) must not become one here.
pub fn is_raw_form_of(raw: &str, decoded_path: &[u8], decoded_query: &str) -> bool {
    let (raw_path, raw_query) = raw.split_once('?').unwrap_or((raw, ""));
    raw_query == decoded_query
        && raw_path
            .split('/')
            .map(|segment| percent_decode_bytes(segment, UrlUnescape::AllCharacters))
            .eq(decoded_path.split(|&b| b == b'/').map(<[u8]>::to_vec))
}

/// A decoded path written back as one the bindings read the same way:
/// `%` and `?` escaped again, so that nothing is decoded twice and a `?`
/// nginx decoded does not start a query; a path that is not UTF-8 has its
/// other bytes escaped too, so that a variable holding them is refused by
/// name rather than the whole path lost.
pub fn escaped_again(decoded_path: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(decoded_path) {
        return text.replace('%', "%25").replace('?', "%3F");
    }
    let mut out = String::with_capacity(decoded_path.len() + 8);
    for &byte in decoded_path {
        if byte.is_ascii() && byte != b'%' && byte != b'?' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `%XX` escapes, but those `unescape` keeps; text that is not UTF-8
/// once decoded as U+FFFD, for looking names up.
fn percent_decode(text: &str, unescape: UrlUnescape) -> String {
    String::from_utf8_lossy(&percent_decode_bytes(text, unescape)).into_owned()
}

/// [`percent_decode`] for a value: `None` when the escapes decode to
/// bytes that are not UTF-8, which no JSON value and no string field can
/// carry (Envoy's transcoder passes them on, for the upstream to refuse
/// the message; a U+FFFD would change the value unseen).
fn percent_decode_value(text: &str, unescape: UrlUnescape) -> Option<String> {
    String::from_utf8(percent_decode_bytes(text, unescape)).ok()
}

fn percent_decode_bytes(text: &str, unescape: UrlUnescape) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            // Two hex digits, as Envoy reads them (`from_str_radix` alone
            // would take `%+1`).
            let digits = &b[i + 1..i + 3];
            let hex = digits
                .iter()
                .all(u8::is_ascii_hexdigit)
                .then(|| std::str::from_utf8(digits).ok())
                .flatten()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(byte) = hex {
                if !unescape.keeps(byte) {
                    out.push(byte);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

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
        if self.template.verb.is_some() {
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

fn http_rule_extension(method: &Method) -> Option<prost_reflect::ExtensionDescriptor> {
    let pool = method.descriptor().parent_pool().clone();
    pool.get_extension_by_name("google.api.http")
}

/// Whether the method declares `option (google.api.http)`, whatever its
/// bindings became: Envoy's `auto_mapping` maps only the methods that do
/// not.
pub fn declares_bindings(method: &Method) -> bool {
    http_rule_extension(method).is_some_and(|ext| method.descriptor().options().has_extension(&ext))
}

fn collect(
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
fn check_fields(binding: &Binding) -> Result<(), String> {
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

/// The request message as protobuf: the body (the whole message, or the
/// body field), then what the request line gives (the path variables and
/// the query parameters) as a second encoding of the message. A parser
/// merges the two field by field, so the request line wins where both set
/// a field; the query goes around the body so that the body wins over it,
/// as in Envoy (see [`line_parts`]). The body is never held as anything but its JSON and its
/// protobuf.
pub fn request_message(
    binding: &Binding,
    vars: PathVars,
    query: &str,
    body: (&[u8], Option<&str>),
    options: &JsonOptions,
) -> Result<Vec<u8>, String> {
    let body = body_message(binding, body, options)?;
    let (mut message, after) = line_parts(binding, vars, query, options)?;
    message.extend_from_slice(&body);
    message.extend_from_slice(&after);
    Ok(message)
}

/// What the request line gives, as the encodings that go before and after
/// the body's (a client stream puts them around each of its messages). As
/// in Envoy's transcoder, the body wins over the query: a query parameter
/// sets what the body leaves unset, and a list gets the body's items, then
/// the query's. The query counts beside a `*` body too, where http.proto
/// leaves it no field (Envoy reads it; dropping it would answer a request
/// other than the one sent). The path goes last, so it wins over both
/// (unlike Envoy: what a rule checked on the path is what the upstream
/// gets; the query may not set what the path binds).
pub fn line_parts(
    binding: &Binding,
    vars: PathVars,
    query: &str,
    options: &JsonOptions,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut after = Value::Object(Map::new());
    // No body to go around: one message, its fields in number order.
    if binding.body.is_empty() {
        fill_from_request_line(binding, vars, query, &mut after, None)?;
        return Ok((Vec::new(), line_message(binding, &after, options)?));
    }
    let mut before = Value::Object(Map::new());
    fill_from_request_line(binding, vars, query, &mut after, Some(&mut before))?;
    Ok((
        line_message(binding, &before, options)?,
        line_message(binding, &after, options)?,
    ))
}

/// The body's part of [`request_message`] (`body`: its bytes and
/// Content-Type).
pub fn body_message(
    binding: &Binding,
    body: (&[u8], Option<&str>),
    options: &JsonOptions,
) -> Result<Vec<u8>, String> {
    let (body, content_type) = body;
    let input = binding.method.input_type();
    let empty = body.iter().all(u8::is_ascii_whitespace);
    match (binding.request_http_body, binding.body.as_str()) {
        // Raw, whatever it holds.
        (Some(at), _) => Ok(http_body::encode(
            at,
            content_type.unwrap_or_default(),
            body,
        )),
        (None, "") => Ok(Vec::new()),
        // As Envoy reads it: an empty body still sets a message field
        // (present, empty), which the upstream can tell from no field.
        (None, field)
            if empty && field != "*" && is_message_field(&binding.method.input(), field) =>
        {
            field_json_to_protobuf(binding, field, b"{}", options)
        }
        (None, _) if empty => Ok(Vec::new()),
        (None, "*") => input
            .json_to_protobuf(body, options)
            .map_err(|e| e.to_string()),
        (None, field) => field_json_to_protobuf(binding, field, body, options),
    }
}

/// The body's JSON as the field `body` names, within the request message:
/// a dotted path's last field encoded in its own message, then wrapped in
/// each message field that leads to it.
fn field_json_to_protobuf(
    binding: &Binding,
    field: &str,
    json: &[u8],
    options: &JsonOptions,
) -> Result<Vec<u8>, String> {
    let input = binding.method.input_type();
    let Some((parents, last)) = field.rsplit_once('.') else {
        return input
            .field_json_to_protobuf(field, json, options)
            .map_err(|e| e.to_string());
    };
    let path = http_body::singular_path(input.descriptor(), field)
        .ok_or_else(|| format!("body '{field}' names no field"))?;
    let parent = path
        .iter()
        .rev()
        .nth(1)
        .and_then(|f| f.kind().as_message().cloned())
        .ok_or_else(|| format!("body '{parents}' is no message"))?;
    let inner = crate::json::MessageType::new(parent)
        .field_json_to_protobuf(last, json, options)
        .map_err(|e| e.to_string())?;
    let numbers: Vec<u32> = path.iter().map(|f| f.number()).collect();
    Ok(http_body::wrap(&numbers, inner))
}

/// What the request line gives to one side of the body, as protobuf.
fn line_message(binding: &Binding, line: &Value, options: &JsonOptions) -> Result<Vec<u8>, String> {
    if line.as_object().is_none_or(|fields| fields.is_empty()) {
        return Ok(Vec::new());
    }
    let json = serde_json::to_vec(line).map_err(|e| e.to_string())?;
    // Defaults included: a path's 0 must replace the body's 42.
    binding
        .method
        .input_type()
        .json_to_protobuf_explicit(&json, options)
        .map_err(|e| e.to_string())
}

/// Checks what the request line gives (path variables, query parameters)
/// before any body comes: a request refused for them then never reaches
/// the upstream, which a proxy starts once the headers pass.
pub fn check_request_line(binding: &Binding, vars: PathVars, query: &str) -> Result<(), String> {
    fill_from_request_line(binding, vars, query, &mut Value::Object(Map::new()), None)
}

/// A body field (by its name or JSON name, or a dotted path) of message type.
fn is_message_field(input: &MessageDescriptor, name: &str) -> bool {
    http_body::singular_path(input, name)
        .and_then(|path| path.last().cloned())
        .is_some_and(|f| !f.is_list() && !f.is_map() && matches!(f.kind(), Kind::Message(_)))
}

/// Sets the path variables, then the query parameters, typed by the input
/// message's fields, into `after`; with `before` (a binding with a body,
/// see [`line_parts`]), a query parameter's singular field goes there.
fn fill_from_request_line(
    binding: &Binding,
    vars: PathVars,
    query: &str,
    after: &mut Value,
    mut before: Option<&mut Value>,
) -> Result<(), String> {
    let input = binding.method.input();
    let mut bound = Vec::with_capacity(vars.len());
    for (path, value) in vars {
        // The path's fields, looked up once for the value's type and the
        // numbers (each look-up clones descriptors).
        let fields = fields_on(&input, &path);
        let typed = typed_scalar(&input, &path, fields.as_deref(), value)?;
        bound.push(numbers_of(fields.as_deref()));
        set(after, &path, typed);
    }
    for (key, value) in query_pairs(query)? {
        let path = resolve_query_path(&input, query_field_path(key)?);
        let fields = fields_on(&input, &path);
        let typed = typed_scalar(&input, &path, fields.as_deref(), value)?;
        // Envoy lets the query replace what the path bound; a rule that
        // checked the path (RBAC, a route) would then not have checked
        // what the upstream gets.
        let numbers = numbers_of(fields.as_deref());
        if bound
            .iter()
            .any(|b| b.starts_with(&numbers) || numbers.starts_with(b))
        {
            return Err(format!(
                "query parameter '{key}' sets {}, which the path binds",
                path.join(".")
            ));
        }
        let list = fields
            .as_deref()
            .and_then(<[_]>::last)
            .is_some_and(|f| f.is_list());
        match before.as_deref_mut() {
            _ if list => push(after, &path, typed),
            Some(before) => set(before, &path, typed),
            None => set(after, &path, typed),
        }
    }
    Ok(())
}

/// The part of a printed response that `response_body` selects (a field,
/// or a dotted path of them), or the field's default where the printer
/// left it out.
pub fn response_part(binding: &Binding, printed: &str) -> String {
    if binding.response_body.is_empty() {
        return printed.to_string();
    }
    let output = binding.method.output();
    let Some(path) = http_body::singular_path(&output, &binding.response_body) else {
        return printed.to_string();
    };
    let Ok(mut value) = serde_json::from_str::<Value>(printed) else {
        return printed.to_string();
    };
    let Some(selected) = path.last() else {
        return printed.to_string();
    };
    for field in &path {
        let Value::Object(mut fields) = value else {
            return default_of(selected);
        };
        let found = [field.json_name(), field.name()]
            .into_iter()
            .find_map(|n| fields.remove(n));
        match found {
            Some(inner) => value = inner,
            None => return default_of(selected),
        }
    }
    value.to_string()
}

fn default_of(field: &prost_reflect::FieldDescriptor) -> String {
    if field.is_list() {
        "[]".into()
    } else if field.is_map() || matches!(field.kind(), Kind::Message(_)) {
        "{}".into()
    } else {
        "null".into()
    }
}

/// The fields a dotted path goes through (each segment a field's name or
/// JSON name), the last one the field it names.
fn fields_on(
    input: &MessageDescriptor,
    path: &[String],
) -> Option<Vec<prost_reflect::FieldDescriptor>> {
    let mut desc = input.clone();
    let mut fields = Vec::with_capacity(path.len());
    for (i, name) in path.iter().enumerate() {
        let field = desc
            .get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))?;
        if i + 1 < path.len() {
            let Kind::Message(inner) = field.kind() else {
                return None;
            };
            desc = inner;
        }
        fields.push(field);
    }
    Some(fields)
}

/// The field numbers along a path (its fields, `fields_on`), to compare
/// paths spelled by proto or JSON names.
fn numbers_of(fields: Option<&[prost_reflect::FieldDescriptor]>) -> Vec<u32> {
    fields
        .unwrap_or_default()
        .iter()
        .map(|f| f.number())
        .collect()
}

/// Text from a path or query string, as the JSON value its field takes.
fn typed_scalar(
    input: &MessageDescriptor,
    path: &[String],
    fields: Option<&[prost_reflect::FieldDescriptor]>,
    text: String,
) -> Result<Value, String> {
    let Some(field) = fields.and_then(<[_]>::last) else {
        return Err(format!(
            "{}: no such field in {}",
            path.join("."),
            input.full_name()
        ));
    };
    Ok(match field.kind() {
        Kind::Bool => match text.as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => {
                return Err(format!(
                    "{}: expected true or false, got '{text}'",
                    path.join(".")
                ))
            }
        },
        Kind::Enum(_)
            if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') && !text.is_empty() =>
        {
            text.parse::<i64>()
                .map(Value::from)
                .unwrap_or(Value::String(text))
        }
        _ => Value::String(text),
    })
}

fn slot<'a>(root: &'a mut Value, path: &[String]) -> &'a mut Value {
    let mut at = root;
    for name in path {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        at = match at {
            Value::Object(map) => map.entry(name.clone()).or_insert(Value::Null),
            // Made an object just above.
            other => other,
        };
    }
    at
}

fn set(root: &mut Value, path: &[String], value: Value) {
    *slot(root, path) = value;
}

fn push(root: &mut Value, path: &[String], value: Value) {
    let target = slot(root, path);
    match target {
        Value::Array(items) => items.push(value),
        _ => *target = Value::Array(vec![value]),
    }
}

/// A query parameter's field path, bounded before anything is built from
/// it: each segment becomes a level of nested JSON, and a self-recursive
/// message accepts a path of any depth.
fn query_field_path(key: &str) -> Result<Vec<String>, String> {
    let too_long = if key.len() > MAX_FIELD_PATH_BYTES {
        format!("longer than {MAX_FIELD_PATH_BYTES} bytes")
    } else if key.split('.').count() > MAX_NESTING {
        format!("deeper than {MAX_NESTING} fields")
    } else {
        return Ok(key.split('.').map(str::to_string).collect());
    };
    let shown: String = key.chars().take(40).collect();
    Err(format!(
        "query parameter '{shown}...': field path {too_long}"
    ))
}

/// Each query parameter's name as sent, and its value percent-decoded. A
/// parameter with no `=` or no name sets nothing, as in Envoy (`?tags`
/// is not `tags=""`).
fn query_pairs(query: &str) -> Result<Vec<(&str, String)>, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').filter(|(k, _)| !k.is_empty()))
        .map(|(k, v)| {
            let value = percent_decode_value(v, UrlUnescape::AllCharacters).ok_or_else(|| {
                let shown: String = k.chars().take(40).collect();
                format!("query parameter '{shown}': its value's escapes decode to bytes that are not UTF-8")
            })?;
            Ok((k, value))
        })
        .collect()
}

/// The fields a query parameter's segments name, as Envoy resolves them:
/// each segment (split at `.` as sent, so a `%2E` splits nothing) names a
/// field by its name or JSON name as sent, else percent-decoded
/// (`search%5Bencoded%5D` is a JSON name written so, `search%5Bdecoded%5D`
/// one written `search[decoded]`). A segment that names no field stays
/// decoded, for the error that names it.
fn resolve_query_path(input: &MessageDescriptor, raw: Vec<String>) -> Vec<String> {
    let named = |desc: &MessageDescriptor, name: &str| {
        desc.get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))
    };
    let mut desc = Some(input.clone());
    let mut path = Vec::with_capacity(raw.len());
    for segment in raw {
        let decoded = percent_decode(&segment, UrlUnescape::AllCharacters);
        let found = desc.as_ref().and_then(|d| {
            let as_sent = named(d, &segment).map(|f| (segment.clone(), f));
            as_sent.or_else(|| named(d, &decoded).map(|f| (decoded.clone(), f)))
        });
        let Some((name, field)) = found else {
            desc = None;
            path.push(decoded);
            continue;
        };
        desc = match field.kind() {
            Kind::Message(inner) => Some(inner),
            _ => None,
        };
        path.push(name);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    fn library() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "library.proto",
            include_str!("../../../protos/library.proto"),
        )])
        .unwrap();
        r
    }

    fn binding(r: &Registry, method: &str, index: usize) -> Binding {
        let m = r
            .method(&format!("/example.library.v1.Library/{method}"))
            .unwrap();
        bindings_of(&m).0.remove(index)
    }

    #[test]
    fn the_root_template_matches_the_root_only() {
        let t = Template::parse("/").unwrap();
        assert_eq!(t.matches("/"), Some(vec![]));
        assert_eq!(t.matches("/a"), None);
        assert_eq!(t.matches(""), None);
    }

    #[test]
    fn a_binding_the_filter_cannot_use_is_left_out_alone() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "b.proto",
            r#"syntax = "proto3";
package b;
import "google/api/annotations.proto";
message Inner { string content = 1; }
message Reply { Inner nested = 1; string text = 2; }
message Ask { string id = 1; }
service S {
  rpc Root(Ask) returns (Reply) {
    option (google.api.http) = {
      get: "/"
      additional_bindings { get: "/v1/{id}" response_body: "nested.text" }
      additional_bindings { post: "/v1/{id}" body: "missing" }
      additional_bindings { get: "/v1/bad{" }
      additional_bindings { get: "/v1/{id}/text" response_body: "text" }
    };
  }
}"#,
        )])
        .unwrap();
        let (kept, left_out) = bindings_of(&r.method("/b.S/Root").unwrap());
        let kept: Vec<(String, Option<PathVars>)> = kept
            .iter()
            .map(|b| (b.http_method.clone(), b.template.matches("/")))
            .collect();
        assert_eq!(
            kept,
            vec![("GET".to_string(), Some(vec![])), ("GET".to_string(), None)]
        );
        assert_eq!(
            left_out,
            vec![
                "/b.S/Root (GET /v1/{id}): response_body 'nested.text' names no field of b.Reply (a field, or a dotted path through singular message fields, at most 8 deep)",
                "/b.S/Root (POST /v1/{id}): body 'missing' names no field of b.Ask (a field, or a dotted path through singular message fields, at most 8 deep)",
                "/b.S/Root (GET /v1/bad{): invalid path template '/v1/bad{': bad segment 'bad{'",
            ]
        );
    }

    #[test]
    fn templates_match_and_bind() {
        let t = Template::parse("/v1/{name=shelves/*/books/*}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/1/books/2"),
            Some(vec![(
                vec!["name".to_string()],
                "shelves/1/books/2".to_string()
            )])
        );
        assert_eq!(t.matches("/v1/shelves/1/books"), None);
        let t = Template::parse("/v1/shelves/{shelf}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/a%20b"),
            Some(vec![(vec!["shelf".to_string()], "a b".to_string())])
        );
        let t = Template::parse("/v1/search/{query=**}").unwrap();
        assert_eq!(
            t.matches("/v1/search/a/b%2Fc"),
            Some(vec![(vec!["query".to_string()], "a/b%2Fc".to_string())])
        );
        // Envoy's url_unescape_spec, for several segments only.
        let query = |path: &str, spec| t.matches_verb(path, true, spec).unwrap()[0].1.clone();
        let path = "/v1/search/x/a%3Ab%2Fc%20d%5B";
        assert_eq!(
            query(path, UrlUnescape::AllCharactersExceptReserved),
            "x/a%3Ab%2Fc d%5B"
        );
        assert_eq!(
            query(path, UrlUnescape::AllCharactersExceptSlash),
            "x/a:b%2Fc d["
        );
        assert_eq!(query(path, UrlUnescape::AllCharacters), "x/a:b/c d[");
        // A `**` that takes one segment is still several.
        assert_eq!(
            query("/v1/search/a%3Ab", UrlUnescape::AllCharactersExceptReserved),
            "a%3Ab"
        );
        assert!(is_raw_form_of("/v1/a%3Ab?x=%3A", b"/v1/a:b", "x=%3A"));
        assert!(!is_raw_form_of("/v1/a%3Ab", b"/v2/a:b", ""), "rewritten");
        assert!(!is_raw_form_of("/v1//a", b"/v1/a", ""), "merged slashes");
        assert!(is_raw_form_of("/v1/a%FFb", b"/v1/a\xffb", ""), "not UTF-8");
        assert_eq!(escaped_again(b"/v1/a\xff%b?"), "/v1/a%FF%25b%3F");
        assert_eq!(escaped_again("/v1/\u{e9}?".as_bytes()), "/v1/\u{e9}%3F");
        assert!(
            !is_raw_form_of("/v1/a%2Fb", b"/v1/a/b", ""),
            "a segment split"
        );
        assert!(is_raw_form_of("/v1/a%3F", b"/v1/a?", ""), "a ? of the path");
        assert_eq!(escaped_again(b"/v1/a?%41"), "/v1/a%3F%2541");
        assert_eq!(
            percent_decode("%+1%4g%41", UrlUnescape::AllCharacters),
            "%+1%4gA"
        );
        // Escapes that decode to no UTF-8 are refused, never replaced.
        let one = Template::parse("/v1/{name}").unwrap();
        let request = RequestPath::parse("/v1/a%FFb", true).unwrap();
        let spans = one.spans(&request).unwrap();
        assert_eq!(
            one.bind(&request, &spans, UrlUnescape::AllCharacters)
                .unwrap_err(),
            "path variable 'name': its escapes decode to bytes that are not UTF-8"
        );
        assert_eq!(
            one.matches("/v1/%C3%A9%EF%BF%BD").unwrap()[0].1,
            "\u{e9}\u{fffd}"
        );
        // No `=` or no name: nothing, as in Envoy.
        assert_eq!(
            query_pairs("tags&exact&=x&a=1&b=&").unwrap(),
            [("a", "1".to_string()), ("b", String::new())]
        );
        assert_eq!(
            query_pairs("a=1&b=%FF").unwrap_err(),
            "query parameter 'b': its value's escapes decode to bytes that are not UTF-8"
        );
        let name = one.matches_verb(
            "/v1/a%3Ab%2Fc",
            true,
            UrlUnescape::AllCharactersExceptReserved,
        );
        assert_eq!(name.unwrap()[0].1, "a:b/c");
        let t = Template::parse("/v1/{name=shelves/*/books/*}:move").unwrap();
        assert!(t.matches("/v1/shelves/1/books/2:move").is_some());
        assert!(t.matches("/v1/shelves/1/books/2").is_none());
        let t = Template::parse("/v1/{book.name=shelves/*/books/*}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/3/books/4").unwrap()[0].0,
            vec!["book".to_string(), "name".to_string()]
        );
        assert!(Template::parse("v1/x").is_err());
        assert!(Template::parse("/v1/**/x").is_err());
        assert!(Template::parse("/v1/{x").is_err());
        // As in Envoy: a ':' with no verb after it.
        assert_eq!(
            Template::parse("/v1/x:").unwrap_err(),
            "invalid path template '/v1/x:': a ':' must be followed by a verb"
        );
    }

    #[test]
    fn bindings_come_from_the_annotations() {
        let r = library();
        let list = bindings_of(&r.method("/example.library.v1.Library/ListBooks").unwrap()).0;
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].http_method.as_str(), list[1].http_method.as_str()),
            ("GET", "GET")
        );
        let head = binding(&r, "HeadShelf", 0);
        assert_eq!(head.http_method, "HEAD");
        assert_eq!(binding(&r, "SearchBooks", 0).response_body, "books");
        assert_eq!(binding(&r, "CreateBook", 0).body, "book");
    }

    #[test]
    fn query_field_paths_are_bounded_before_use() {
        assert_eq!(
            query_field_path("page.size"),
            Ok(vec!["page".to_string(), "size".to_string()])
        );
        let deep = vec!["a"; MAX_NESTING + 1].join(".");
        assert_eq!(
            query_field_path(&deep),
            Err(format!(
                "query parameter '{}...': field path deeper than 100 fields",
                &deep[..40]
            ))
        );
        let long = "x".repeat(MAX_FIELD_PATH_BYTES + 1);
        assert_eq!(
            query_field_path(&long),
            Err(format!(
                "query parameter '{}...': field path longer than 1024 bytes",
                "x".repeat(40)
            ))
        );
        assert!(query_field_path(&vec!["a"; MAX_NESTING].join(".")).is_ok());
    }

    #[test]
    fn query_names_name_fields_as_sent_then_decoded() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "q.proto",
            r#"syntax = "proto3";
package q;
import "google/api/annotations.proto";
message Shelf {
  string search_decoded = 1 [json_name = "search[decoded]"];
  string search_encoded = 2 [json_name = "search%5Bencoded%5D"];
}
message Find { Shelf shelf = 1; string theme = 2; }
service S { rpc Go(Find) returns (Find) { option (google.api.http) = { post: "/shelf" body: "*" }; } }"#,
        )])
        .unwrap();
        let b = bindings_of(&r.method("/q.S/Go").unwrap()).0.remove(0);
        let found = |query: &str| request(&b, "/shelf", query, b"");
        // Envoy's QueryParamsDecodedName: a name decoded, or as sent.
        for query in ["shelf.search%5Bdecoded%5D=G", "shelf.search[decoded]=G"] {
            assert_eq!(
                found(query).unwrap(),
                r#"{"shelf":{"search[decoded]":"G"}}"#,
                "{query}"
            );
        }
        assert_eq!(
            found("shelf.search%5Bencoded%5D=G").unwrap(),
            r#"{"shelf":{"search%5Bencoded%5D":"G"}}"#
        );
        assert!(found("shelf.search[encoded]=G").is_err());
        // A name is split at its dots as sent: %2E splits nothing.
        assert!(found("shelf%2Esearch_decoded=G").is_err());
        assert_eq!(found("th%65me=x").unwrap(), r#"{"theme":"x"}"#);
    }

    /// The request message `request_message` builds, printed as JSON.
    fn request(binding: &Binding, path: &str, query: &str, body: &[u8]) -> Result<String, String> {
        let vars = binding.template.matches(path).unwrap();
        let options = JsonOptions::default();
        let bytes = request_message(binding, vars, query, (body, None), &options)?;
        Ok(binding
            .method
            .input_type()
            .protobuf_to_json(&bytes, &options)
            .unwrap())
    }

    #[test]
    fn request_message_from_path_query_and_body() {
        let r = library();
        let create = binding(&r, "CreateBook", 0);
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", br#"{"title":"T"}"#).unwrap(),
            r#"{"shelf":"7","book":{"title":"T"}}"#
        );
        // The query may not replace what the path bound, by either name.
        for query in ["shelf=8", "shelf=7"] {
            assert_eq!(
                request(&create, "/v1/shelves/7/books", query, b"").unwrap_err(),
                "query parameter 'shelf' sets shelf, which the path binds"
            );
        }
        // An empty body still sets a message body field, as Envoy reads it.
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", b"").unwrap(),
            r#"{"shelf":"7","book":{}}"#
        );
        // Where the body is the whole message, the query still counts (Envoy
        // reads it too): it sets what the body leaves unset, and the body
        // wins where both set a field, as in Envoy.
        let shelf = binding(&r, "CreateShelf", 0);
        assert_eq!(
            request(
                &shelf,
                "/v1/shelves",
                "theme=line",
                br#"{"theme":"body","id":"3"}"#
            )
            .unwrap(),
            r#"{"id":"3","theme":"body"}"#
        );
        assert_eq!(
            request(&shelf, "/v1/shelves", "theme=line", br#"{"id":"3"}"#).unwrap(),
            r#"{"id":"3","theme":"line"}"#
        );
        let list = binding(&r, "ListBooks", 0);
        assert_eq!(
            request(
                &list,
                "/v1/shelves/3/books",
                "author=bob&page.size=5&genres=HISTORY&genres=2",
                b""
            )
            .unwrap(),
            r#"{"shelf":"3","page":{"size":5},"genres":["HISTORY","HISTORY"],"author":"bob"}"#
        );
        assert_eq!(
            request(&list, "/v1/shelves/3/books", "nope=1", b"").unwrap_err(),
            "nope: no such field in example.library.v1.ListBooksRequest"
        );
        let update = binding(&r, "UpdateBook", 0);
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "updateMask=title",
                br#"{"title":"New"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"New"},"updateMask":"title"}"#
        );
    }

    #[test]
    fn the_path_wins_over_the_body_the_body_over_the_query_and_errors_name_the_body_field() {
        let r = library();
        let update = binding(&r, "UpdateBook", 0);
        // The path's name replaces the body's; the rest of the book stays.
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "",
                br#"{"name":"shelves/9/books/9","title":"T"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"T"}}"#
        );
        // The body wins over the query, as in Envoy; the query sets what
        // the body leaves unset, a default too.
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "book.pages=0&book.title=",
                br#"{"title":"T","pages":"5"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"T","pages":"5"}}"#
        );
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "book.title=Q",
                br#"{"pages":"5"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"Q","pages":"5"}}"#
        );
        assert_eq!(
            request(&update, "/v1/shelves/1/books/2", "", br#"{"pages":true}"#).unwrap_err(),
            "book.pages: expected integer, got boolean"
        );
        assert_eq!(
            request(&update, "/v1/shelves/1/books/2", "", b"{\"title\":").unwrap_err(),
            "invalid JSON: EOF while parsing a value at line 1 column 9"
        );
        let create = binding(&r, "CreateBook", 0);
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", b"[1]").unwrap_err(),
            "book: expected object, got array"
        );
    }

    #[test]
    fn response_body_selects_a_field() {
        let r = library();
        let search = binding(&r, "SearchBooks", 0);
        assert_eq!(
            response_part(&search, r#"{"books":[{"title":"a"}],"nextPageToken":"x"}"#),
            r#"[{"title":"a"}]"#
        );
        assert_eq!(response_part(&search, "{}"), "[]");
    }

    #[test]
    fn body_and_response_body_may_name_a_nested_field() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "n.proto",
            r#"syntax = "proto3";
package n;
import "google/api/annotations.proto";
message Note { string text = 1; int32 stars = 2; }
message Attachment { Note note = 1; string label = 2; }
message Ask { string id = 1; Attachment attachment = 2; }
service S {
  rpc Put(Ask) returns (Ask) {
    option (google.api.http) = {
      post: "/v1/{id}" body: "attachment.note" response_body: "attachment.note"
      additional_bindings { get: "/v1/{id}/label" response_body: "attachment.label" }
    };
  }
}"#,
        )])
        .unwrap();
        let (mut kept, left_out) = bindings_of(&r.method("/n.S/Put").unwrap());
        assert_eq!(left_out, Vec::<String>::new());
        let label = kept.remove(1);
        let put = kept.remove(0);
        let options = JsonOptions::default();
        let vars = vec![(vec!["id".to_string()], "7".to_string())];
        let bytes = request_message(
            &put,
            vars,
            "",
            (br#"{"text":"hi","stars":3}"#, None),
            &options,
        )
        .unwrap();
        let ask = crate::json::decode_message(&r.message("n.Ask").unwrap(), &bytes).unwrap();
        let printed = crate::json::message_to_json(&ask, &options).unwrap();
        assert_eq!(
            printed,
            r#"{"id":"7","attachment":{"note":{"text":"hi","stars":3}}}"#
        );
        assert_eq!(response_part(&put, &printed), r#"{"stars":3,"text":"hi"}"#);
        // Not printed (a default): the field's own default.
        assert_eq!(response_part(&put, r#"{"id":"7"}"#), "{}");
        assert_eq!(response_part(&label, r#"{"id":"7"}"#), "null");
        assert_eq!(
            response_part(&label, r#"{"attachment":{"label":"x"}}"#),
            r#""x""#
        );
        // An empty body still sets the nested message, present and empty.
        let bytes = request_message(&put, vec![], "", (b"", None), &options).unwrap();
        assert_eq!(bytes, vec![0x12, 0x02, 0x0a, 0x00]);
    }
}
