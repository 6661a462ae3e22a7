//! The proto3 JSON mapping's rules for one value: numbers, strings, bytes,
//! enums, map keys, type URLs. `de/mod.rs` walks the document and applies
//! them.

use std::borrow::Cow;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MapKey, Syntax};

use super::token::Token;

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
    pub(crate) fn new(message: impl Into<String>) -> Self {
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

pub(crate) type Result<T> = std::result::Result<T, ParseError>;

pub(crate) fn expected<T>(what: &str, got: &Token) -> Result<T> {
    Err(ParseError::new(format!(
        "expected {what}, got {}",
        got.kind_name()
    )))
}

/// An enum's number from its name or number; `None` for an unknown name
/// (or an unknown number of a closed enum) when `ignore_unknown` is set.
pub(crate) fn enumeration(
    desc: &EnumDescriptor,
    json: &Token,
    ignore_unknown: bool,
) -> Result<Option<i32>> {
    if desc.full_name() == "google.protobuf.NullValue" && *json == Token::Null {
        return Ok(Some(0));
    }
    match json {
        Token::String(name) => match desc.get_value_by_name(name) {
            Some(v) => Ok(Some(v.number())),
            None if ignore_unknown => Ok(None),
            None => Err(ParseError::new(format!(
                "unknown value '{name}' of enum {}",
                desc.full_name()
            ))),
        },
        Token::Unsigned(_) | Token::Signed(_) | Token::Float(_) => {
            let n = parse_int(json, i32::MIN as i64, i32::MAX as i64)? as i32;
            let closed = desc.parent_file().syntax() == Syntax::Proto2;
            match desc.get_value(n) {
                None if closed && ignore_unknown => Ok(None),
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

/// Seconds and nanos from the string form of a Timestamp or Duration.
pub(crate) fn time_string(
    json: &Token,
    expecting: &str,
    what: &str,
    parse: fn(&str) -> Option<(i64, i32)>,
) -> Result<(i64, i32)> {
    let Token::String(text) = json else {
        return expected(expecting, json);
    };
    parse(text).ok_or_else(|| ParseError::new(format!("invalid {what} '{text}'")))
}

/// Fields where JSON null is a value rather than "not set".
pub(crate) fn takes_null(field: &FieldDescriptor) -> bool {
    !field.is_list() && !field.is_map() && kind_takes_null(&field.kind())
}

pub(crate) fn kind_takes_null(kind: &Kind) -> bool {
    match kind {
        Kind::Message(m) => m.full_name() == "google.protobuf.Value",
        Kind::Enum(e) => e.full_name() == "google.protobuf.NullValue",
        _ => false,
    }
}

pub(crate) fn map_key(kind: &Kind, key: &str) -> Result<MapKey> {
    let as_json = Token::String(Cow::Borrowed(key));
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
pub(crate) fn parse_int(json: &Token, min: i64, max: i64) -> Result<i64> {
    let value = integer(json)?;
    if value < min as i128 || value > max as i128 {
        return Err(out_of_range());
    }
    Ok(value as i64)
}

/// The integer a JSON value holds, exactly; wider than any field so that
/// range checks see the true value.
fn integer(json: &Token) -> Result<i128> {
    Ok(match json {
        Token::Signed(v) => *v as i128,
        Token::Unsigned(v) => *v as i128,
        Token::Float(f) => float_to_int(integral(*f)?)?,
        Token::String(s) if is_plain_integer(s) => s.parse::<i128>().map_err(|_| out_of_range())?,
        Token::String(s) => match numeric_string(s) {
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

pub(crate) fn parse_uint(json: &Token, max: u64) -> Result<u64> {
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

pub(crate) fn parse_f64(json: &Token) -> Result<f64> {
    match json {
        Token::Float(f) => Ok(*f),
        Token::Signed(v) => Ok(*v as f64),
        Token::Unsigned(v) => Ok(*v as f64),
        Token::String(s) => match s.as_ref() {
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

pub(crate) fn parse_f32(json: &Token) -> Result<f32> {
    let value = parse_f64(json)?;
    let narrowed = value as f32;
    if value.is_finite() && narrowed.is_infinite() {
        return Err(ParseError::new("number out of range for a float field"));
    }
    Ok(narrowed)
}

pub(crate) fn parse_bytes(json: &Token) -> Result<Vec<u8>> {
    let Token::String(s) = json else {
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
