//! Flat messages (proto3; every field a singular scalar, string, bytes or
//! enum outside any real oneof) are most request and reply bodies. Their
//! JSON is printed straight from the wire bytes: decoding into a
//! `DynamicMessage` first costs a tree and an allocation per field, which is
//! most of a small reply's cost in a wasm VM. Whatever this path is unsure
//! of (an unknown field, an unexpected wire type, bad UTF-8) returns `None`,
//! and the general path prints it or words the error, so both paths agree.

use prost::encoding::{decode_key, decode_varint, WireType};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor, Syntax, Value};
use smallvec::{smallvec, SmallVec};

use super::layout::wire_type_of;
use super::print::Printer;
use crate::json::WellKnown;

/// Whether `desc` can take the flat path.
pub(in crate::json) fn is_flat(desc: &MessageDescriptor) -> bool {
    WellKnown::of(desc).is_none()
        && desc.parent_file().syntax() == Syntax::Proto3
        && desc.fields().all(|f| {
            !f.is_list()
                && !f.is_map()
                && !matches!(f.kind(), Kind::Message(_))
                && f.containing_oneof().is_none_or(|o| o.is_synthetic())
        })
}

/// A field's value as the wire holds it.
#[derive(Clone, Copy)]
pub(super) enum Raw<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64(u64),
    Delimited(&'a [u8]),
}

/// Prints a flat message; `None` sends the caller to the general path,
/// `Some(Err)` is the printer's limit.
pub(super) fn print(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    bytes: &[u8],
) -> Option<Result<(), String>> {
    let last = read(desc, bytes)?;
    let options = printer.options;
    printer.out.push('{');
    let mut first = true;
    for (field, raw) in desc.fields().zip(last) {
        let value = match raw {
            Some(raw) => Some(scalar(&field, raw)?),
            None => None,
        };
        let has = match &value {
            Some(v) => field.supports_presence() || !is_zero(v),
            None => false,
        };
        if !has && (!options.emit_defaults || field.supports_presence()) {
            continue;
        }
        let name = if options.proto_field_names {
            field.name()
        } else {
            field.json_name()
        };
        printer.key(name, &mut first);
        let printed = match value {
            Some(value) => print_scalar(printer, &field.kind(), &value),
            None => printer.single(&field.kind(), &field.default_value()),
        };
        if let Err(e) = printed.and_then(|()| printer.check_limit()) {
            // Past the limit the answer is known; any other fault the
            // general path words.
            return printer.over_limit.then_some(Err(e));
        }
    }
    printer.out.push('}');
    Some(Ok(()))
}

/// Writes a value read from the wire as JSON.
pub(super) fn print_scalar(
    printer: &mut Printer,
    kind: &Kind,
    value: &Scalar,
) -> Result<(), String> {
    match value {
        Scalar::Str(s) => printer.string(s),
        Scalar::Bytes(b) => printer.bytes(b),
        Scalar::Other(v) => printer.single(kind, v)?,
    }
    Ok(())
}

/// Each field's last value on the wire (the last occurrence wins, as in
/// any protobuf parser), in the order of `desc.fields()`; `None` for
/// anything but known fields in the wire type their kind takes. One slot
/// per field, not one per occurrence: a field repeated all over a message
/// costs nothing more.
fn read<'a>(desc: &MessageDescriptor, mut bytes: &'a [u8]) -> Option<Fields<'a>> {
    // By number: each field's place in `desc.fields()` and its wire type.
    let mut places = desc
        .fields()
        .enumerate()
        .map(|(place, f)| {
            let kind = f.kind();
            Some((
                f.number(),
                place,
                wire_type_of(&kind)?,
                kind == Kind::String,
            ))
        })
        .collect::<Option<SmallVec<[(u32, usize, WireType, bool); 16]>>>()?;
    places.sort_unstable_by_key(|&(number, ..)| number);
    let mut last: Fields = smallvec![None; places.len()];
    while !bytes.is_empty() {
        let (number, wire_type) = decode_key(&mut bytes).ok()?;
        let at = places.binary_search_by_key(&number, |&(n, ..)| n).ok()?;
        let (_, place, expected, string) = places[at];
        if wire_type != expected {
            return None;
        }
        last[place] = Some(match wire_type {
            WireType::Varint => Raw::Varint(decode_varint(&mut bytes).ok()?),
            WireType::ThirtyTwoBit => {
                let (head, rest) = bytes.split_first_chunk::<4>()?;
                bytes = rest;
                Raw::Fixed32(u32::from_le_bytes(*head))
            }
            WireType::SixtyFourBit => {
                let (head, rest) = bytes.split_first_chunk::<8>()?;
                bytes = rest;
                Raw::Fixed64(u64::from_le_bytes(*head))
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
                if len > bytes.len() {
                    return None;
                }
                let (head, rest) = bytes.split_at(len);
                bytes = rest;
                // Every string is checked, kept or replaced later, as the
                // general path decodes them all.
                if string && std::str::from_utf8(head).is_err() {
                    return None;
                }
                Raw::Delimited(head)
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        });
    }
    Some(last)
}

type Fields<'a> = SmallVec<[Option<Raw<'a>>; 16]>;

/// A value; strings and bytes stay borrowed from their input.
pub(super) enum Scalar<'a> {
    Str(&'a str),
    Bytes(&'a [u8]),
    Other(Value),
}

/// Decodes a value the way prost does (varints truncate to 32 bits).
pub(super) fn scalar<'a>(field: &FieldDescriptor, raw: Raw<'a>) -> Option<Scalar<'a>> {
    scalar_of(&field.kind(), raw)
}

/// [`scalar`] by the field's kind.
pub(super) fn scalar_of<'a>(kind: &Kind, raw: Raw<'a>) -> Option<Scalar<'a>> {
    let value = match (kind, raw) {
        (Kind::String, Raw::Delimited(b)) => return std::str::from_utf8(b).ok().map(Scalar::Str),
        (Kind::Bytes, Raw::Delimited(b)) => return Some(Scalar::Bytes(b)),
        (Kind::Int32, Raw::Varint(v)) => Value::I32(v as i32),
        (Kind::Int64, Raw::Varint(v)) => Value::I64(v as i64),
        (Kind::Uint32, Raw::Varint(v)) => Value::U32(v as u32),
        (Kind::Uint64, Raw::Varint(v)) => Value::U64(v),
        (Kind::Sint32, Raw::Varint(v)) => {
            let v = v as u32;
            Value::I32((v >> 1) as i32 ^ -((v & 1) as i32))
        }
        (Kind::Sint64, Raw::Varint(v)) => Value::I64((v >> 1) as i64 ^ -((v & 1) as i64)),
        (Kind::Bool, Raw::Varint(v)) => Value::Bool(v != 0),
        (Kind::Enum(_), Raw::Varint(v)) => Value::EnumNumber(v as i32),
        (Kind::Fixed32, Raw::Fixed32(v)) => Value::U32(v),
        (Kind::Sfixed32, Raw::Fixed32(v)) => Value::I32(v as i32),
        (Kind::Float, Raw::Fixed32(v)) => Value::F32(f32::from_bits(v)),
        (Kind::Fixed64, Raw::Fixed64(v)) => Value::U64(v),
        (Kind::Sfixed64, Raw::Fixed64(v)) => Value::I64(v as i64),
        (Kind::Double, Raw::Fixed64(v)) => Value::F64(f64::from_bits(v)),
        _ => return None,
    };
    Some(Scalar::Other(value))
}

/// Whether an implicit-presence field holds its default, which is always
/// zero, empty or false (only fields with presence declare others).
pub(super) fn is_zero(value: &Scalar) -> bool {
    match value {
        Scalar::Str(s) => s.is_empty(),
        Scalar::Bytes(b) => b.is_empty(),
        Scalar::Other(v) => match v {
            Value::Bool(b) => !b,
            Value::I32(n) | Value::EnumNumber(n) => *n == 0,
            Value::I64(n) => *n == 0,
            Value::U32(n) => *n == 0,
            Value::U64(n) => *n == 0,
            Value::F32(f) => *f == 0.0,
            Value::F64(f) => *f == 0.0,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost_reflect::DynamicMessage;

    use super::*;
    use crate::descriptors::Registry;
    use crate::json::{decode_message, message_to_json, JsonOptions};

    const PROTO: &str = r#"
        syntax = "proto3";
        package flat;
        import "google/protobuf/timestamp.proto";
        enum Color { RED = 0; GREEN = 1; }
        message Scalars {
          int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4;
          sint32 s32 = 5; sint64 s64 = 6; fixed32 f32 = 7; fixed64 f64 = 8;
          sfixed32 sf32 = 9; sfixed64 sf64 = 10; float fl = 11; double db = 12;
          bool b = 13; string s = 14; bytes by = 15; Color color = 16;
          optional int32 opt = 17; string snake_name = 18;
        }
        message Nested { Scalars inner = 1; }
        message Listed { repeated int32 xs = 1; }
        message Choice { oneof pick { int32 a = 1; string b = 2; } }
    "#;

    fn desc(name: &str) -> MessageDescriptor {
        let mut registry = Registry::new().unwrap();
        registry.add_sources([("flat.proto", PROTO)]).unwrap();
        registry.message(name).unwrap()
    }

    fn general(desc: &MessageDescriptor, bytes: &[u8], options: &JsonOptions) -> String {
        message_to_json(&decode_message(desc, bytes).unwrap(), options).unwrap()
    }

    /// The flat path alone, on a printer without a limit.
    fn print(desc: &MessageDescriptor, bytes: &[u8], options: &JsonOptions) -> Option<String> {
        let mut printer = Printer::new(options, 16);
        super::print(&mut printer, desc, bytes)?.unwrap();
        Some(printer.out)
    }

    fn options() -> Vec<JsonOptions> {
        vec![JsonOptions::default(), crate::json::every_print_option()]
    }

    #[test]
    fn prints_what_the_general_path_prints() {
        let d = desc("flat.Scalars");
        let mut m = DynamicMessage::new(d.clone());
        let set = |m: &mut DynamicMessage, name: &str, v: Value| m.set_field_by_name(name, v);
        set(&mut m, "i32", Value::I32(-5));
        set(&mut m, "i64", Value::I64(i64::MIN));
        set(&mut m, "u32", Value::U32(u32::MAX));
        set(&mut m, "u64", Value::U64(u64::MAX));
        set(&mut m, "s32", Value::I32(-7));
        set(&mut m, "s64", Value::I64(-9_000_000_000));
        set(&mut m, "f32", Value::U32(7));
        set(&mut m, "f64", Value::U64(8));
        set(&mut m, "sf32", Value::I32(-9));
        set(&mut m, "sf64", Value::I64(-10));
        set(&mut m, "fl", Value::F32(f32::NAN));
        set(&mut m, "db", Value::F64(-0.5));
        set(&mut m, "b", Value::Bool(true));
        set(&mut m, "s", Value::String("tab\t \"quote\" é".into()));
        set(&mut m, "by", Value::Bytes(vec![0, 255, 7].into()));
        set(&mut m, "color", Value::EnumNumber(1));
        set(&mut m, "opt", Value::I32(0));
        let cases = [
            m.encode_to_vec(),
            Vec::new(),
            // An unknown enum number, then i32 twice: the last one wins.
            vec![0x80, 0x01, 0x07, 0x08, 0x01, 0x08, 0x02],
            // A default written out for an implicit-presence field.
            vec![0x08, 0x00],
        ];
        for bytes in &cases {
            for o in options() {
                assert_eq!(
                    print(&d, bytes, &o).as_deref(),
                    Some(general(&d, bytes, &o).as_str())
                );
            }
        }
        assert_eq!(
            print(&d, &cases[2], &JsonOptions::default()).unwrap(),
            r#"{"i32":2,"color":7}"#
        );
    }

    #[test]
    fn leaves_to_the_general_path_what_it_does_not_read() {
        let d = desc("flat.Scalars");
        let o = JsonOptions::default();
        assert_eq!(print(&d, &[0xf8, 0x07, 0x01], &o), None, "unknown field");
        assert_eq!(print(&d, &[0x0a, 0x00], &o), None, "wire type");
        assert_eq!(print(&d, &[0x72, 0x01, 0xff], &o), None, "bad UTF-8");
        assert_eq!(print(&d, &[0x72, 0x05, 0x61], &o), None, "truncated");
        assert!(is_flat(&d));
        for name in [
            "flat.Nested",
            "flat.Listed",
            "flat.Choice",
            "google.protobuf.Timestamp",
        ] {
            assert!(!is_flat(&desc(name)), "{name}");
        }
    }
}
