//! Deterministic encoding: map entries sorted by key, as Google's
//! implementations do with `deterministic=True`.
//!
//! prost-reflect keeps map fields in a `HashMap`, so their wire order changes
//! from run to run. Rather than re-implement the encoder, the encoded bytes
//! are walked with the descriptor and each run of map entries is sorted.
//! Entries are also written with both key and value, defaults included, as
//! Google's runtimes write them. Only messages that contain a map somewhere
//! pay for this.

use std::collections::HashMap;
use std::sync::Mutex;

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};
use prost::Message;
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage};

/// Encodes `message` with map entries in key order.
pub fn encode_deterministic(message: &DynamicMessage) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let desc = message.descriptor();
    if !contains_map(&desc) {
        return bytes;
    }
    // The bytes were produced by prost just now, so they parse; should they
    // not, the plain encoding is still a valid one.
    canonicalize(&desc, &bytes).unwrap_or(bytes)
}

/// Whether a map field is reachable from `desc`; cached per type because the
/// walk is per call otherwise.
fn contains_map(desc: &MessageDescriptor) -> bool {
    // Flat messages (the common case) need no cache look-up at all.
    if !desc.fields().any(|f| matches!(f.kind(), Kind::Message(_))) {
        return false;
    }
    static CACHE: Mutex<Option<HashMap<String, bool>>> = Mutex::new(None);
    let mut guard = match CACHE.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(&known) = cache.get(desc.full_name()) {
        return known;
    }
    let mut seen = Vec::new();
    let found = reaches_map(desc, &mut seen);
    cache.insert(desc.full_name().to_string(), found);
    found
}

fn reaches_map(desc: &MessageDescriptor, seen: &mut Vec<String>) -> bool {
    if seen.iter().any(|s| s == desc.full_name()) {
        return false;
    }
    seen.push(desc.full_name().to_string());
    desc.fields()
        .any(|f| f.is_map() || matches!(f.kind(), Kind::Message(ref m) if reaches_map(m, seen)))
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SortKey {
    Signed(i64),
    Unsigned(u64),
    Bytes(Vec<u8>),
}

struct Malformed;

fn canonicalize(desc: &MessageDescriptor, mut buf: &[u8]) -> Result<Vec<u8>, Malformed> {
    let mut out = Vec::with_capacity(buf.len());
    let mut run: Vec<(SortKey, Vec<u8>)> = Vec::new();
    let mut run_field = 0u32;
    while !buf.is_empty() {
        let (number, wire_type) = decode_key(&mut buf).map_err(|_| Malformed)?;
        let field = desc.get_field(number);
        if number != run_field {
            flush(&mut run, &mut out);
        }
        match (wire_type, field) {
            (WireType::LengthDelimited, Some(field)) if field.is_map() || is_message(&field) => {
                let payload = take_len_delimited(&mut buf)?;
                let Kind::Message(inner) = field.kind() else {
                    return Err(Malformed);
                };
                let canonical = if field.is_map() {
                    map_entry(&inner, payload)?
                } else if contains_map(&inner) {
                    canonicalize(&inner, payload)?
                } else {
                    payload.to_vec()
                };
                let mut record = Vec::with_capacity(canonical.len() + 10);
                encode_key(number, WireType::LengthDelimited, &mut record);
                encode_varint(canonical.len() as u64, &mut record);
                record.extend_from_slice(&canonical);
                if field.is_map() {
                    run_field = number;
                    run.push((map_key(&inner, &canonical)?, record));
                } else {
                    out.extend_from_slice(&record);
                }
            }
            _ => {
                let before = buf;
                skip_value(wire_type, number, &mut buf)?;
                let consumed = before.len() - buf.len();
                encode_key(number, wire_type, &mut out);
                out.extend_from_slice(&before[..consumed]);
            }
        }
    }
    flush(&mut run, &mut out);
    Ok(out)
}

/// Rewrites one map entry as key then value, each present even when default.
fn map_entry(entry: &MessageDescriptor, mut buf: &[u8]) -> Result<Vec<u8>, Malformed> {
    let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
    let (mut key, mut value) = (None, None);
    while !buf.is_empty() {
        let before = buf;
        let (number, wire_type) = decode_key(&mut buf).map_err(|_| Malformed)?;
        let body_start = buf;
        skip_value(wire_type, number, &mut buf)?;
        let record = &before[..before.len() - buf.len()];
        match number {
            1 => key = Some(record.to_vec()),
            2 => {
                let body = &body_start[..body_start.len() - buf.len()];
                value = Some(match value_field.kind() {
                    Kind::Message(m)
                        if wire_type == WireType::LengthDelimited && contains_map(&m) =>
                    {
                        let mut inner = body;
                        let payload = take_len_delimited(&mut inner)?;
                        let canonical = canonicalize(&m, payload)?;
                        let mut record = Vec::with_capacity(canonical.len() + 6);
                        encode_key(2, WireType::LengthDelimited, &mut record);
                        encode_varint(canonical.len() as u64, &mut record);
                        record.extend_from_slice(&canonical);
                        record
                    }
                    _ => record.to_vec(),
                });
            }
            _ => {}
        }
    }
    let mut out = key.unwrap_or_else(|| default_record(1, &key_field.kind()));
    out.extend(value.unwrap_or_else(|| default_record(2, &value_field.kind())));
    Ok(out)
}

/// The encoding of a field holding its type's default value.
fn default_record(number: u32, kind: &Kind) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    match kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => {
            encode_key(number, WireType::SixtyFourBit, &mut out);
            out.extend_from_slice(&[0; 8]);
        }
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => {
            encode_key(number, WireType::ThirtyTwoBit, &mut out);
            out.extend_from_slice(&[0; 4]);
        }
        Kind::String | Kind::Bytes | Kind::Message(_) => {
            encode_key(number, WireType::LengthDelimited, &mut out);
            out.push(0);
        }
        _ => {
            encode_key(number, WireType::Varint, &mut out);
            out.push(0);
        }
    }
    out
}

fn is_message(field: &FieldDescriptor) -> bool {
    matches!(field.kind(), Kind::Message(_)) && !field.is_group()
}

fn flush(run: &mut Vec<(SortKey, Vec<u8>)>, out: &mut Vec<u8>) {
    // Stable: for duplicate keys the last one wins on decode, so keep order.
    run.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, record) in run.drain(..) {
        out.extend_from_slice(&record);
    }
}

fn take_len_delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], Malformed> {
    let len = decode_varint(buf).map_err(|_| Malformed)? as usize;
    if len > buf.len() {
        return Err(Malformed);
    }
    let (payload, rest) = buf.split_at(len);
    *buf = rest;
    Ok(payload)
}

fn skip_value(wire_type: WireType, number: u32, buf: &mut &[u8]) -> Result<(), Malformed> {
    match wire_type {
        WireType::Varint => decode_varint(buf).map(|_| ()).map_err(|_| Malformed),
        WireType::SixtyFourBit => advance(buf, 8),
        WireType::ThirtyTwoBit => advance(buf, 4),
        WireType::LengthDelimited => take_len_delimited(buf).map(|_| ()),
        WireType::StartGroup => loop {
            let (inner, wt) = decode_key(buf).map_err(|_| Malformed)?;
            if wt == WireType::EndGroup {
                return if inner == number {
                    Ok(())
                } else {
                    Err(Malformed)
                };
            }
            skip_value(wt, inner, buf)?;
        },
        WireType::EndGroup => Err(Malformed),
    }
}

fn advance(buf: &mut &[u8], n: usize) -> Result<(), Malformed> {
    if buf.len() < n {
        return Err(Malformed);
    }
    buf.advance(n);
    Ok(())
}

/// The key of one encoded map entry (field 1), defaulting when absent.
fn map_key(entry: &MessageDescriptor, mut buf: &[u8]) -> Result<SortKey, Malformed> {
    let key_field = entry.get_field(1).ok_or(Malformed)?;
    let mut key = default_key(&key_field.kind());
    while !buf.is_empty() {
        let (number, wire_type) = decode_key(&mut buf).map_err(|_| Malformed)?;
        if number != 1 {
            skip_value(wire_type, number, &mut buf)?;
            continue;
        }
        key = read_key(&key_field.kind(), wire_type, &mut buf)?;
    }
    Ok(key)
}

fn default_key(kind: &Kind) -> SortKey {
    match kind {
        Kind::String => SortKey::Bytes(Vec::new()),
        Kind::Uint32 | Kind::Uint64 | Kind::Fixed32 | Kind::Fixed64 | Kind::Bool => {
            SortKey::Unsigned(0)
        }
        _ => SortKey::Signed(0),
    }
}

fn read_key(kind: &Kind, wire_type: WireType, buf: &mut &[u8]) -> Result<SortKey, Malformed> {
    let varint = |buf: &mut &[u8]| decode_varint(buf).map_err(|_| Malformed);
    let key = match (kind, wire_type) {
        (Kind::String, WireType::LengthDelimited) => {
            SortKey::Bytes(take_len_delimited(buf)?.to_vec())
        }
        (Kind::Int32, WireType::Varint) => SortKey::Signed(varint(buf)? as i32 as i64),
        (Kind::Int64, WireType::Varint) => SortKey::Signed(varint(buf)? as i64),
        (Kind::Sint32 | Kind::Sint64, WireType::Varint) => {
            let v = varint(buf)?;
            SortKey::Signed(((v >> 1) as i64) ^ -((v & 1) as i64))
        }
        (Kind::Uint32 | Kind::Uint64, WireType::Varint) => SortKey::Unsigned(varint(buf)?),
        (Kind::Bool, WireType::Varint) => SortKey::Unsigned(u64::from(varint(buf)? != 0)),
        (Kind::Fixed32, WireType::ThirtyTwoBit) => SortKey::Unsigned(u64::from(read_u32(buf)?)),
        (Kind::Sfixed32, WireType::ThirtyTwoBit) => {
            SortKey::Signed(i64::from(read_u32(buf)? as i32))
        }
        (Kind::Fixed64, WireType::SixtyFourBit) => SortKey::Unsigned(read_u64(buf)?),
        (Kind::Sfixed64, WireType::SixtyFourBit) => SortKey::Signed(read_u64(buf)? as i64),
        _ => return Err(Malformed),
    };
    Ok(key)
}

fn read_u32(buf: &mut &[u8]) -> Result<u32, Malformed> {
    if buf.len() < 4 {
        return Err(Malformed);
    }
    Ok(buf.get_u32_le())
}

fn read_u64(buf: &mut &[u8]) -> Result<u64, Malformed> {
    if buf.len() < 8 {
        return Err(Malformed);
    }
    Ok(buf.get_u64_le())
}
