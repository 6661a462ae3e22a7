//! The request message a binding assembles from the path's variables, the
//! query and the body, and the part of the response `response_body`
//! names.

use prost_reflect::{Kind, MessageDescriptor};
use serde_json::{Map, Value};

use super::*;
use crate::http_body;
use crate::json::JsonOptions;
use crate::limits::{MAX_FIELD_PATH_BYTES, MAX_NESTING};

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
pub(super) fn field_json_to_protobuf(
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
pub(super) fn line_message(
    binding: &Binding,
    line: &Value,
    options: &JsonOptions,
) -> Result<Vec<u8>, String> {
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
pub(super) fn is_message_field(input: &MessageDescriptor, name: &str) -> bool {
    http_body::singular_path(input, name)
        .and_then(|path| path.last().cloned())
        .is_some_and(|f| !f.is_list() && !f.is_map() && matches!(f.kind(), Kind::Message(_)))
}

/// Sets the path variables, then the query parameters, typed by the input
/// message's fields, into `after`; with `before` (a binding with a body,
/// see [`line_parts`]), a query parameter's singular field goes there.
pub(super) fn fill_from_request_line(
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

pub(super) fn default_of(field: &prost_reflect::FieldDescriptor) -> String {
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
pub fn fields_on(
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
pub(super) fn numbers_of(fields: Option<&[prost_reflect::FieldDescriptor]>) -> Vec<u32> {
    fields
        .unwrap_or_default()
        .iter()
        .map(|f| f.number())
        .collect()
}

/// Text from a path or query string, as the JSON value its field takes.
pub(super) fn typed_scalar(
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

pub(super) fn slot<'a>(root: &'a mut Value, path: &[String]) -> &'a mut Value {
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

pub(super) fn set(root: &mut Value, path: &[String], value: Value) {
    *slot(root, path) = value;
}

pub(super) fn push(root: &mut Value, path: &[String], value: Value) {
    let target = slot(root, path);
    match target {
        Value::Array(items) => items.push(value),
        _ => *target = Value::Array(vec![value]),
    }
}

/// A query parameter's field path, bounded before anything is built from
/// it: each segment becomes a level of nested JSON, and a self-recursive
/// message accepts a path of any depth.
pub(super) fn query_field_path(key: &str) -> Result<Vec<String>, String> {
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
pub(super) fn query_pairs(query: &str) -> Result<Vec<(&str, String)>, String> {
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
pub(super) fn resolve_query_path(input: &MessageDescriptor, raw: Vec<String>) -> Vec<String> {
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
