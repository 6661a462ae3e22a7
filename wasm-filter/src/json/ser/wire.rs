//! Protobuf → JSON straight from the wire bytes, for any message.
//!
//! Decoding into a `DynamicMessage` first holds every field and every
//! packed element as a `Value` (tens of bytes each, a nested message a few
//! hundred): a list of small messages cost 22 to 132 times its wire size,
//! and the hosts' wasm memory never shrinks. Here the bytes stay
//! where they are; each message level keeps an index of 4 bytes per field
//! occurrence while it prints, so a message costs a few times its size.
//!
//! It reads the wire as prost-reflect decodes it, rule for rule, so that
//! both paths print the same JSON: the last value of a field wins, the
//! occurrences of a message field merge, a oneof keeps the member set last,
//! map entries replace each other by key, lists come packed or not, and a
//! known field in the wrong wire type is an error. What it does not read
//! (groups and extensions, proto2 features) goes to the general path.

use std::rc::Rc;

use prost::encoding::{decode_key, decode_varint, WireType};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor, Value};
use smallvec::SmallVec;

use super::flat::{is_zero, print_scalar, scalar, scalar_of, Raw, Scalar};
use super::layout::{Layout, Layouts, Shape};

use super::print::Printer;
use crate::json::wkt::{self, any_type};
use crate::json::WellKnown;
use crate::limits::PROST_DECODE_LEVELS;

/// Why printing stopped: boxed, so that a `Result<(), Stop>` is one word.
/// Every value printed returns one, and a wider error was written to and
/// read back from the stack on each (errors themselves are rare).
#[derive(Debug)]
pub(super) struct Stop(Box<Why>);

#[derive(Debug)]
pub(super) enum Why {
    /// The message holds what only the general path reads; the caller
    /// prints it again that way.
    General,
    /// The bytes are no valid encoding of the type.
    Decode(String),
    /// The message has no JSON form, or its JSON passed the printer's limit.
    Print(String),
}

impl Stop {
    pub(super) fn general() -> Stop {
        Stop(Box::new(Why::General))
    }

    pub(super) fn decode(reason: String) -> Stop {
        Stop(Box::new(Why::Decode(reason)))
    }

    pub(super) fn print(reason: String) -> Stop {
        Stop(Box::new(Why::Print(reason)))
    }

    pub(super) fn why(self) -> Why {
        *self.0
    }
}

type Result<T = ()> = std::result::Result<T, Stop>;

impl From<prost::DecodeError> for Stop {
    fn from(e: prost::DecodeError) -> Stop {
        Stop::decode(e.to_string())
    }
}

fn print_err(e: String) -> Stop {
    Stop::print(e)
}

/// Prints the message of type `desc` held in `bytes`.
pub(super) fn print(printer: &mut Printer, desc: &MessageDescriptor, bytes: &[u8]) -> Result {
    message(printer, desc, &[bytes])
}

/// A message whose encoding is the concatenation of `parts` (a message
/// field that occurs more than once merges its occurrences).
fn message(printer: &mut Printer, desc: &MessageDescriptor, parts: &[&[u8]]) -> Result {
    let layout = printer.layouts.of(desc);
    message_with(printer, desc, layout, parts)
}

/// [`message`] with the type's layout found already (once for a list).
fn message_with(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    layout: Rc<Layout>,
    parts: &[&[u8]],
) -> Result {
    printer.enter().map_err(print_err)?;
    printer.wire_level += 1;
    let result = match layout.well_known {
        Some(WellKnown::Timestamp | WellKnown::Duration) => time(printer, desc, &layout, parts),
        Some(wkt) => well_known(printer, desc, layout, wkt, parts),
        None => {
            printer.out.push('{');
            let mut first = true;
            let result = fields(printer, desc, &layout, parts, &mut first);
            printer.out.push('}');
            result
        }
    };
    printer.wire_level -= 1;
    printer.leave();
    result
}

/// How deep the message being printed lies below the message its bytes
/// were decoded from (the top, or an `Any`'s payload), as prost counts it.
fn level(printer: &Printer) -> usize {
    printer.wire_level.saturating_sub(1)
}

/// The fields of a message, in number order (as the descriptor lists
/// them, and the general printer prints them), into an object already
/// open (`first`: whether nothing was written into it yet).
fn fields(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    layout: &Rc<Layout>,
    parts: &[&[u8]],
    first: &mut bool,
) -> Result {
    if layout.singular {
        return singular(printer, desc, layout, parts, first);
    }
    let index = Index::new(
        layout.clone(),
        desc,
        parts,
        level(printer),
        &mut printer.layouts,
    )?;
    // Each element prints some bytes at the least, and a comma between.
    let least = (0..layout.fields.len())
        .map(|position| {
            let (count, per_item) = (
                index.counted(position).len(),
                layout.least_per_item[position],
            );
            match (count, per_item) {
                (0, _) | (_, 0) => 0,
                _ => count.saturating_mul(per_item + 1) - 1,
            }
        })
        .fold(0usize, usize::saturating_add);
    printer.check_limit_ahead(least).map_err(print_err)?;
    for position in 0..layout.fields.len() {
        let found = index.counted(position);
        one_field(printer, layout, position, &index, found, first)?;
    }
    Ok(())
}

fn one_field(
    printer: &mut Printer,
    layout: &Layout,
    position: usize,
    index: &Index,
    found: &[u32],
    first: &mut bool,
) -> Result {
    let (field, shape) = (&layout.fields[position], layout.shapes[position]);
    let (kind, key) = (&layout.kinds[position], &*layout.keys[position]);
    // Fields without presence print their default under emit_defaults.
    let emit = printer.options.emit_defaults && !shape.presence;
    if shape.map {
        if found.is_empty() && !emit {
            return Ok(());
        }
        printer.quoted_key(key, first);
        return map(printer, field, index, found);
    }
    if shape.list {
        let count = items(printer, field, index, found, |p| {
            p.quoted_key(key, first);
            p.out.push('[');
        })?;
        if count > 0 {
            printer.out.push(']');
        } else if emit {
            printer.quoted_key(key, first);
            printer.out.push_str("[]");
        }
        return Ok(());
    }
    if shape.message {
        if found.is_empty() {
            return Ok(());
        }
        let Kind::Message(desc) = kind else {
            return Err(Stop::general());
        };
        let parts = index.payloads(found)?;
        printer.quoted_key(key, first);
        return message(printer, desc, &parts);
    }
    let raw = match found.last() {
        Some(&at) => Some(index.raw_at(at)?.1),
        None => None,
    };
    scalar_field(printer, layout, position, raw, first)
}

/// A singular scalar field whose last occurrence is `raw`.
fn scalar_field(
    printer: &mut Printer,
    layout: &Layout,
    position: usize,
    raw: Option<Raw>,
    first: &mut bool,
) -> Result {
    let (shape, kind, key) = (
        layout.shapes[position],
        &layout.kinds[position],
        &*layout.keys[position],
    );
    // Fields without presence print their default under emit_defaults.
    let emit = printer.options.emit_defaults && !shape.presence;
    match raw {
        Some(raw) => {
            let value = scalar_of(kind, raw).ok_or_else(not_utf8)?;
            if shape.presence || emit || !is_zero(&value) {
                printer.quoted_key(key, first);
                print_scalar(printer, kind, &value).map_err(print_err)?;
            }
        }
        None if emit => {
            printer.quoted_key(key, first);
            print_default(printer, &layout.fields[position])?;
        }
        None => {}
    }
    Ok(())
}

/// The fields of a message of singular scalars (a Point): the last
/// occurrence of each, found in one walk, with no index to build.
fn singular(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    layout: &Layout,
    parts: &[&[u8]],
    first: &mut bool,
) -> Result {
    let level = level(printer);
    let mut last: SmallVec<[Option<Raw>; 16]> = SmallVec::from_elem(None, layout.fields.len());
    for part in parts {
        let mut bytes = *part;
        while !bytes.is_empty() {
            let Some((position, _, raw)) = next_field(desc, layout, &mut bytes, level)? else {
                continue;
            };
            // Every string is checked, printed or not, as the general path
            // decodes them all.
            check_text_of(layout.shapes[position], raw)?;
            last[position] = Some(raw);
        }
    }
    for (position, raw) in last.into_iter().enumerate() {
        scalar_field(printer, layout, position, raw, first)?;
    }
    Ok(())
}

fn print_default(printer: &mut Printer, field: &FieldDescriptor) -> Result {
    printer
        .single(&field.kind(), &field.default_value())
        .map_err(print_err)
}

/// The elements of a repeated field, comma-separated; `open` runs before
/// the first. Returns how many there were.
fn items(
    printer: &mut Printer,
    field: &FieldDescriptor,
    index: &Index,
    found: &[u32],
    mut open: impl FnMut(&mut Printer),
) -> Result<usize> {
    let mut count = 0;
    let mut next = |printer: &mut Printer| {
        if count == 0 {
            open(printer);
        } else {
            printer.out.push(',');
        }
        count += 1;
    };
    let kind = field.kind();
    let shape = Shape::of(field);
    let element = match &kind {
        Kind::Message(desc) => Some(printer.layouts.of(desc)),
        _ => None,
    };
    for &at in found {
        printer.check_limit().map_err(print_err)?;
        let (wire_type, raw) = index.raw_at(at)?;
        match (&kind, raw, &element) {
            (Kind::Message(desc), Raw::Delimited(bytes), Some(layout)) => {
                next(printer);
                message_with(printer, desc, layout.clone(), &[bytes])?;
            }
            (_, Raw::Delimited(packed), _)
                if wire_type == WireType::LengthDelimited && shape.packable =>
            {
                let mut rest = packed;
                while !rest.is_empty() {
                    printer.check_limit().map_err(print_err)?;
                    let raw = read_value(shape.wire, &mut rest)?;
                    let value = scalar_of(&kind, raw).ok_or_else(not_utf8)?;
                    next(printer);
                    print_scalar(printer, &kind, &value).map_err(print_err)?;
                }
            }
            (_, raw, _) => {
                let value = scalar_of(&kind, raw).ok_or_else(not_utf8)?;
                next(printer);
                print_scalar(printer, &kind, &value).map_err(print_err)?;
            }
        }
    }
    Ok(count)
}

/// A string field's value must be UTF-8, as prost-reflect decodes it.
fn check_text_of(shape: Shape, raw: Raw) -> Result {
    match raw {
        Raw::Delimited(b) if shape.string && std::str::from_utf8(b).is_err() => Err(not_utf8()),
        _ => Ok(()),
    }
}

/// Checks bytes that are decoded but never printed (a oneof member set
/// before another, a map entry a later one replaces) as prost-reflect's
/// decoder would: the general path refuses a message whose unprinted
/// parts are malformed, and so must this one. `level` is how deep the
/// message lies below its decoding root (a map entry lies at its map's
/// level: prost does not count it).
fn validate(
    layouts: &mut Layouts,
    desc: &MessageDescriptor,
    mut bytes: &[u8],
    level: usize,
) -> Result {
    if level > PROST_DECODE_LEVELS {
        return Err(Stop::decode("recursion limit reached".into()));
    }
    let layout = layouts.of(desc);
    while !bytes.is_empty() {
        let Some((position, wire_type, raw)) = next_field(desc, &layout, &mut bytes, level)? else {
            continue;
        };
        let shape = layout.shapes[position];
        check_text_of(shape, raw)?;
        let Raw::Delimited(payload) = raw else {
            continue;
        };
        match layout.fields[position].kind() {
            Kind::Message(inner) if shape.map => validate(layouts, &inner, payload, level)?,
            Kind::Message(inner) => validate(layouts, &inner, payload, level + 1)?,
            _ if wire_type == WireType::LengthDelimited && shape.packable => {
                let mut rest = payload;
                while !rest.is_empty() {
                    read_value(shape.wire, &mut rest)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The next known field of a message `level` deep, read as prost-reflect
/// reads it (its wire type checked): its place in the layout, its wire
/// type and value; `None` for an unknown field, which is skipped. An
/// extension is for the general path.
fn next_field<'a>(
    desc: &MessageDescriptor,
    layout: &Layout,
    bytes: &mut &'a [u8],
    level: usize,
) -> Result<Option<(usize, WireType, Raw<'a>)>> {
    let (number, wire_type) = decode_key(bytes)?;
    let Some(position) = layout.position(number) else {
        if layout.extensions && desc.get_extension(number).is_some() {
            return Err(Stop::general());
        }
        skip_unknown(wire_type, number, bytes, budget(level))?;
        return Ok(None);
    };
    let shape = layout.shapes[position];
    check_wire_type(shape, wire_type)?;
    let raw = read_value(stored_as(shape, wire_type), bytes)?;
    Ok(Some((position, wire_type, raw)))
}

/// What prost's recursion budget is for the fields of a message `level`
/// deep (its `DecodeContext` there).
fn budget(level: usize) -> usize {
    PROST_DECODE_LEVELS.saturating_sub(level)
}

/// Skips an unknown field of a message as prost-reflect decodes one: only
/// a group spends the recursion budget.
fn skip_unknown(wire_type: WireType, number: u32, bytes: &mut &[u8], budget: usize) -> Result {
    skip(wire_type, number, bytes, budget, false)
}

/// Skips an unknown field of a map entry as prost's `skip_field` does:
/// each field, groups' fields included, checks the budget.
fn skip_in_entry(wire_type: WireType, number: u32, bytes: &mut &[u8], budget: usize) -> Result {
    skip(wire_type, number, bytes, budget, true)
}

fn skip(
    wire_type: WireType,
    number: u32,
    bytes: &mut &[u8],
    budget: usize,
    every_field: bool,
) -> Result {
    let spent = || Stop::decode("recursion limit reached".into());
    if every_field && budget == 0 {
        return Err(spent());
    }
    match wire_type {
        WireType::StartGroup => {
            if budget == 0 {
                return Err(spent());
            }
            loop {
                let (inner, inner_type) = decode_key(bytes)?;
                if inner_type == WireType::EndGroup {
                    if inner != number {
                        return Err(Stop::decode("unexpected end group tag".into()));
                    }
                    return Ok(());
                }
                skip(inner_type, inner, bytes, budget - 1, every_field)?;
            }
        }
        WireType::EndGroup => Err(Stop::decode("unexpected end group tag".into())),
        other => read_value(other, bytes).map(|_| ()),
    }
}

fn not_utf8() -> Stop {
    Stop::decode("invalid string value: data is not UTF-8 encoded".into())
}

/// A map key, ordered as prost-reflect's `MapKey` (the general printer
/// writes entries in key order).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key<'a> {
    Bool(bool),
    I32(i32),
    I64(i64),
    U32(u32),
    U64(u64),
    Str(&'a str),
}

impl Key<'_> {
    fn write(&self, printer: &mut Printer, first: &mut bool) {
        let mut buf = itoa::Buffer::new();
        let text = match self {
            Key::Bool(b) => {
                if *b {
                    "true"
                } else {
                    "false"
                }
            }
            Key::I32(n) => buf.format(*n),
            Key::I64(n) => buf.format(*n),
            Key::U32(n) => buf.format(*n),
            Key::U64(n) => buf.format(*n),
            Key::Str(s) => s,
        };
        printer.key(text, first);
    }
}

/// A map field's entries: the last entry of each key, in key order.
fn map(printer: &mut Printer, field: &FieldDescriptor, index: &Index, found: &[u32]) -> Result {
    let Kind::Message(entry) = field.kind() else {
        return Err(Stop::general());
    };
    let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
    let shapes = (Shape::of(&key_field), Shape::of(&value_field));
    let mut entries: Vec<(Key, u32)> = Vec::with_capacity(found.len().min(1024));
    for &at in found {
        let bytes = index.payload_at(at)?;
        if entries.len() == entries.capacity() {
            // Before growing, keep only the last entry of each key: a
            // flood of one key costs nothing.
            last_of_each_key(&mut printer.layouts, &mut entries, &entry, index)?;
        }
        let key = entry_key(&key_field, shapes, bytes, index.level)?;
        entries.push((key, at));
    }
    last_of_each_key(&mut printer.layouts, &mut entries, &entry, index)?;
    printer.out.push('{');
    let mut first = true;
    for (key, at) in &entries {
        printer.check_limit().map_err(print_err)?;
        key.write(printer, &mut first);
        entry_value(printer, &value_field, index.payload_at(*at)?, index.level)?;
    }
    printer.out.push('}');
    Ok(())
}

/// Sorts `entries` by key and keeps the last of each key (equal keys stay
/// in wire order). A replaced entry is never printed but still checked,
/// as the general path decodes it.
fn last_of_each_key(
    layouts: &mut Layouts,
    entries: &mut Vec<(Key, u32)>,
    entry: &MessageDescriptor,
    index: &Index,
) -> Result {
    entries.sort_unstable();
    let mut replaced = Ok(());
    let mut kept = 0;
    for i in 0..entries.len() {
        if entries
            .get(i + 1)
            .is_some_and(|(next, _)| *next == entries[i].0)
        {
            if replaced.is_ok() {
                replaced = index
                    .payload_at(entries[i].1)
                    .and_then(|bytes| validate(layouts, entry, bytes, index.level));
            }
            continue;
        }
        entries.swap(kept, i);
        kept += 1;
    }
    entries.truncate(kept);
    replaced
}

/// The key of a map entry (its last one; the kind's default when none),
/// checking every field of the entry as prost-reflect's decoder would.
fn entry_key<'a>(
    key_field: &FieldDescriptor,
    (key_shape, value_shape): (Shape, Shape),
    mut bytes: &'a [u8],
    level: usize,
) -> Result<Key<'a>> {
    let mut key = None;
    while !bytes.is_empty() {
        let (number, wire_type) = decode_key(&mut bytes)?;
        match number {
            1 => {
                check_wire_type(key_shape, wire_type)?;
                let raw = read_value(wire_type, &mut bytes)?;
                check_text_of(key_shape, raw)?;
                key = Some(raw);
            }
            2 => {
                check_wire_type(value_shape, wire_type)?;
                check_text_of(value_shape, read_value(wire_type, &mut bytes)?)?;
            }
            _ => skip_in_entry(wire_type, number, &mut bytes, budget(level))?,
        }
    }
    let value = match key {
        Some(raw) => scalar(key_field, raw).ok_or_else(not_utf8)?,
        None => return default_key(key_field),
    };
    Ok(match value {
        Scalar::Str(s) => Key::Str(s),
        Scalar::Other(Value::Bool(b)) => Key::Bool(b),
        Scalar::Other(Value::I32(n)) => Key::I32(n),
        Scalar::Other(Value::I64(n)) => Key::I64(n),
        Scalar::Other(Value::U32(n)) => Key::U32(n),
        Scalar::Other(Value::U64(n)) => Key::U64(n),
        _ => return Err(Stop::general()),
    })
}

fn default_key(key_field: &FieldDescriptor) -> Result<Key<'static>> {
    Ok(match key_field.default_value() {
        Value::String(_) => Key::Str(""),
        Value::Bool(b) => Key::Bool(b),
        Value::I32(n) => Key::I32(n),
        Value::I64(n) => Key::I64(n),
        Value::U32(n) => Key::U32(n),
        Value::U64(n) => Key::U64(n),
        _ => return Err(Stop::general()),
    })
}

/// The value of a map entry: its last one, or its occurrences merged for
/// a message; the kind's default when it has none.
fn entry_value(
    printer: &mut Printer,
    value_field: &FieldDescriptor,
    mut bytes: &[u8],
    level: usize,
) -> Result {
    let mut last = None;
    let mut parts = Vec::new();
    while !bytes.is_empty() {
        let (number, wire_type) = decode_key(&mut bytes)?;
        match number {
            // The key, which `entry_key` read and checked.
            1 => {
                read_value(wire_type, &mut bytes)?;
                continue;
            }
            2 => {}
            _ => {
                skip_in_entry(wire_type, number, &mut bytes, budget(level))?;
                continue;
            }
        }
        let raw = read_value(wire_type, &mut bytes)?;
        match raw {
            Raw::Delimited(b) if matches!(value_field.kind(), Kind::Message(_)) => parts.push(b),
            raw => last = Some(raw),
        }
    }
    if let Kind::Message(desc) = value_field.kind() {
        return message(printer, &desc, &parts);
    }
    match last {
        Some(raw) => {
            let value = scalar(value_field, raw).ok_or_else(not_utf8)?;
            print_scalar(printer, &value_field.kind(), &value).map_err(print_err)
        }
        None => print_default(printer, value_field),
    }
}

/// A Timestamp or a Duration, read in one walk without an index: lists of
/// them are common, and an index cost more than their two fields.
fn time(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    layout: &Layout,
    parts: &[&[u8]],
) -> Result {
    let (mut seconds, mut nanos) = (0, 0);
    let level = level(printer);
    // Their own two fields, each under its one-byte key, are read here
    // directly (as prost reads an int64 and an int32); anything else goes
    // the general way.
    let standard = layout.plain_time;
    for part in parts {
        let mut bytes = *part;
        while let Some((&key, rest)) = bytes.split_first() {
            if standard && (key == 0x08 || key == 0x10) {
                bytes = rest;
                let value = decode_varint(&mut bytes)?;
                if key == 0x08 {
                    seconds = value as i64;
                } else {
                    nanos = value as i32;
                }
                continue;
            }
            let Some((position, _, raw)) = next_field(desc, layout, &mut bytes, level)? else {
                continue;
            };
            // The last occurrence wins.
            match (
                layout.numbers[position],
                scalar_of(&layout.kinds[position], raw),
            ) {
                (1, Some(Scalar::Other(Value::I64(s)))) => seconds = s,
                (2, Some(Scalar::Other(Value::I32(n)))) => nanos = n,
                _ => return Err(Stop::general()),
            }
        }
    }
    let timestamp = layout.well_known == Some(WellKnown::Timestamp);
    if printer.only_counts() {
        let len = if timestamp {
            wkt::timestamp_len(seconds, nanos)
        } else {
            wkt::duration_len(seconds, nanos)
        };
        if let Some(len) = len {
            // And its quotes.
            printer.count(len + 2);
            return Ok(());
        }
    }
    // Written in place: the text needs no escaping.
    printer.out.push('"');
    let (written, what) = if timestamp {
        (
            wkt::write_timestamp(seconds, nanos, &mut printer.out),
            "timestamp",
        )
    } else {
        (
            wkt::write_duration(seconds, nanos, &mut printer.out),
            "duration",
        )
    };
    if !written {
        return Err(Stop::print(format!(
            "{what} out of range: {seconds}s {nanos}ns"
        )));
    }
    printer.out.push('"');
    Ok(())
}

fn well_known(
    printer: &mut Printer,
    desc: &MessageDescriptor,
    layout: Rc<Layout>,
    wkt: WellKnown,
    parts: &[&[u8]],
) -> Result {
    let index = Index::new(layout, desc, parts, level(printer), &mut printer.layouts)?;
    let field = |number: u32| index.field(number);
    match wkt {
        // Printed by `time`.
        WellKnown::Timestamp | WellKnown::Duration => return Err(Stop::general()),
        WellKnown::Wrapper => {
            let (value_field, found) = field(1)?;
            match index.last(value_field, found)? {
                Some(value) => {
                    print_scalar(printer, &value_field.kind(), &value).map_err(print_err)?
                }
                None => print_default(printer, value_field)?,
            }
        }
        WellKnown::FieldMask => {
            let (paths, found) = field(1)?;
            let mut joined = String::new();
            for (i, &at) in found.iter().enumerate() {
                let Scalar::Str(path) = index.scalar_at(paths, at)? else {
                    return Err(Stop::general());
                };
                let json = wkt::path_to_json(path).ok_or_else(|| {
                    Stop::print(format!("field mask path '{path}' has no JSON form"))
                })?;
                if i > 0 {
                    joined.push(',');
                }
                joined.push_str(&json);
            }
            printer.string(&joined);
        }
        WellKnown::Struct => {
            let (entries, found) = field(1)?;
            map(printer, entries, &index, found)?;
        }
        WellKnown::ListValue => {
            let (values, found) = field(1)?;
            printer.out.push('[');
            items(printer, values, &index, found, |_| {})?;
            printer.out.push(']');
        }
        WellKnown::Value => value(printer, desc, &index)?,
        WellKnown::Any => any(printer, desc, &index)?,
    }
    Ok(())
}

/// `google.protobuf.Value`: the member of its oneof set last.
fn value(printer: &mut Printer, desc: &MessageDescriptor, index: &Index) -> Result {
    for (position, field) in desc.fields().enumerate() {
        let found = index.counted(position);
        if found.is_empty() {
            continue;
        }
        if let Kind::Message(inner) = field.kind() {
            let parts = index.payloads(found)?;
            return message(printer, &inner, &parts);
        }
        let value = index.last(&field, found)?.ok_or(Stop::general())?;
        match (field.number(), &value) {
            (1, _) => printer.out.push_str("null"),
            (2, Scalar::Other(Value::F64(f))) if !f.is_finite() => {
                return Err(Stop::print(
                    "google.protobuf.Value cannot hold NaN or Infinity".into(),
                ))
            }
            _ => print_scalar(printer, &field.kind(), &value).map_err(print_err)?,
        }
        return Ok(());
    }
    Err(Stop::print("google.protobuf.Value has no kind set".into()))
}

/// `google.protobuf.Any`: `{"@type": url, ...fields}`, or `"value"` for
/// a well-known type.
fn any(printer: &mut Printer, desc: &MessageDescriptor, index: &Index) -> Result {
    let last = |number: u32| {
        let (field, found) = index.field(number)?;
        index.last(field, found)
    };
    let type_url = match last(1)? {
        Some(Scalar::Str(s)) => s,
        _ => "",
    };
    let bytes = match last(2)? {
        Some(Scalar::Bytes(b)) => b,
        _ => &[],
    };
    if type_url.is_empty() && bytes.is_empty() {
        printer.out.push_str("{}");
        return Ok(());
    }
    let inner = any_type(desc, type_url).map_err(Stop::print)?;
    let in_any = |stop: Stop| match stop.why() {
        Why::Decode(e) => Stop::print(format!("Any of {type_url} does not decode: {e}")),
        Why::General => Stop::general(),
        Why::Print(e) => Stop::print(e),
    };
    printer.out.push('{');
    let mut first = true;
    printer.key("@type", &mut first);
    printer.string(type_url);
    // The payload is a message of its own, decoded from its root as the
    // general path decodes it.
    let outer = std::mem::replace(&mut printer.wire_level, 0);
    let result = if printer.layouts.of(&inner).well_known.is_some() {
        printer.key("value", &mut first);
        message(printer, &inner, &[bytes])
    } else {
        printer.wire_level = 1;
        let layout = printer.layouts.of(&inner);
        fields(printer, &inner, &layout, &[bytes], &mut first)
    };
    printer.wire_level = outer;
    result.map_err(in_any)?;
    printer.out.push('}');
    Ok(())
}

fn check_wire_type(shape: Shape, wire_type: WireType) -> Result {
    if shape.group {
        return Err(Stop::general());
    }
    if shape.map {
        return Ok(());
    }
    let expected = shape.wire;
    let packed = shape.list && wire_type == WireType::LengthDelimited && shape.packable;
    if wire_type == expected || packed {
        Ok(())
    } else {
        Err(Stop::decode(format!(
            "invalid wire type: {wire_type:?} (expected {expected:?})"
        )))
    }
}

/// How a field's value is read: as its key says, but a map entry is
/// always length-delimited (prost-reflect reads it so whatever the key's
/// wire type; the general path accepts such bytes, and so does this one).
fn stored_as(shape: Shape, wire_type: WireType) -> WireType {
    if shape.map {
        WireType::LengthDelimited
    } else {
        wire_type
    }
}

/// One value of `wire_type`; the buffer moves past it. Groups are for the
/// caller.
#[inline]
fn read_value<'a>(wire_type: WireType, bytes: &mut &'a [u8]) -> Result<Raw<'a>> {
    let underflow = || Stop::decode("buffer underflow".into());
    Ok(match wire_type {
        WireType::Varint => Raw::Varint(decode_varint(bytes)?),
        WireType::ThirtyTwoBit => {
            let (head, rest) = bytes.split_first_chunk::<4>().ok_or_else(underflow)?;
            *bytes = rest;
            Raw::Fixed32(u32::from_le_bytes(*head))
        }
        WireType::SixtyFourBit => {
            let (head, rest) = bytes.split_first_chunk::<8>().ok_or_else(underflow)?;
            *bytes = rest;
            Raw::Fixed64(u64::from_le_bytes(*head))
        }
        WireType::LengthDelimited => {
            let len = usize::try_from(decode_varint(bytes)?).map_err(|_| underflow())?;
            if len > bytes.len() {
                return Err(underflow());
            }
            let (head, rest) = bytes.split_at(len);
            *bytes = rest;
            Raw::Delimited(head)
        }
        WireType::StartGroup | WireType::EndGroup => return Err(Stop::general()),
    })
}

/// Where each known field of one message occurs: the offsets of its
/// occurrences in the concatenation of the message's parts, grouped by
/// field (in number order) and in wire order within a field. Four
/// bytes per occurrence, and an occurrence takes at least two bytes of
/// wire.
struct Index<'a> {
    parts: &'a [&'a [u8]],
    /// The message's fields, in the order `MessageDescriptor::fields` gives
    /// them (number order, which JSON follows; not the declaration order).
    layout: Rc<Layout>,
    /// How deep the message lies below its decoding root (see [`level`]).
    level: usize,
    /// Where each part starts in the concatenation.
    bases: SmallVec<[u32; 2]>,
    /// `found[starts[i]..starts[i + 1]]` are field i's offsets.
    starts: SmallVec<[u32; 16]>,
    found: SmallVec<[u32; 16]>,
    /// Per field, where the occurrences that count start (empty for a
    /// message without oneofs); see [`Index::counted`].
    from: SmallVec<[u32; 16]>,
}

impl<'a> Index<'a> {
    fn new(
        layout: Rc<Layout>,
        desc: &MessageDescriptor,
        parts: &'a [&'a [u8]],
        level: usize,
        layouts: &mut Layouts,
    ) -> Result<Index<'a>> {
        let mut bases = SmallVec::with_capacity(parts.len());
        let mut total: u32 = 0;
        for part in parts {
            bases.push(total);
            let len = u32::try_from(part.len()).map_err(|_| Stop::general())?;
            total = total.checked_add(len).ok_or(Stop::general())?;
        }
        let fields = layout.numbers.len();
        let mut index = Index {
            parts,
            layout,
            level,
            bases,
            starts: SmallVec::from_elem(0, fields + 1),
            found: SmallVec::new(),
            from: SmallVec::new(),
        };
        if index.layout.singular {
            index.last_occurrences(desc)?;
            return Ok(index);
        }
        // Two walks: the first counts each field's occurrences (into the
        // start of the next field), the second writes their offsets in place.
        let mut starts = std::mem::take(&mut index.starts);
        // The first walk also checks every string, printed or not (a value
        // replaced by a later one is still decoded by the general path).
        index.walk(desc, true, |position, _| starts[position + 1] += 1)?;
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut next: SmallVec<[u32; 16]> = SmallVec::from_slice(&starts[..fields]);
        let mut found = SmallVec::from_elem(0, starts[fields] as usize);
        index.walk(desc, false, |position, at| {
            found[next[position] as usize] = at;
            next[position] += 1;
        })?;
        index.starts = starts;
        index.found = found;
        index.settle_oneofs(desc, layouts)?;
        Ok(index)
    }

    /// The index of a message whose fields are all singular scalars: only
    /// the last occurrence of each counts (an earlier one is replaced), so
    /// one walk finds it. Every string is still checked.
    fn last_occurrences(&mut self, desc: &MessageDescriptor) -> Result {
        let mut last: SmallVec<[u32; 16]> =
            SmallVec::from_elem(u32::MAX, self.layout.numbers.len());
        self.walk(desc, true, |position, at| last[position] = at)?;
        self.starts.clear();
        self.starts.push(0);
        for at in last {
            if at != u32::MAX {
                self.found.push(at);
            }
            self.starts.push(self.found.len() as u32);
        }
        Ok(())
    }

    /// Calls `each(field position, offset)` for every known field in wire
    /// order, checking wire types and skipping unknown fields as
    /// prost-reflect's decoder does.
    fn walk(
        &self,
        desc: &MessageDescriptor,
        check_text: bool,
        mut each: impl FnMut(usize, u32),
    ) -> Result {
        for (part, base) in self.parts.iter().zip(&self.bases) {
            let mut bytes: &[u8] = part;
            while !bytes.is_empty() {
                let at = base + (part.len() - bytes.len()) as u32;
                let Some((position, _, raw)) =
                    next_field(desc, &self.layout, &mut bytes, self.level)?
                else {
                    continue;
                };
                if check_text {
                    check_text_of(self.layout.shapes[position], raw)?;
                }
                each(position, at);
            }
        }
        Ok(())
    }

    /// A field's place among its message's fields, as
    /// `MessageDescriptor::fields` lists them.
    fn position(&self, field: &FieldDescriptor) -> Option<usize> {
        self.layout.position(field.number())
    }

    /// The occurrences of field `position` that count: for a member of a
    /// oneof, none unless it was set last, and then only those after the
    /// last occurrence of any other member (setting a member clears the
    /// others).
    fn counted(&self, position: usize) -> &[u32] {
        let own = &self.found[self.starts[position] as usize..self.starts[position + 1] as usize];
        match self.from.get(position) {
            Some(&u32::MAX) => &[],
            Some(&from) => &own[own.partition_point(|&at| at < from)..],
            None => own,
        }
    }

    /// Where each oneof member's counted occurrences start (`u32::MAX`:
    /// another member was set after it), found once per message so that
    /// a wide oneof costs its width, not its width squared, per message.
    fn settle_oneofs(&mut self, desc: &MessageDescriptor, layouts: &mut Layouts) -> Result {
        if desc.oneofs().len() == 0 {
            return Ok(());
        }
        let mut from: SmallVec<[u32; 16]> = SmallVec::from_elem(0, self.layout.numbers.len());
        for oneof in desc.oneofs() {
            // The member set last, and the latest offset of any other.
            let mut winner: Option<(usize, u32)> = None;
            let mut runner_up: Option<u32> = None;
            for member in oneof.fields() {
                let Some(position) = self.position(&member) else {
                    continue;
                };
                let own =
                    &self.found[self.starts[position] as usize..self.starts[position + 1] as usize];
                let Some(&last) = own.last() else {
                    continue;
                };
                match winner {
                    Some((_, best)) if best > last => {
                        from[position] = u32::MAX;
                        runner_up = runner_up.max(Some(last));
                    }
                    Some((loser, best)) => {
                        from[loser] = u32::MAX;
                        runner_up = runner_up.max(Some(best));
                        winner = Some((position, last));
                    }
                    None => winner = Some((position, last)),
                }
            }
            if let (Some((position, _)), Some(other)) = (winner, runner_up) {
                from[position] = other + 1;
            }
        }
        self.from = from;
        self.validate_dropped(desc, layouts)
    }

    /// Validates the occurrences of message members of oneofs that a
    /// later member cleared (see [`validate`]).
    fn validate_dropped(&self, desc: &MessageDescriptor, layouts: &mut Layouts) -> Result {
        for oneof in desc.oneofs() {
            for member in oneof.fields() {
                let Kind::Message(inner) = member.kind() else {
                    continue;
                };
                let Some(position) = self.position(&member) else {
                    continue;
                };
                let own =
                    &self.found[self.starts[position] as usize..self.starts[position + 1] as usize];
                let kept = self.counted(position).len();
                for &at in &own[..own.len() - kept] {
                    validate(layouts, &inner, self.payload_at(at)?, self.level + 1)?;
                }
            }
        }
        Ok(())
    }

    /// A field of a well-known type by number, and its occurrences that count.
    fn field(&self, number: u32) -> Result<(&FieldDescriptor, &[u32])> {
        let position = self.layout.position(number).ok_or(Stop::general())?;
        Ok((&self.layout.fields[position], self.counted(position)))
    }

    /// The value a singular field ends with, if it occurs.
    fn last(&self, field: &FieldDescriptor, found: &[u32]) -> Result<Option<Scalar<'a>>> {
        match found.last() {
            Some(&at) => self.scalar_at(field, at).map(Some),
            None => Ok(None),
        }
    }

    /// The bytes from offset `at` of the concatenation to the end of its part.
    fn bytes_at(&self, at: u32) -> &'a [u8] {
        let parts: &'a [&'a [u8]] = self.parts;
        if let [bytes] = parts {
            // One part (all but a message given in pieces): at is its offset.
            return &bytes[at as usize..];
        }
        let part = self
            .bases
            .partition_point(|&base| base <= at)
            .saturating_sub(1);
        let parts: &'a [&'a [u8]] = self.parts;
        let bytes: &'a [u8] = parts[part];
        &bytes[(at - self.bases[part]) as usize..]
    }

    /// The field occurrence at `at`: its wire type and value.
    fn raw_at(&self, at: u32) -> Result<(WireType, Raw<'a>)> {
        let mut bytes = self.bytes_at(at);
        let (_, wire_type) = decode_key(&mut bytes)?;
        Ok((wire_type, read_value(wire_type, &mut bytes)?))
    }

    fn scalar_at(&self, field: &FieldDescriptor, at: u32) -> Result<Scalar<'a>> {
        let (_, raw) = self.raw_at(at)?;
        scalar(field, raw).ok_or_else(not_utf8)
    }

    /// The payload of an occurrence of a message or map field (which
    /// `walk` read as length-delimited).
    fn payload_at(&self, at: u32) -> Result<&'a [u8]> {
        let mut bytes = self.bytes_at(at);
        decode_key(&mut bytes)?;
        match read_value(WireType::LengthDelimited, &mut bytes)? {
            Raw::Delimited(payload) => Ok(payload),
            _ => Err(Stop::general()),
        }
    }

    fn payloads(&self, found: &[u32]) -> Result<Vec<&'a [u8]>> {
        let mut parts = Vec::with_capacity(found.len());
        for &at in found {
            parts.push(self.payload_at(at)?);
        }
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Registry;
    use crate::json::{
        decode_message, every_print_option, json_to_protobuf, message_to_json, JsonOptions,
    };

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "fuzz.proto",
            include_str!("../../../fuzz/schema/fuzz.proto"),
        )])
        .unwrap();
        r
    }

    /// Ok(JSON), or the kind of failure: "decode" or "print".
    type Outcome = std::result::Result<String, &'static str>;

    fn by_wire(desc: &MessageDescriptor, bytes: &[u8], options: &JsonOptions) -> Option<Outcome> {
        let mut printer = Printer::new(options, 64);
        match print(&mut printer, desc, bytes).map_err(Stop::why) {
            Ok(()) => Some(Ok(printer.out)),
            Err(Why::Decode(_)) => Some(Err("decode")),
            Err(Why::Print(_)) => Some(Err("print")),
            Err(Why::General) => None,
        }
    }

    fn by_tree(desc: &MessageDescriptor, bytes: &[u8], options: &JsonOptions) -> Outcome {
        let message = decode_message(desc, bytes).map_err(|_| "decode")?;
        message_to_json(&message, options).map_err(|_| "print")
    }

    fn same(desc: &MessageDescriptor, bytes: &[u8]) {
        for options in [JsonOptions::default(), every_print_option()] {
            // Both fail, or both print the same. Which fault is named may
            // differ: the general path decodes everything before it prints.
            let failed = |_| "failed";
            // A proto3 schema needs nothing of the general path.
            let wire = by_wire(desc, bytes, &options).expect("printed from the wire");
            assert_eq!(
                wire.map_err(failed),
                by_tree(desc, bytes, &options).map_err(failed),
                "{} {bytes:02x?}",
                desc.full_name()
            );
        }
    }

    const SEEDS: [&str; 6] = [
        r#"{"doubleValue": 1.5, "int64Value": "-7", "text": "héllo", "data": "AP8=", "kind": "KIND_NEGATIVE",
            "maybe": 0, "doubles": [1, "NaN"], "int64s": ["1", "-2"], "bools": [true, false],
            "texts": ["a", ""], "kinds": ["KIND_ONE", 5], "children": [{"text": "c"}, {}]}"#,
        r#"{"byName": {"b": {"int32Value": 2}, "a": {}}, "byNumber": {"-3": "x", "10": ""},
            "byFlag": {"true": "KIND_ONE", "false": 0}, "byId": {"7": "AQ=="}, "choiceText": "pick"}"#,
        r#"{"child": {"child": {"text": "deep"}, "uint64Value": "18446744073709551615"}}"#,
        r#"{"any": {"@type": "type.googleapis.com/google.protobuf.Duration", "value": "1.5s"},
            "anys": [{"@type": "type.googleapis.com/grpcwasm.fuzz.Everything", "text": "in"}, {}],
            "structValue": {"k": [1, "two", null, {"x": true}]}, "value": 3,
            "list": [[], {}], "choiceValue": {"z": null}}"#,
        r#"{"null": null, "floatValue": -0.0, "sint32Value": -1, "sfixed64Value": "5"}"#,
        r#"{"datas": [], "fixed64s": ["1", "2"], "sint32s": [-1, 1], "floats": [0.5]}"#,
    ];

    fn seeds(desc: &MessageDescriptor) -> Vec<Vec<u8>> {
        SEEDS
            .iter()
            .filter_map(|json| {
                json_to_protobuf(desc, json.as_bytes(), &JsonOptions::default()).ok()
            })
            .collect()
    }

    #[test]
    fn prints_what_the_general_path_prints() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let seeds = seeds(&desc);
        assert!(seeds.len() >= 5, "{}", seeds.len());
        for a in &seeds {
            same(&desc, a);
            for b in &seeds {
                // One message after another merges them.
                same(&desc, &[a.as_slice(), b.as_slice()].concat());
            }
        }
    }

    #[test]
    fn agrees_with_the_general_path_on_damaged_bytes() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n.max(1) as u64) as usize
        };
        for seed in seeds(&desc) {
            for _ in 0..3000 {
                let mut bytes = seed.clone();
                for _ in 0..1 + random(3) {
                    match random(3) {
                        0 if !bytes.is_empty() => {
                            let at = random(bytes.len());
                            bytes[at] = random(256) as u8;
                        }
                        1 => bytes.truncate(random(bytes.len() + 1)),
                        0 => {}
                        _ => {
                            let at = random(bytes.len());
                            let len = random(bytes.len() - at + 1);
                            let piece = bytes[at..at + len].to_vec();
                            let to = random(bytes.len() + 1);
                            bytes.splice(to..to, piece);
                        }
                    }
                }
                same(&desc, &bytes);
            }
        }
    }

    #[test]
    fn a_oneof_keeps_the_member_set_last_and_merges_only_after_it() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let o = JsonOptions::default();
        // child{text:"a"}, choice_text "t", child{int32_value:1}
        let bytes = [
            0x92, 0x03, 0x03, 0x72, 0x01, b'a', 0x9a, 0x03, 0x01, b't', 0x92, 0x03, 0x02, 0x18,
            0x01,
        ];
        assert_eq!(
            by_wire(&desc, &bytes, &o),
            Some(Ok(r#"{"child":{"int32Value":1}}"#.into()))
        );
        same(&desc, &bytes);
    }

    #[test]
    fn map_entries_replace_each_other_by_key_and_print_in_key_order() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        // by_number: {5: "x"}, {-1: "y"}, {5: "z"}, and an empty entry.
        let entry = |key: &[u8], value: u8| {
            let mut e = vec![0x08];
            e.extend_from_slice(key);
            e.extend_from_slice(&[0x12, 0x01, value]);
            let mut out = vec![0xca, 0x02, e.len() as u8];
            out.extend(e);
            out
        };
        let minus_one = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        let bytes = [
            entry(&[5], b'x'),
            entry(&minus_one, b'y'),
            entry(&[5], b'z'),
            vec![0xca, 0x02, 0x00],
        ]
        .concat();
        assert_eq!(
            by_wire(&desc, &bytes, &JsonOptions::default()),
            Some(Ok(r#"{"byNumber":{"-1":"y","0":"","5":"z"}}"#.into()))
        );
        same(&desc, &bytes);
    }

    #[test]
    fn fields_declared_out_of_number_order_print_in_number_order() {
        // protobuf's conformance messages declare fields out of order; an
        // index by declaration place once printed field 57 as field 39's.
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "o.proto",
            r#"syntax = "proto3";
package o;
message M {
  repeated float z = 39;
  map<int32, int32> m = 56;
  int32 b = 2;
  map<int64, int64> n = 57;
  oneof pick { string s = 9; int32 a = 1; }
}"#,
        )])
        .unwrap();
        let desc = r.message("o.M").unwrap();
        let bytes = [
            0xca, 0x03, 0x04, 0x08, 0x01, 0x10, 0x01, 0xc2, 0x03, 0x04, 0x08, 0x00, 0x10, 0x00,
            0x10, 0x07, 0x4a, 0x01, b'x', 0x08, 0x05,
        ];
        assert_eq!(
            by_wire(&desc, &bytes, &JsonOptions::default()),
            Some(Ok(r#"{"a":5,"b":7,"m":{"0":0},"n":{"1":"1"}}"#.into()))
        );
        same(&desc, &bytes);
    }

    #[test]
    fn bytes_that_are_never_printed_are_still_checked() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let o = JsonOptions::default();
        // child{text: cut short}, then choice_text "t": the child is
        // cleared unprinted, but the general path decoded it first.
        let cleared = [0x92, 0x03, 0x02, 0x72, 0x05, 0x9a, 0x03, 0x01, b't'];
        // text = "\xff" then text = "ok": the first is replaced.
        let replaced_text = [0x72, 0x01, 0xff, 0x72, 0x02, b'o', b'k'];
        // by_name {"a": {text: "\xff"}} then {"a": {}}.
        let replaced_entry = [
            0xc2, 0x02, 0x08, 0x0a, 0x01, b'a', 0x12, 0x03, 0x72, 0x01, 0xff, 0xc2, 0x02, 0x05,
            0x0a, 0x01, b'a', 0x12, 0x00,
        ];
        for bytes in [&cleared[..], &replaced_text, &replaced_entry] {
            assert_eq!(
                by_wire(&desc, bytes, &o),
                Some(Err("decode")),
                "{bytes:02x?}"
            );
            same(&desc, bytes);
        }
        // Well formed, the same bytes print the member set last.
        let fine = [0x92, 0x03, 0x02, 0x18, 0x01, 0x9a, 0x03, 0x01, b't'];
        assert_eq!(
            by_wire(&desc, &fine, &o),
            Some(Ok(r#"{"choiceText":"t"}"#.into()))
        );
    }

    #[test]
    fn every_key_and_value_of_a_map_entry_is_checked() {
        // Found by review: only an entry's last key and value were.
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let o = JsonOptions::default();
        let key_twice = [0xc2, 0x02, 0x06, 0x0a, 0x01, 0xff, 0x0a, 0x01, b'a'];
        let value_twice = [
            0xca, 0x02, 0x08, 0x08, 0x01, 0x12, 0x01, 0xff, 0x12, 0x01, b'a',
        ];
        for bytes in [&key_twice[..], &value_twice] {
            assert_eq!(
                by_wire(&desc, bytes, &o),
                Some(Err("decode")),
                "{bytes:02x?}"
            );
            same(&desc, bytes);
        }
    }

    #[test]
    fn unknown_groups_spend_the_decoders_recursion_budget() {
        // A child (level 1) holding 100 nested unknown groups: prost's
        // decoder allows 99 there.
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let nest = |groups: usize| {
            let inner = [[0xa3, 0x06].repeat(groups), [0xa4, 0x06].repeat(groups)].concat();
            let mut bytes = vec![0xf2, 0x01];
            prost::encoding::encode_varint(inner.len() as u64, &mut bytes);
            bytes.extend(inner);
            bytes
        };
        let o = JsonOptions::default();
        assert_eq!(
            by_wire(&desc, &nest(99), &o),
            Some(Ok(r#"{"children":[{}]}"#.into()))
        );
        assert_eq!(by_wire(&desc, &nest(100), &o), Some(Err("decode")));
        same(&desc, &nest(99));
        same(&desc, &nest(100));
    }

    #[test]
    fn the_json_limit_holds_for_the_whole_message_wherever_it_is_checked() {
        // Found by review: the two paths checked the limit at different
        // values, so each let through a message the other refused.
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let kinds = |n: usize, tail: &[u8]| {
            let mut bytes = vec![0xea, 0x01];
            prost::encoding::encode_varint(n as u64, &mut bytes);
            bytes.extend(std::iter::repeat_n(1u8, n));
            bytes.extend_from_slice(tail);
            bytes
        };
        for bytes in [
            kinds(21862, &[0xe2, 0x03, 0x00]),
            kinds(21864, &[0xea, 0x01, 0x00]),
        ] {
            let err =
                crate::json::protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap_err();
            assert!(matches!(err, crate::Error::TooCostly { .. }), "{err}");
        }
    }

    #[test]
    fn unknown_fields_cost_nothing_and_bad_ones_fail() {
        let r = registry();
        let desc = r.message("grpcwasm.fuzz.Everything").unwrap();
        let o = JsonOptions::default();
        let unknown = [0xf8, 0x3e, 0x01].repeat(1000);
        assert_eq!(by_wire(&desc, &unknown, &o), Some(Ok("{}".into())));
        // A known field in the wrong wire type, a cut length, bad UTF-8.
        for bytes in [
            &[0x18, 0x00][..1],
            &[0x1a, 0x00],
            &[0x72, 0x05, b'a'],
            &[0x72, 0x01, 0xff],
        ] {
            assert_eq!(
                by_wire(&desc, bytes, &o),
                Some(Err("decode")),
                "{bytes:02x?}"
            );
            same(&desc, bytes);
        }
    }
}
