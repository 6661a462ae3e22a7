//! JSON → message, by the proto3 JSON mapping.

use std::borrow::Cow;
use std::collections::HashMap;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MapKey, MessageDescriptor, Syntax, Value,
};

use super::tree::Json;
use super::wkt;
use super::{JsonOptions, WellKnown};
use crate::deterministic::encode_deterministic;
use crate::limits::Depth;

/// Bytes fields accept standard and URL-safe base64, padded or not; the
/// URL-safe characters are mapped to standard ones before decoding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// An error and where it happened, innermost segment first.
pub(crate) struct ParseError {
    pub(crate) reversed_path: Vec<String>,
    pub(crate) message: String,
}

impl ParseError {
    fn new(message: impl Into<String>) -> Self {
        ParseError {
            reversed_path: Vec::new(),
            message: message.into(),
        }
    }

    pub(crate) fn path(&self) -> String {
        let mut out = String::new();
        for segment in self.reversed_path.iter().rev() {
            if !segment.starts_with('[') && !out.is_empty() {
                out.push('.');
            }
            out.push_str(segment);
        }
        out
    }
}

type Result<T> = std::result::Result<T, ParseError>;

trait At<T> {
    fn at(self, segment: impl FnOnce() -> String) -> Result<T>;
}

impl<T> At<T> for Result<T> {
    fn at(self, segment: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|mut e| {
            e.reversed_path.push(segment());
            e
        })
    }
}

fn expected<T>(what: &str, got: &Json) -> Result<T> {
    Err(ParseError::new(format!(
        "expected {what}, got {}",
        got.kind_name()
    )))
}

pub(crate) struct Parser<'a> {
    pub(crate) options: &'a JsonOptions,
    /// serde_json stops at 128 levels of JSON; messages are held to the
    /// core's own, smaller limit, as when they are decoded.
    depth: Depth,
}

impl<'a> Parser<'a> {
    pub(crate) fn new(options: &'a JsonOptions) -> Self {
        Parser {
            options,
            depth: Depth::default(),
        }
    }

    pub(crate) fn message(&self, desc: &MessageDescriptor, json: Json) -> Result<DynamicMessage> {
        self.depth.enter().map_err(ParseError::new)?;
        let result = self.message_fields(desc, json);
        self.depth.leave();
        result
    }

    fn message_fields(&self, desc: &MessageDescriptor, json: Json) -> Result<DynamicMessage> {
        if let Some(wkt) = WellKnown::of(desc) {
            return self.well_known(desc, wkt, json);
        }
        let Json::Object(entries) = json else {
            return expected("object", &json);
        };
        self.fields(desc, entries)
    }

    fn fields(
        &self,
        desc: &MessageDescriptor,
        entries: Vec<(Cow<'_, str>, Json)>,
    ) -> Result<DynamicMessage> {
        let mut message = DynamicMessage::new(desc.clone());
        let mut seen: Vec<u32> = Vec::with_capacity(entries.len());
        let mut oneofs: Vec<String> = Vec::new();
        for (key, value) in entries {
            let Some(field) = desc
                .get_field_by_json_name(&key)
                .or_else(|| desc.get_field_by_name(&key))
            else {
                self.extension_or_unknown(desc, &mut message, &key, value)?;
                continue;
            };
            if seen.contains(&field.number()) {
                return Err(ParseError::new(format!(
                    "field '{}' is given more than once",
                    field.name()
                )))
                .at(|| key.into_owned());
            }
            seen.push(field.number());
            if value == Json::Null && !takes_null(&field) {
                continue;
            }
            if let Some(oneof) = field.containing_oneof() {
                if oneofs.iter().any(|o| o == oneof.name()) {
                    return Err(ParseError::new(format!(
                        "more than one field of oneof '{}' is set",
                        oneof.name()
                    )))
                    .at(|| key.into_owned());
                }
                oneofs.push(oneof.name().to_string());
            }
            if let Some(v) = self.field_value(&field, value).at(|| key.into_owned())? {
                message.set_field(&field, v);
            }
        }
        Ok(message)
    }

    fn extension_or_unknown(
        &self,
        desc: &MessageDescriptor,
        message: &mut DynamicMessage,
        key: &str,
        value: Json,
    ) -> Result<()> {
        let extension = key
            .strip_prefix('[')
            .and_then(|k| k.strip_suffix(']'))
            .and_then(|name| desc.get_extension_by_full_name(name));
        match extension {
            Some(ext) => {
                if value == Json::Null {
                    return Ok(());
                }
                let kind = ext.kind();
                let parsed = if ext.is_list() {
                    self.list(&kind, value)
                } else {
                    self.single(&kind, value)
                };
                if let Some(v) = parsed.at(|| key.to_string())? {
                    message.set_extension(&ext, v);
                }
                Ok(())
            }
            None if self.options.ignore_unknown_fields => Ok(()),
            None => Err(ParseError::new(format!(
                "unknown field '{key}' in {}",
                desc.full_name()
            ))),
        }
    }

    fn field_value(&self, field: &FieldDescriptor, json: Json) -> Result<Option<Value>> {
        if json == Json::Null {
            // Only reached for fields where null means something.
            return self.single(&field.kind(), json);
        }
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                return Err(ParseError::new("malformed map field"));
            };
            return self.map(&entry, json).map(|m| Some(Value::Map(m)));
        }
        if field.is_list() {
            return self.list(&field.kind(), json);
        }
        self.single(&field.kind(), json)
    }

    fn list(&self, kind: &Kind, json: Json) -> Result<Option<Value>> {
        let Json::Array(items) = json else {
            return expected("array", &json);
        };
        let mut values = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            if item == Json::Null && !kind_takes_null(kind) {
                return Err(ParseError::new("null is not allowed in a repeated field"))
                    .at(|| format!("[{i}]"));
            }
            if let Some(v) = self.single(kind, item).at(|| format!("[{i}]"))? {
                values.push(v);
            }
        }
        Ok(Some(Value::List(values)))
    }

    fn map(&self, entry: &MessageDescriptor, json: Json) -> Result<HashMap<MapKey, Value>> {
        let Json::Object(entries) = json else {
            return expected("object", &json);
        };
        let key_kind = entry.map_entry_key_field().kind();
        let value_kind = entry.map_entry_value_field().kind();
        let mut map = HashMap::with_capacity(entries.len());
        for (key, value) in entries {
            let map_key = map_key(&key_kind, &key).at(|| format!("[{key:?}]"))?;
            if value == Json::Null && !kind_takes_null(&value_kind) {
                return Err(ParseError::new("null is not allowed as a map value"))
                    .at(|| format!("[{key:?}]"));
            }
            let Some(v) = self
                .single(&value_kind, value)
                .at(|| format!("[{key:?}]"))?
            else {
                continue;
            };
            if map.insert(map_key, v).is_some() {
                return Err(ParseError::new("map key is given more than once"))
                    .at(|| format!("[{key:?}]"));
            }
        }
        Ok(map)
    }

    /// One value of a singular kind; `None` when it is to be skipped (an
    /// unknown enum name with ignore_unknown_fields).
    fn single(&self, kind: &Kind, json: Json) -> Result<Option<Value>> {
        let value = match kind {
            Kind::Double => Value::F64(parse_f64(&json)?),
            Kind::Float => Value::F32(parse_f32(&json)?),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                Value::I32(parse_int(&json, i32::MIN as i64, i32::MAX as i64)? as i32)
            }
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
                Value::I64(parse_int(&json, i64::MIN, i64::MAX)?)
            }
            Kind::Uint32 | Kind::Fixed32 => Value::U32(parse_uint(&json, u32::MAX as u64)? as u32),
            Kind::Uint64 | Kind::Fixed64 => Value::U64(parse_uint(&json, u64::MAX)?),
            Kind::Bool => match json {
                Json::Bool(b) => Value::Bool(b),
                other => return expected("boolean", &other),
            },
            Kind::String => match json {
                Json::String(s) => Value::String(s.into_owned()),
                other => return expected("string", &other),
            },
            Kind::Bytes => Value::Bytes(parse_bytes(&json)?.into()),
            Kind::Enum(e) => return self.enumeration(e, &json).map(|n| n.map(Value::EnumNumber)),
            Kind::Message(m) => Value::Message(self.message(m, json)?),
        };
        Ok(Some(value))
    }

    pub(super) fn enumeration(&self, desc: &EnumDescriptor, json: &Json) -> Result<Option<i32>> {
        if desc.full_name() == "google.protobuf.NullValue" && *json == Json::Null {
            return Ok(Some(0));
        }
        match json {
            Json::String(name) => match desc.get_value_by_name(name) {
                Some(v) => Ok(Some(v.number())),
                None if self.options.ignore_unknown_fields => Ok(None),
                None => Err(ParseError::new(format!(
                    "unknown value '{name}' of enum {}",
                    desc.full_name()
                ))),
            },
            Json::Unsigned(_) | Json::Signed(_) | Json::Float(_) => {
                let n = parse_int(json, i32::MIN as i64, i32::MAX as i64)? as i32;
                let closed = desc.parent_file().syntax() == Syntax::Proto2;
                match desc.get_value(n) {
                    None if closed && self.options.ignore_unknown_fields => Ok(None),
                    None if closed => Err(ParseError::new(format!(
                        "unknown value {n} of closed enum {}",
                        desc.full_name()
                    ))),
                    _ => Ok(Some(n)),
                }
            }
            other => expected(
                &format!("enum {} (name or number)", desc.full_name()),
                other,
            ),
        }
    }

    fn well_known(
        &self,
        desc: &MessageDescriptor,
        wkt: WellKnown,
        json: Json,
    ) -> Result<DynamicMessage> {
        let mut message = DynamicMessage::new(desc.clone());
        match wkt {
            WellKnown::Timestamp => {
                let (seconds, nanos) = time_string(
                    &json,
                    "RFC 3339 timestamp string",
                    "timestamp",
                    wkt::parse_timestamp,
                )?;
                message.set_field_by_number(1, Value::I64(seconds));
                message.set_field_by_number(2, Value::I32(nanos));
            }
            WellKnown::Duration => {
                let (seconds, nanos) = time_string(
                    &json,
                    "duration string such as \"1.5s\"",
                    "duration",
                    wkt::parse_duration,
                )?;
                message.set_field_by_number(1, Value::I64(seconds));
                message.set_field_by_number(2, Value::I32(nanos));
            }
            WellKnown::FieldMask => {
                let Json::String(text) = &json else {
                    return expected("comma-separated paths", &json);
                };
                let paths = text
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        wkt::path_from_json(p).map(Value::String).ok_or_else(|| {
                            ParseError::new(format!("invalid field mask path '{p}'"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                message.set_field_by_number(1, Value::List(paths));
            }
            WellKnown::Struct => {
                let Json::Object(entries) = json else {
                    return expected("object", &json);
                };
                let value_desc = struct_value_desc(desc)?;
                let mut fields = HashMap::with_capacity(entries.len());
                for (key, value) in entries {
                    let v = self.message(&value_desc, value).at(|| key.to_string())?;
                    fields.insert(MapKey::String(key.into_owned()), Value::Message(v));
                }
                message.set_field_by_number(1, Value::Map(fields));
            }
            WellKnown::ListValue => {
                let Json::Array(items) = json else {
                    return expected("array", &json);
                };
                let value_desc = list_value_desc(desc)?;
                let values = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| {
                        self.message(&value_desc, item)
                            .map(Value::Message)
                            .at(|| format!("[{i}]"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                message.set_field_by_number(1, Value::List(values));
            }
            WellKnown::Value => self.value(desc, &mut message, json)?,
            WellKnown::Wrapper => {
                let field = desc
                    .get_field(1)
                    .ok_or_else(|| ParseError::new("malformed wrapper type"))?;
                if let Some(v) = self.single(&field.kind(), json)? {
                    message.set_field(&field, v);
                }
            }
            WellKnown::Any => return self.any(desc, json),
        }
        Ok(message)
    }

    fn value(
        &self,
        desc: &MessageDescriptor,
        message: &mut DynamicMessage,
        json: Json,
    ) -> Result<()> {
        let pool = desc.parent_pool();
        let (number, value) = match json {
            Json::Null => (1, Value::EnumNumber(0)),
            Json::Unsigned(_) | Json::Signed(_) | Json::Float(_) => {
                (2, Value::F64(parse_f64(&json)?))
            }
            Json::String(s) => (3, Value::String(s.into_owned())),
            Json::Bool(b) => (4, Value::Bool(b)),
            Json::Object(_) => {
                let s = pool
                    .get_message_by_name("google.protobuf.Struct")
                    .ok_or_else(|| ParseError::new("google.protobuf.Struct is not loaded"))?;
                (5, Value::Message(self.message(&s, json)?))
            }
            Json::Array(_) => {
                let l = pool
                    .get_message_by_name("google.protobuf.ListValue")
                    .ok_or_else(|| ParseError::new("google.protobuf.ListValue is not loaded"))?;
                (6, Value::Message(self.message(&l, json)?))
            }
        };
        message.set_field_by_number(number, value);
        Ok(())
    }

    fn any(&self, desc: &MessageDescriptor, json: Json) -> Result<DynamicMessage> {
        let Json::Object(mut entries) = json else {
            return expected("object", &json);
        };
        let mut message = DynamicMessage::new(desc.clone());
        let Some(at) = entries.iter().position(|(k, _)| k == "@type") else {
            if entries.is_empty() {
                return Ok(message);
            }
            return Err(ParseError::new("Any is missing its \"@type\""));
        };
        let (_, type_url) = entries.remove(at);
        let Json::String(type_url) = type_url else {
            return expected("string", &type_url).at(|| "@type".into());
        };
        let inner_desc = any_type(desc, &type_url)?;
        let inner = if WellKnown::of(&inner_desc).is_some() {
            let value = match entries.iter().position(|(k, _)| k == "value") {
                Some(i) => entries.remove(i).1,
                None => {
                    return Err(ParseError::new(format!(
                        "Any of {} needs a \"value\"",
                        inner_desc.full_name()
                    )))
                }
            };
            if let Some((extra, _)) = entries.first() {
                return Err(ParseError::new(format!("unknown field '{extra}' in Any")));
            }
            self.message(&inner_desc, value).at(|| "value".into())?
        } else {
            self.fields(&inner_desc, entries)?
        };
        message.set_field_by_number(1, Value::String(type_url.into_owned()));
        message.set_field_by_number(2, Value::Bytes(encode_deterministic(&inner).into()));
        Ok(message)
    }
}

/// Seconds and nanos from the string form of a Timestamp or Duration.
fn time_string(
    json: &Json,
    expecting: &str,
    what: &str,
    parse: fn(&str) -> Option<(i64, i32)>,
) -> Result<(i64, i32)> {
    let Json::String(text) = json else {
        return expected(expecting, json);
    };
    parse(text).ok_or_else(|| ParseError::new(format!("invalid {what} '{text}'")))
}

/// The message type an Any's type URL names: the part after the last '/'.
pub(crate) fn any_type(desc: &MessageDescriptor, type_url: &str) -> Result<MessageDescriptor> {
    let name = type_url.rsplit('/').next().unwrap_or_default();
    if !type_url.contains('/') || name.is_empty() {
        return Err(ParseError::new(format!(
            "invalid Any type URL '{type_url}'"
        )));
    }
    desc.parent_pool()
        .get_message_by_name(name)
        .ok_or_else(|| ParseError::new(format!("Any has unknown type '{type_url}'")))
}

fn struct_value_desc(desc: &MessageDescriptor) -> Result<MessageDescriptor> {
    match desc.get_field(1).map(|f| f.kind()) {
        Some(Kind::Message(entry)) => match entry.map_entry_value_field().kind() {
            Kind::Message(v) => Ok(v),
            _ => Err(ParseError::new("malformed google.protobuf.Struct")),
        },
        _ => Err(ParseError::new("malformed google.protobuf.Struct")),
    }
}

fn list_value_desc(desc: &MessageDescriptor) -> Result<MessageDescriptor> {
    match desc.get_field(1).map(|f| f.kind()) {
        Some(Kind::Message(v)) => Ok(v),
        _ => Err(ParseError::new("malformed google.protobuf.ListValue")),
    }
}

/// Fields where JSON null is a value rather than "not set".
pub(super) fn takes_null(field: &FieldDescriptor) -> bool {
    !field.is_list() && !field.is_map() && kind_takes_null(&field.kind())
}

fn kind_takes_null(kind: &Kind) -> bool {
    match kind {
        Kind::Message(m) => m.full_name() == "google.protobuf.Value",
        Kind::Enum(e) => e.full_name() == "google.protobuf.NullValue",
        _ => false,
    }
}

fn map_key(kind: &Kind, key: &str) -> Result<MapKey> {
    let as_json = Json::String(Cow::Borrowed(key));
    Ok(match kind {
        Kind::String => MapKey::String(key.to_string()),
        Kind::Bool => match key {
            "true" => MapKey::Bool(true),
            "false" => MapKey::Bool(false),
            _ => {
                return Err(ParseError::new(format!(
                    "expected map key true or false, got '{key}'"
                )))
            }
        },
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            MapKey::I32(parse_int(&as_json, i32::MIN as i64, i32::MAX as i64)? as i32)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            MapKey::I64(parse_int(&as_json, i64::MIN, i64::MAX)?)
        }
        Kind::Uint32 | Kind::Fixed32 => MapKey::U32(parse_uint(&as_json, u32::MAX as u64)? as u32),
        Kind::Uint64 | Kind::Fixed64 => MapKey::U64(parse_uint(&as_json, u64::MAX)?),
        _ => return Err(ParseError::new("invalid map key type")),
    })
}

/// A JSON number written as a string, checked against the JSON grammar
/// (Rust's float parser alone would also take "inf", "+1" or ".5").
fn numeric_string(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let int_start = usize::from(b.first() == Some(&b'-'));
    let mut i = skip_digits(b, int_start);
    let int_len = i - int_start;
    if int_len == 0 || (int_len > 1 && b[int_start] == b'0') {
        return None;
    }
    if b.get(i) == Some(&b'.') {
        let end = skip_digits(b, i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let start = i + 1 + usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
        i = skip_digits(b, start);
        if i == start {
            return None;
        }
    }
    if i != b.len() {
        return None;
    }
    s.parse().ok()
}

/// The index after the run of ASCII digits that starts at `from`.
fn skip_digits(b: &[u8], from: usize) -> usize {
    from + b.get(from..).map_or(0, |rest| {
        rest.iter().take_while(|c| c.is_ascii_digit()).count()
    })
}

fn integral(value: f64) -> Result<f64> {
    if value.is_finite() && value.fract() == 0.0 {
        Ok(value)
    } else {
        Err(ParseError::new(format!("expected an integer, got {value}")))
    }
}

fn out_of_range() -> ParseError {
    ParseError::new("integer out of range")
}

/// A signed integer from a JSON number or a string holding one.
pub(super) fn parse_int(json: &Json, min: i64, max: i64) -> Result<i64> {
    let value = integer(json)?;
    if value < min as i128 || value > max as i128 {
        return Err(out_of_range());
    }
    Ok(value as i64)
}

/// The integer a JSON value holds, exactly; wider than any field so that
/// range checks see the true value.
fn integer(json: &Json) -> Result<i128> {
    Ok(match json {
        Json::Signed(v) => *v as i128,
        Json::Unsigned(v) => *v as i128,
        Json::Float(f) => float_to_int(integral(*f)?)?,
        Json::String(s) if is_plain_integer(s) => s.parse::<i128>().map_err(|_| out_of_range())?,
        Json::String(s) => match numeric_string(s) {
            Some(f) => float_to_int(integral(f)?)?,
            None => {
                return Err(ParseError::new(
                    "expected an integer, got a string that is not one",
                ))
            }
        },
        other => return expected("integer", other),
    })
}

/// `-?[0-9]+`: parsed exactly, never through a float.
fn is_plain_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

pub(super) fn parse_uint(json: &Json, max: u64) -> Result<u64> {
    let value = integer(json)?;
    if value < 0 || value > max as i128 {
        return Err(out_of_range());
    }
    Ok(value as u64)
}

/// A JSON number that was too long for an exact integer arrives as a float;
/// at ±2^63 and beyond its true value is uncertain, so only magnitudes below
/// 2^63 (or below 2^64 when positive) are taken.
fn float_to_int(f: f64) -> Result<i128> {
    if f <= -9_223_372_036_854_775_808.0 || f >= 18_446_744_073_709_551_616.0 {
        return Err(out_of_range());
    }
    Ok(f as i128)
}

pub(super) fn parse_f64(json: &Json) -> Result<f64> {
    match json {
        Json::Float(f) => Ok(*f),
        Json::Signed(v) => Ok(*v as f64),
        Json::Unsigned(v) => Ok(*v as f64),
        Json::String(s) => match s.as_ref() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => match numeric_string(s) {
                Some(f) if f.is_finite() => Ok(f),
                Some(_) => Err(ParseError::new("number out of range")),
                None => Err(ParseError::new(format!(
                    "expected a number, got string '{s}'"
                ))),
            },
        },
        other => expected("number", other),
    }
}

pub(super) fn parse_f32(json: &Json) -> Result<f32> {
    let value = parse_f64(json)?;
    let narrowed = value as f32;
    if value.is_finite() && narrowed.is_infinite() {
        return Err(ParseError::new("number out of range for a float field"));
    }
    Ok(narrowed)
}

pub(super) fn parse_bytes(json: &Json) -> Result<Vec<u8>> {
    let Json::String(s) = json else {
        return expected("base64 string", json);
    };
    let standard: String = s
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    BASE64
        .decode(standard.as_bytes())
        .map_err(|_| ParseError::new("expected base64, got a string that is not valid base64"))
}
