//! The protobuf side of JSON → protobuf: scalars and map keys as the wire
//! holds them, how a message is put around its fields, and map entries
//! read back to be sorted. The JSON side (serde's visitors, paths, the
//! rules of `parse`) is in `mod.rs`.

use std::borrow::Cow;

use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
use prost_reflect::{Kind, MapKey};

use super::parse::{
    enumeration, expected, map_key, parse_bytes, parse_f32, parse_f64, parse_int, parse_uint,
    ParseError, Result,
};
use super::token::Token;

/// One scalar as the wire holds it.
pub(super) enum Wire<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64(u64),
    Delimited(Cow<'a, [u8]>),
}

impl Wire<'_> {
    /// Whether prost-reflect leaves it out of an implicit-presence field
    /// (it compares values, so -0.0 counts as the default).
    pub(super) fn is_default(&self, kind: &Kind) -> bool {
        match (self, kind) {
            (Wire::Fixed32(bits), Kind::Float) => f32::from_bits(*bits) == 0.0,
            (Wire::Fixed64(bits), Kind::Double) => f64::from_bits(*bits) == 0.0,
            (Wire::Varint(v), _) | (Wire::Fixed64(v), _) => *v == 0,
            (Wire::Fixed32(v), _) => *v == 0,
            (Wire::Delimited(b), _) => b.is_empty(),
        }
    }

    /// Writes the value, after its key unless it is an element of a packed
    /// list (`tag` None).
    pub(super) fn write(&self, tag: Option<u32>, out: &mut Vec<u8>) {
        let wire_type = match self {
            Wire::Varint(_) => WireType::Varint,
            Wire::Fixed32(_) => WireType::ThirtyTwoBit,
            Wire::Fixed64(_) => WireType::SixtyFourBit,
            Wire::Delimited(_) => WireType::LengthDelimited,
        };
        if let Some(tag) = tag {
            encode_key(tag, wire_type, out);
        }
        match self {
            Wire::Varint(v) => encode_varint(*v, out),
            Wire::Fixed32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Wire::Fixed64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Wire::Delimited(b) => {
                encode_varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
        }
    }
}

/// A scalar field's value from its token; `None` for a value to skip (an
/// unknown enum name, when those are ignored).
pub(super) fn scalar<'a>(
    kind: &Kind,
    token: Token<'a>,
    ignore_unknown: bool,
) -> Result<Option<Wire<'a>>> {
    let i32_range = |t: &Token| parse_int(t, i32::MIN as i64, i32::MAX as i64).map(|v| v as i32);
    let wire = match kind {
        Kind::Double => Wire::Fixed64(parse_f64(&token)?.to_bits()),
        Kind::Float => Wire::Fixed32(parse_f32(&token)?.to_bits()),
        // Negative int32s are sign-extended to ten bytes, as prost writes them.
        Kind::Int32 => Wire::Varint(i64::from(i32_range(&token)?) as u64),
        Kind::Sint32 => {
            let v = i32_range(&token)?;
            Wire::Varint(u64::from(((v << 1) ^ (v >> 31)) as u32))
        }
        Kind::Sfixed32 => Wire::Fixed32(i32_range(&token)? as u32),
        Kind::Int64 => Wire::Varint(parse_int(&token, i64::MIN, i64::MAX)? as u64),
        Kind::Sint64 => {
            let v = parse_int(&token, i64::MIN, i64::MAX)?;
            Wire::Varint(((v << 1) ^ (v >> 63)) as u64)
        }
        Kind::Sfixed64 => Wire::Fixed64(parse_int(&token, i64::MIN, i64::MAX)? as u64),
        Kind::Uint32 => Wire::Varint(parse_uint(&token, u64::from(u32::MAX))?),
        Kind::Fixed32 => Wire::Fixed32(parse_uint(&token, u64::from(u32::MAX))? as u32),
        Kind::Uint64 => Wire::Varint(parse_uint(&token, u64::MAX)?),
        Kind::Fixed64 => Wire::Fixed64(parse_uint(&token, u64::MAX)?),
        Kind::Bool => match token {
            Token::Bool(b) => Wire::Varint(u64::from(b)),
            other => return expected("boolean", &other),
        },
        Kind::String => match token {
            Token::String(Cow::Borrowed(s)) => Wire::Delimited(Cow::Borrowed(s.as_bytes())),
            Token::String(Cow::Owned(s)) => Wire::Delimited(Cow::Owned(s.into_bytes())),
            other => return expected("string", &other),
        },
        Kind::Bytes => Wire::Delimited(Cow::Owned(parse_bytes(&token)?)),
        Kind::Enum(e) => match enumeration(e, &token, ignore_unknown)? {
            Some(n) => Wire::Varint(i64::from(n) as u64),
            None => return Ok(None),
        },
        Kind::Message(m) => {
            return Err(ParseError::new(format!(
                "{} is not a scalar type",
                m.full_name()
            )))
        }
    };
    Ok(Some(wire))
}

/// A map key as the wire holds it, and the first eight bytes of its sort
/// order as a number: signed keys shifted so that negative ones sort
/// first, strings by their first eight bytes.
pub(super) fn key_wire<'a>(kind: &Kind, key: &'a str) -> Result<(Wire<'a>, u64)> {
    let signed = |v: i64| (v as u64) ^ (1 << 63);
    Ok(match map_key(kind, key)? {
        MapKey::String(_) => {
            let mut head = [0u8; 8];
            let n = key.len().min(8);
            head[..n].copy_from_slice(&key.as_bytes()[..n]);
            let wire = Wire::Delimited(Cow::Borrowed(key.as_bytes()));
            (wire, u64::from_be_bytes(head))
        }
        MapKey::Bool(b) => (Wire::Varint(u64::from(b)), u64::from(b)),
        MapKey::I32(v) => {
            let wire = match kind {
                Kind::Sint32 => Wire::Varint(u64::from(((v << 1) ^ (v >> 31)) as u32)),
                Kind::Sfixed32 => Wire::Fixed32(v as u32),
                _ => Wire::Varint(i64::from(v) as u64),
            };
            (wire, signed(i64::from(v)))
        }
        MapKey::I64(v) => {
            let wire = match kind {
                Kind::Sint64 => Wire::Varint(((v << 1) ^ (v >> 63)) as u64),
                Kind::Sfixed64 => Wire::Fixed64(v as u64),
                _ => Wire::Varint(v as u64),
            };
            (wire, signed(v))
        }
        MapKey::U32(v) => {
            let wire = match kind {
                Kind::Fixed32 => Wire::Fixed32(v),
                _ => Wire::Varint(u64::from(v)),
            };
            (wire, u64::from(v))
        }
        MapKey::U64(v) => {
            let wire = match kind {
                Kind::Fixed64 => Wire::Fixed64(v),
                _ => Wire::Varint(v),
            };
            (wire, v)
        }
    })
}

/// How a message value is put around its fields.
#[derive(Clone, Copy)]
pub(super) enum Wrap {
    /// Written as it is: the top level, the value of an Any.
    Bare,
    /// After its key and its length.
    Delimited(u32),
    /// Between a start-group and an end-group key.
    Group(u32),
}

/// A message opened by `Encoder::open`, for `Encoder::close` (in `de/mod.rs`).
pub(super) enum Opened {
    Bare,
    /// Where its length placeholder is.
    Delimited(usize),
    Group(u32),
}

/// One map entry as written: where it is in the map's bytes, and the
/// first eight bytes of its key's sort order, which settle most
/// comparisons without reading the key back.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) prefix: u64,
    pub(super) start: u32,
    pub(super) len: u32,
}

/// A map entry's key, read back from the entry as written, in the order
/// Google's deterministic serializers sort entries.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum EntryKey<'a> {
    Signed(i64),
    Unsigned(u64),
    Bytes(&'a [u8]),
}

impl EntryKey<'_> {
    /// The key as its JSON text, for an error's path.
    pub(super) fn shown(&self, kind: &Kind) -> String {
        match (self, kind) {
            (EntryKey::Unsigned(v), Kind::Bool) => (*v != 0).to_string(),
            (EntryKey::Unsigned(v), _) => v.to_string(),
            (EntryKey::Signed(v), _) => v.to_string(),
            (EntryKey::Bytes(b), _) => String::from_utf8_lossy(b).into_owned(),
        }
    }
}

/// The key of an entry this encoder wrote: the map field's key and length,
/// then the key field.
pub(super) fn entry_key<'a>(kind: &Kind, mut entry: &'a [u8]) -> EntryKey<'a> {
    let read = |entry: &mut &'a [u8]| -> Option<EntryKey<'a>> {
        decode_key(entry).ok()?;
        decode_varint(entry).ok()?;
        decode_key(entry).ok()?;
        let fixed = |entry: &mut &'a [u8], n: usize| -> Option<u64> {
            let (head, _) = entry.split_at_checked(n)?;
            let mut bytes = [0u8; 8];
            bytes[..n].copy_from_slice(head);
            Some(u64::from_le_bytes(bytes))
        };
        Some(match kind {
            Kind::String => {
                let len = usize::try_from(decode_varint(entry).ok()?).ok()?;
                EntryKey::Bytes(entry.get(..len)?)
            }
            Kind::Sint32 | Kind::Sint64 => {
                let v = decode_varint(entry).ok()?;
                EntryKey::Signed(((v >> 1) as i64) ^ -((v & 1) as i64))
            }
            Kind::Int32 | Kind::Int64 => EntryKey::Signed(decode_varint(entry).ok()? as i64),
            Kind::Sfixed32 => EntryKey::Signed(i64::from(fixed(entry, 4)? as u32 as i32)),
            Kind::Sfixed64 => EntryKey::Signed(fixed(entry, 8)? as i64),
            Kind::Fixed32 => EntryKey::Unsigned(fixed(entry, 4)?),
            Kind::Fixed64 => EntryKey::Unsigned(fixed(entry, 8)?),
            _ => EntryKey::Unsigned(decode_varint(entry).ok()?),
        })
    };
    // The entry was written just now, so it reads; should it not, every
    // such key sorts first.
    read(&mut entry).unwrap_or(EntryKey::Signed(i64::MIN))
}
