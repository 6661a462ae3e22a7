//! JSON → protobuf in one pass. serde_json reads the text and each value
//! is written to the wire as it is read, by the rules in `parse.rs`:
//! nothing is built in between (no tree of the document, no
//! `DynamicMessage`), so a request costs its protobuf and, per open
//! message, a few bytes per JSON key. (Building both cost 22x to 95x the
//! body and up to 218 ms per MiB.)
//!
//! The bytes are the ones prost-reflect writes for the same message with
//! map entries sorted (`deterministic.rs`): fields in number order,
//! implicit-presence defaults left out, packable lists packed, map entries
//! with key and value. A message whose keys come out of number order, and
//! a map whose keys come out of order, are put in order when they close.
//!
//! The rules report errors as `ParseError`s with their JSON path; serde
//! carries only its own error type, so the encoder keeps the rule's error
//! and hands serde a placeholder. An error serde reports with no rule's
//! error beside it is a syntax error.

use std::borrow::Cow;

use prost::encoding::{encode_key, encode_varint, WireType};
use prost_reflect::{
    ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor, OneofDescriptor,
};
use serde::de::value::CowStrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use self::parse::{
    expected, kind_takes_null, parse_f64, takes_null, time_string, ParseError, Result,
};
use self::token::{skip_array, skip_object, Key, Token};
use self::write::{entry_key, key_wire, scalar, Entry, Opened, Wire, Wrap};
use super::{wkt, JsonOptions, WellKnown};

mod parse;
mod token;
mod write;
use crate::error::Error;
use crate::limits::{Depth, MAX_ANY_REREADS, MAX_KEYS_BEFORE_TYPE};

/// Encodes the JSON text `json` as a message of type `desc`.
pub(super) fn encode(
    desc: &MessageDescriptor,
    json: &[u8],
    options: &JsonOptions,
) -> std::result::Result<Vec<u8>, Error> {
    encode_message(desc, json, options, false)
}

/// [`encode`], writing every field the JSON gives even when it holds its
/// default: the bytes, appended to another encoding of the message,
/// replace each field they set (an HTTP binding's request line over its
/// body). Left out, a path's `0` or `false` would leave the body's value
/// standing, and a rule that trusts the path would be bypassed.
pub(super) fn encode_explicit(
    desc: &MessageDescriptor,
    json: &[u8],
    options: &JsonOptions,
) -> std::result::Result<Vec<u8>, Error> {
    encode_message(desc, json, options, true)
}

fn encode_message(
    desc: &MessageDescriptor,
    json: &[u8],
    options: &JsonOptions,
    keep_defaults: bool,
) -> std::result::Result<Vec<u8>, Error> {
    let kind = Kind::Message(desc.clone());
    let top = ValueSink {
        kind: &kind,
        tag: None,
        group: false,
        always: true,
        null_error: None,
    };
    run(json, options, top, None, keep_defaults)
}

/// Encodes the JSON text `json` as the value of `desc`'s top-level field
/// `name` (an HTTP binding's `body: "name"`): a message with that field
/// alone.
pub(super) fn encode_field(
    desc: &MessageDescriptor,
    name: &str,
    json: &[u8],
    options: &JsonOptions,
) -> std::result::Result<Vec<u8>, Error> {
    let field = desc
        .get_field_by_name(name)
        .or_else(|| desc.get_field_by_json_name(name))
        .ok_or_else(|| Error::Json {
            path: String::new(),
            message: format!("unknown field '{name}' in {}", desc.full_name()),
        })?;
    run(
        json,
        options,
        FieldSink::of_field(&field),
        Some(name),
        false,
    )
}

/// Reads `json` into `sink`; `field` names the field it is the value of,
/// for errors' paths (the message around it counts as a level).
fn run<'de, S: Sink<'de>>(
    json: &'de [u8],
    options: &JsonOptions,
    sink: S,
    field: Option<&str>,
    keep_defaults: bool,
) -> std::result::Result<Vec<u8>, Error> {
    let mut encoder = Encoder {
        ignore_unknown: options.ignore_unknown_fields,
        keep_defaults,
        fallbacks: 0,
        depth: Depth::default(),
        // Protobuf is about as long as its JSON or shorter, but for
        // negative int32s and enum numbers.
        out: Vec::with_capacity(json.len().min(1 << 20)),
        error: None,
    };
    if field.is_some() {
        encoder.depth.enter().map_err(|message| Error::Json {
            path: String::new(),
            message,
        })?;
    }
    let mut reader = serde_json::Deserializer::from_slice(json);
    let read = Seed {
        enc: &mut encoder,
        sink,
    }
    .deserialize(&mut reader)
    .and_then(|_| reader.end());
    let Err(read) = read else {
        return Ok(encoder.out);
    };
    // A syntax error anywhere wins over what a rule found before it, as
    // when the whole text was read first; only a refused request pays for
    // the second reading.
    let rule = encoder.error.take();
    let syntax = match rule {
        None => Some(read),
        Some(_) => serde_json::from_slice::<IgnoredAny>(json).err(),
    };
    Err(match (syntax, rule) {
        (Some(e), _) => Error::Json {
            path: String::new(),
            message: format!("invalid JSON: {e}"),
        },
        (None, rule) => {
            let mut e = rule.unwrap_or_else(|| ParseError::new("invalid JSON"));
            e.reversed_path.extend(field.map(str::to_string));
            Error::Json {
                path: e.path(),
                message: e.message,
            }
        }
    })
}

struct Encoder {
    ignore_unknown: bool,
    /// See [`encode_explicit`].
    keep_defaults: bool,
    /// How many `Any`s around the value being read were read again from
    /// their raw JSON (their `@type` came after other keys).
    fallbacks: usize,
    /// serde_json stops at 128 levels of JSON; messages are held to the
    /// core's own, smaller limit, as when they are decoded.
    depth: Depth,
    out: Vec<u8>,
    /// The error a rule reported; serde is handed a placeholder.
    error: Option<ParseError>,
}

/// The extension a key names (`[full.name]`).
fn extension(desc: &MessageDescriptor, key: &str) -> Option<ExtensionDescriptor> {
    key.strip_prefix('[')
        .and_then(|k| k.strip_suffix(']'))
        .and_then(|name| desc.get_extension_by_full_name(name))
}

/// Where a JSON value goes. serde hands it over as a token, an object or
/// an array; a reader that takes no objects or arrays skips them and lets
/// its token rule word the error ("expected X, got object").
trait Sink<'de>: Sized {
    /// Returns whether the value counts as given (a skipped null does not).
    fn token(self, enc: &mut Encoder, token: Token<'de>) -> Result<bool>;

    fn object<A: MapAccess<'de>>(self, enc: &mut Encoder, map: A) -> Ret<A::Error> {
        skip_object(map)?;
        enc.rule(self, Token::Object)
    }

    fn array<A: SeqAccess<'de>>(self, enc: &mut Encoder, seq: A) -> Ret<A::Error> {
        skip_array(seq)?;
        enc.rule(self, Token::Array)
    }
}

type Ret<E> = std::result::Result<bool, E>;

impl Encoder {
    /// Runs a sink's rule; its error is kept and serde gets a placeholder.
    fn rule<'de, S: Sink<'de>, E: de::Error>(&mut self, sink: S, token: Token<'de>) -> Ret<E> {
        sink.token(self, token).map_err(|e| self.fail(e))
    }

    fn fail<E: de::Error>(&mut self, error: ParseError) -> E {
        self.error = Some(error);
        E::custom("the JSON does not fit the message type")
    }

    /// Adds a path segment to the kept error as it passes outward.
    fn at<E>(&mut self, error: E, segment: impl FnOnce() -> String) -> E {
        if let Some(kept) = &mut self.error {
            kept.reversed_path.push(segment());
        }
        error
    }

    /// A length placeholder of one byte; `end_len` widens it if need be.
    fn begin_len(&mut self) -> usize {
        self.out.push(0);
        self.out.len() - 1
    }

    fn end_len(&mut self, at: usize) {
        let len = self.out.len() - at - 1;
        if len < 0x80 {
            self.out[at] = len as u8;
            return;
        }
        let mut varint = Vec::with_capacity(10);
        encode_varint(len as u64, &mut varint);
        self.out[at] = varint[0];
        self.out.splice(at + 1..at + 1, varint[1..].iter().copied());
    }

    /// Opens a message: one level deeper, and its key and length (or its
    /// group's start) unless it is written bare (the top level, the value
    /// of an Any).
    fn open(&mut self, wrap: Wrap) -> Result<Opened> {
        self.depth.enter().map_err(ParseError::new)?;
        Ok(match wrap {
            Wrap::Bare => Opened::Bare,
            Wrap::Delimited(tag) => {
                encode_key(tag, WireType::LengthDelimited, &mut self.out);
                Opened::Delimited(self.begin_len())
            }
            Wrap::Group(tag) => {
                encode_key(tag, WireType::StartGroup, &mut self.out);
                Opened::Group(tag)
            }
        })
    }

    fn close(&mut self, opened: Opened) {
        self.depth.leave();
        match opened {
            Opened::Bare => {}
            Opened::Delimited(at) => self.end_len(at),
            Opened::Group(tag) => encode_key(tag, WireType::EndGroup, &mut self.out),
        }
    }

    fn open_in<E: de::Error>(&mut self, wrap: Wrap) -> std::result::Result<Opened, E> {
        self.open(wrap).map_err(|e| self.fail(e))
    }

    /// A message given as a token: the well-known types written as strings,
    /// numbers or null.
    fn message_token(&mut self, desc: &MessageDescriptor, wrap: Wrap, t: Token) -> Result<()> {
        let at = self.open(wrap)?;
        self.well_known_token(desc, t)?;
        self.close(at);
        Ok(())
    }

    fn well_known_token(&mut self, desc: &MessageDescriptor, t: Token) -> Result<()> {
        match WellKnown::of(desc) {
            Some(WellKnown::Timestamp) => {
                let (seconds, nanos) = time_string(
                    &t,
                    "RFC 3339 timestamp string",
                    "timestamp",
                    wkt::parse_timestamp,
                )?;
                self.seconds_and_nanos(seconds, nanos);
            }
            Some(WellKnown::Duration) => {
                let (seconds, nanos) = time_string(
                    &t,
                    "duration string such as \"1.5s\"",
                    "duration",
                    wkt::parse_duration,
                )?;
                self.seconds_and_nanos(seconds, nanos);
            }
            Some(WellKnown::FieldMask) => {
                let Token::String(text) = &t else {
                    return expected("comma-separated paths", &t);
                };
                for p in text.split(',').filter(|p| !p.is_empty()) {
                    let path = wkt::path_from_json(p)
                        .ok_or_else(|| ParseError::new(format!("invalid field mask path '{p}'")))?;
                    Wire::Delimited(Cow::Borrowed(path.as_bytes())).write(Some(1), &mut self.out);
                }
            }
            Some(WellKnown::Wrapper) => {
                let field = desc
                    .get_field(1)
                    .ok_or_else(|| ParseError::new("malformed wrapper type"))?;
                let kind = field.kind();
                let sink = ValueSink {
                    kind: &kind,
                    tag: Some(1),
                    group: false,
                    always: self.keep_defaults,
                    null_error: None,
                };
                sink.token(self, t)?;
            }
            Some(WellKnown::Value) => self.value_token(t)?,
            Some(WellKnown::ListValue) => return expected("array", &t),
            Some(WellKnown::Struct | WellKnown::Any) | None => return expected("object", &t),
        }
        Ok(())
    }

    fn seconds_and_nanos(&mut self, seconds: i64, nanos: i32) {
        for (tag, v) in [(1, seconds), (2, i64::from(nanos))] {
            if v != 0 || self.keep_defaults {
                Wire::Varint(v as u64).write(Some(tag), &mut self.out);
            }
        }
    }

    /// A `google.protobuf.Value` given as a token: its oneof member, written
    /// even when it holds the default.
    fn value_token(&mut self, t: Token) -> Result<()> {
        let (tag, wire) = match &t {
            Token::Null => (1, Wire::Varint(0)),
            Token::Unsigned(_) | Token::Signed(_) | Token::Float(_) => {
                (2, Wire::Fixed64(parse_f64(&t)?.to_bits()))
            }
            Token::String(s) => (3, Wire::Delimited(Cow::Borrowed(s.as_bytes()))),
            Token::Bool(b) => (4, Wire::Varint(u64::from(*b))),
            other => return expected("a JSON value", other),
        };
        wire.write(Some(tag), &mut self.out);
        Ok(())
    }

    fn message_object<'de, A: MapAccess<'de>>(
        &mut self,
        desc: &MessageDescriptor,
        wrap: Wrap,
        map: A,
    ) -> std::result::Result<(), A::Error> {
        let at = self.open_in(wrap)?;
        match WellKnown::of(desc) {
            None => self.fields(desc, map)?,
            Some(WellKnown::Any) => self.any(desc, map)?,
            Some(WellKnown::Struct) => {
                let entry = self.member(desc, 1)?;
                self.map_entries(1, &entry, Keys::Struct, map)?;
            }
            Some(WellKnown::Value) => {
                let s = self.member(desc, 5)?;
                self.message_object(&s, Wrap::Delimited(5), map)?;
            }
            Some(_) => {
                skip_object(map)?;
                let kept = self.well_known_token(desc, Token::Object);
                kept.map_err(|e| self.fail(e))?;
            }
        }
        self.close(at);
        Ok(())
    }

    fn message_array<'de, A: SeqAccess<'de>>(
        &mut self,
        desc: &MessageDescriptor,
        wrap: Wrap,
        seq: A,
    ) -> std::result::Result<(), A::Error> {
        let at = self.open_in(wrap)?;
        match WellKnown::of(desc) {
            Some(WellKnown::ListValue) => {
                let value = self.member(desc, 1)?;
                self.list(1, &Kind::Message(value), false, false, seq)?;
            }
            Some(WellKnown::Value) => {
                let l = self.member(desc, 6)?;
                self.message_array(&l, Wrap::Delimited(6), seq)?;
            }
            _ => {
                skip_array(seq)?;
                let kept = self.well_known_token(desc, Token::Array);
                kept.map_err(|e| self.fail(e))?;
            }
        }
        self.close(at);
        Ok(())
    }

    /// The message type of field `number` of a well-known type.
    fn member<E: de::Error>(
        &mut self,
        desc: &MessageDescriptor,
        number: u32,
    ) -> std::result::Result<MessageDescriptor, E> {
        match desc.get_field(number).map(|f| f.kind()) {
            Some(Kind::Message(m)) => Ok(m),
            _ => Err(self.fail(ParseError::new(format!("malformed {}", desc.full_name())))),
        }
    }

    /// A message's fields, from its JSON object.
    fn fields<'de, A: MapAccess<'de>>(
        &mut self,
        desc: &MessageDescriptor,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        let base = self.out.len();
        // Each field's bytes start where the next one's end: (number, start).
        let mut chunks: SmallVec<[(u32, usize); 8]> = SmallVec::new();
        let mut oneofs: SmallVec<[OneofDescriptor; 2]> = SmallVec::new();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            let start = self.out.len();
            let Some(field) = desc
                .get_field_by_json_name(&key)
                .or_else(|| desc.get_field_by_name(&key))
            else {
                let Some(ext) = extension(desc, &key) else {
                    self.unknown(desc, &key, &mut map)?;
                    continue;
                };
                let number = ext.number();
                if chunks.iter().any(|(n, _)| *n == number) {
                    let e = ParseError::new(format!("field '{key}' is given more than once"));
                    let e = self.fail(e);
                    return Err(self.at(e, || key.into_owned()));
                }
                let sink = FieldSink::of_extension(&ext);
                map.next_value_seed(Seed { enc: self, sink })
                    .map_err(|e| self.at(e, || key.to_string()))?;
                chunks.push((number, start));
                continue;
            };
            let number = field.number();
            if chunks.iter().any(|(n, _)| *n == number) {
                let e =
                    ParseError::new(format!("field '{}' is given more than once", field.name()));
                let e = self.fail(e);
                return Err(self.at(e, || key.into_owned()));
            }
            let sink = FieldSink::of_field(&field);
            let given = map
                .next_value_seed(Seed { enc: self, sink })
                .map_err(|e| self.at(e, || key.to_string()))?;
            if let Some(oneof) = field.containing_oneof().filter(|_| given) {
                if oneofs.iter().any(|o| o.name() == oneof.name()) {
                    let e = ParseError::new(format!(
                        "more than one field of oneof '{}' is set",
                        oneof.name()
                    ));
                    let e = self.fail(e);
                    return Err(self.at(e, || key.into_owned()));
                }
                oneofs.push(oneof);
            }
            // A field given as null is still given: a second key for it is
            // refused.
            chunks.push((number, start));
        }
        self.order_fields(base, &chunks);
        Ok(())
    }

    /// An unknown key: its value skipped, or refused.
    fn unknown<'de, A: MapAccess<'de>>(
        &mut self,
        desc: &MessageDescriptor,
        key: &str,
        map: &mut A,
    ) -> std::result::Result<(), A::Error> {
        if self.ignore_unknown {
            map.next_value::<IgnoredAny>()?;
            return Ok(());
        }
        Err(self.fail(ParseError::new(format!(
            "unknown field '{key}' in {}",
            desc.full_name()
        ))))
    }

    /// Puts a message's fields in number order, if its keys came in another.
    fn order_fields(&mut self, base: usize, chunks: &[(u32, usize)]) {
        if chunks.windows(2).all(|w| w[0].0 <= w[1].0) {
            return;
        }
        let region = self.out.split_off(base);
        let mut order: SmallVec<[usize; 8]> = (0..chunks.len()).collect();
        order.sort_by_key(|&i| chunks[i].0);
        for i in order {
            let start = chunks[i].1 - base;
            let end = chunks.get(i + 1).map_or(region.len(), |c| c.1 - base);
            self.out.extend_from_slice(&region[start..end]);
        }
    }

    /// A repeated field's elements.
    fn list<'de, A: SeqAccess<'de>>(
        &mut self,
        number: u32,
        kind: &Kind,
        packed: bool,
        group: bool,
        mut seq: A,
    ) -> std::result::Result<(), A::Error> {
        let packing = packed.then(|| {
            let tag_at = self.out.len();
            encode_key(number, WireType::LengthDelimited, &mut self.out);
            (tag_at, self.begin_len())
        });
        let sink = ValueSink {
            kind,
            tag: (!packed).then_some(number),
            group,
            always: true,
            null_error: Some("null is not allowed in a repeated field"),
        };
        let mut i = 0usize;
        while seq
            .next_element_seed(Seed { enc: self, sink })
            .map_err(|e| self.at(e, || format!("[{i}]")))?
            .is_some()
        {
            i += 1;
        }
        match packing {
            // An empty packed list is not written at all.
            Some((tag_at, len_at)) if self.out.len() == len_at + 1 => self.out.truncate(tag_at),
            Some((_, len_at)) => self.end_len(len_at),
            None => {}
        }
        Ok(())
    }

    /// A map field's entries (or a Struct's fields), each written with its
    /// key and value, then sorted by key.
    fn map_entries<'de, A: MapAccess<'de>>(
        &mut self,
        number: u32,
        entry: &MessageDescriptor,
        keys: Keys,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        let key_kind = entry.map_entry_key_field().kind();
        let value_kind = entry.map_entry_value_field().kind();
        let base = self.out.len();
        let mut entries: Vec<Entry> = Vec::new();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            if entries.len() == entries.capacity() && entries.len() >= 1024 {
                // Before growing, drop what later keys replaced (a Struct)
                // or refuse a repeated key (a map): a flood of one key
                // holds one entry.
                entries = match self.order_entries(base, entries, &key_kind, keys) {
                    Ok(kept) => kept,
                    Err(e) => return Err(self.fail(e)),
                };
                if entries.len() * 2 > entries.capacity() {
                    entries.reserve(entries.capacity());
                }
            }
            let segment = || keys.segment(&key);
            let (wire, prefix) = match key_wire(&key_kind, &key) {
                Ok(keyed) => keyed,
                Err(e) => {
                    let e = self.fail(e);
                    return Err(self.at(e, segment));
                }
            };
            let start = self.out.len();
            encode_key(number, WireType::LengthDelimited, &mut self.out);
            let len_at = self.begin_len();
            wire.write(Some(1), &mut self.out);
            let value_at = self.out.len();
            let sink = ValueSink {
                kind: &value_kind,
                tag: Some(2),
                group: false,
                always: true,
                null_error: Some("null is not allowed as a map value"),
            };
            map.next_value_seed(Seed { enc: self, sink })
                .map_err(|e| self.at(e, segment))?;
            if self.out.len() == value_at {
                // A value skipped (an unknown enum name): no entry.
                self.out.truncate(start);
                continue;
            }
            self.end_len(len_at);
            let span = (start - base, self.out.len() - start);
            let (Ok(start), Ok(len)) = (u32::try_from(span.0), u32::try_from(span.1)) else {
                return Err(self.fail(ParseError::new("a map passes 4 GiB")));
            };
            entries.push(Entry { prefix, start, len });
        }
        self.order_entries(base, entries, &key_kind, keys)
            .map(drop)
            .map_err(|e| self.fail(e))
    }

    /// Sorts a map's entries by key. A key given twice is refused in a
    /// map; in a Struct the last one wins, as in a JSON object.
    fn order_entries(
        &mut self,
        base: usize,
        mut entries: Vec<Entry>,
        key_kind: &Kind,
        keys: Keys,
    ) -> Result<Vec<Entry>> {
        let region = &self.out[base..];
        let bytes = |e: &Entry| &region[e.start as usize..(e.start + e.len) as usize];
        // Equal prefixes are told apart by the whole key; equal keys stay
        // in the order they came (starts grow with it).
        let key_order = |a: &Entry, b: &Entry| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| entry_key(key_kind, bytes(a)).cmp(&entry_key(key_kind, bytes(b))))
        };
        if entries.windows(2).all(|w| key_order(&w[0], &w[1]).is_lt()) {
            return Ok(entries);
        }
        entries.sort_unstable_by(|a, b| key_order(a, b).then(a.start.cmp(&b.start)));
        let mut kept = 0;
        for n in 0..entries.len() {
            let e = entries[n];
            let repeated = entries
                .get(n + 1)
                .is_some_and(|next| key_order(&e, next).is_eq());
            if !repeated {
                entries[kept] = e;
                kept += 1;
            } else if keys == Keys::Map {
                let shown = entry_key(key_kind, bytes(&e)).shown(key_kind);
                let mut error = ParseError::new("map key is given more than once");
                error.reversed_path.push(keys.segment(&shown));
                return Err(error);
            }
        }
        entries.truncate(kept);
        let region = self.out.split_off(base);
        let mut at = 0;
        for e in &mut entries {
            let start = e.start as usize;
            self.out
                .extend_from_slice(&region[start..start + e.len as usize]);
            e.start = at;
            at += e.len;
        }
        Ok(entries)
    }

    /// An Any: `@type`, then the fields of the type it names (or its
    /// `value`, for a well-known type). When `@type` is not the first key
    /// the object is kept as raw JSON slices until it is found.
    fn any<'de, A: MapAccess<'de>>(
        &mut self,
        desc: &MessageDescriptor,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        let Some(Key(first)) = map.next_key::<Key>()? else {
            return Ok(());
        };
        if first == "@type" {
            let url = map.next_value::<Token>()?;
            let inner = self.any_inner(desc, &url).map_err(|e| self.fail(e))?;
            return self.any_body(&url, &inner, map);
        }
        // The keys before "@type" are kept as raw JSON and read again once
        // the type is known; the rest stream on. Both reading again and
        // keeping are bounded: a client could otherwise make each of 100
        // nested Anys read the whole body again.
        if self.fallbacks >= MAX_ANY_REREADS {
            return Err(self.fail(ParseError::new(format!(
                "an Any inside {MAX_ANY_REREADS} others that give \"@type\" after other keys must give it first"
            ))));
        }
        let mut before: Vec<(Cow<'de, str>, &'de RawValue)> = vec![(first, map.next_value()?)];
        let url = loop {
            let Some(Key(key)) = map.next_key::<Key>()? else {
                return Err(self.fail(ParseError::new("Any is missing its \"@type\"")));
            };
            if key == "@type" {
                break map.next_value::<Token>()?;
            }
            if before.len() >= MAX_KEYS_BEFORE_TYPE {
                return Err(self.fail(ParseError::new(format!(
                    "an Any gives more than {MAX_KEYS_BEFORE_TYPE} keys before its \"@type\""
                ))));
            }
            before.push((key, map.next_value()?));
        };
        let inner = self.any_inner(desc, &url).map_err(|e| self.fail(e))?;
        let chained = Reread {
            before: before.into_iter(),
            value: None,
            rest: map,
        };
        self.fallbacks += 1;
        let result = self.any_body(&url, &inner, chained);
        self.fallbacks -= 1;
        result
    }

    fn any_inner(&self, desc: &MessageDescriptor, url: &Token) -> Result<MessageDescriptor> {
        let Token::String(url) = url else {
            let mut e = expected::<()>("string", url).unwrap_err();
            e.reversed_path.push("@type".into());
            return Err(e);
        };
        wkt::any_type(desc, url).map_err(ParseError::new)
    }

    fn any_body<'de, A: MapAccess<'de>>(
        &mut self,
        url: &Token,
        inner: &MessageDescriptor,
        mut map: A,
    ) -> std::result::Result<(), A::Error> {
        if let Token::String(url) = url {
            Wire::Delimited(Cow::Borrowed(url.as_bytes())).write(Some(1), &mut self.out);
        }
        let tag_at = self.out.len();
        encode_key(2, WireType::LengthDelimited, &mut self.out);
        let len_at = self.begin_len();
        if WellKnown::of(inner).is_some() {
            let kind = Kind::Message(inner.clone());
            let mut found = false;
            while let Some(Key(key)) = map.next_key::<Key>()? {
                if key != "value" || found {
                    return Err(self.fail(ParseError::new(format!("unknown field '{key}' in Any"))));
                }
                found = true;
                let sink = ValueSink {
                    kind: &kind,
                    tag: None,
                    group: false,
                    always: true,
                    null_error: None,
                };
                map.next_value_seed(Seed { enc: self, sink })
                    .map_err(|e| self.at(e, || "value".into()))?;
            }
            if !found {
                return Err(self.fail(ParseError::new(format!(
                    "Any of {} needs a \"value\"",
                    inner.full_name()
                ))));
            }
        } else {
            self.fields(inner, map)?;
        }
        if self.out.len() == len_at + 1 {
            // An empty value is the default, left out.
            self.out.truncate(tag_at);
        } else {
            self.end_len(len_at);
        }
        Ok(())
    }
}

/// An Any's entries once its `@type` is known: those that came before it,
/// read again from their raw JSON, then the rest of the object as it comes.
struct Reread<'de, A> {
    before: std::vec::IntoIter<(Cow<'de, str>, &'de RawValue)>,
    /// The raw value of the key just given from `before`.
    value: Option<&'de RawValue>,
    rest: A,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Reread<'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, A::Error> {
        match self.before.next() {
            Some((key, value)) => {
                self.value = Some(value);
                let key: CowStrDeserializer<'de, A::Error> = key.into_deserializer();
                seed.deserialize(key).map(Some)
            }
            None => self.rest.next_key_seed(seed),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, A::Error> {
        match self.value.take() {
            Some(raw) => seed.deserialize(raw).map_err(de::Error::custom),
            None => self.rest.next_value_seed(seed),
        }
    }
}

/// How a map's keys are named in a path, and what a repeated key means.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// `field["key"]`; a repeated key is refused.
    Map,
    /// `field.key`; the last of a repeated key wins.
    Struct,
}

impl Keys {
    fn segment(self, key: &str) -> String {
        match self {
            Keys::Map => format!("[{key:?}]"),
            Keys::Struct => key.to_string(),
        }
    }
}

/// A field or extension: its value, list or map, by its JSON value.
struct FieldSink {
    number: u32,
    kind: Kind,
    shape: Shape,
    /// Whether the field is written when it holds its default.
    presence: bool,
    /// Whether null is a value (google.protobuf.Value, NullValue) rather
    /// than "not set".
    null_is_value: bool,
    /// A group (see [`ValueSink::group`]).
    group: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Single,
    List { packed: bool },
    Map,
}

impl FieldSink {
    fn of_field(field: &FieldDescriptor) -> FieldSink {
        let shape = if field.is_map() {
            Shape::Map
        } else if field.is_list() {
            Shape::List {
                packed: field.is_packed(),
            }
        } else {
            Shape::Single
        };
        FieldSink {
            number: field.number(),
            kind: field.kind(),
            shape,
            presence: field.supports_presence(),
            null_is_value: takes_null(field),
            group: field.is_group(),
        }
    }

    fn of_extension(ext: &ExtensionDescriptor) -> FieldSink {
        FieldSink {
            number: ext.number(),
            kind: ext.kind(),
            shape: if ext.is_list() {
                Shape::List {
                    packed: ext.is_packed(),
                }
            } else {
                Shape::Single
            },
            presence: true,
            null_is_value: false,
            group: ext.is_group(),
        }
    }

    /// The sink of a singular value; `keep_defaults` writes a default an
    /// implicit-presence field would leave out.
    fn single(&self, keep_defaults: bool) -> ValueSink<'_> {
        ValueSink {
            kind: &self.kind,
            tag: Some(self.number),
            group: self.group,
            always: self.presence || keep_defaults,
            null_error: None,
        }
    }
}

impl<'de> Sink<'de> for FieldSink {
    fn token(self, enc: &mut Encoder, token: Token<'de>) -> Result<bool> {
        if token == Token::Null && !self.null_is_value {
            return Ok(false);
        }
        match self.shape {
            Shape::Map => expected("object", &token),
            Shape::List { .. } => expected("array", &token),
            Shape::Single => self.single(enc.keep_defaults).token(enc, token),
        }
    }

    fn object<A: MapAccess<'de>>(self, enc: &mut Encoder, map: A) -> Ret<A::Error> {
        match (&self.shape, &self.kind) {
            (Shape::Map, Kind::Message(entry)) => {
                enc.map_entries(self.number, entry, Keys::Map, map)?;
                Ok(true)
            }
            (Shape::Single, _) => self.single(enc.keep_defaults).object(enc, map),
            _ => {
                skip_object(map)?;
                enc.rule(self, Token::Object)
            }
        }
    }

    fn array<A: SeqAccess<'de>>(self, enc: &mut Encoder, seq: A) -> Ret<A::Error> {
        match self.shape {
            Shape::List { packed } => {
                enc.list(self.number, &self.kind, packed, self.group, seq)?;
                Ok(true)
            }
            Shape::Single => self.single(enc.keep_defaults).array(enc, seq),
            Shape::Map => {
                skip_array(seq)?;
                enc.rule(self, Token::Array)
            }
        }
    }
}

/// One value of a kind: a singular field's, a list element, a map value,
/// a wrapper's, the top-level message.
#[derive(Clone, Copy)]
struct ValueSink<'k> {
    kind: &'k Kind,
    /// The key to write it under; none for a packed element or a message
    /// written bare.
    tag: Option<u32>,
    /// A message written as a group (proto2 groups, editions' delimited
    /// encoding): between start and end keys, not length-delimited.
    group: bool,
    /// Whether a default scalar is written (not so in an implicit-presence
    /// field).
    always: bool,
    /// The error for a null, where null is neither a value nor "not set".
    null_error: Option<&'static str>,
}

impl ValueSink<'_> {
    fn wrap(&self) -> Wrap {
        match self.tag {
            None => Wrap::Bare,
            Some(tag) if self.group => Wrap::Group(tag),
            Some(tag) => Wrap::Delimited(tag),
        }
    }
}

impl<'de> Sink<'de> for ValueSink<'_> {
    fn token(self, enc: &mut Encoder, token: Token<'de>) -> Result<bool> {
        if token == Token::Null && !kind_takes_null(self.kind) {
            if let Some(message) = self.null_error {
                return Err(ParseError::new(message));
            }
        }
        if let Kind::Message(m) = self.kind {
            enc.message_token(m, self.wrap(), token)?;
            return Ok(true);
        }
        if let Some(wire) = scalar(self.kind, token, enc.ignore_unknown)? {
            if self.always || !wire.is_default(self.kind) {
                wire.write(self.tag, &mut enc.out);
            }
        }
        Ok(true)
    }

    fn object<A: MapAccess<'de>>(self, enc: &mut Encoder, map: A) -> Ret<A::Error> {
        match self.kind {
            Kind::Message(m) => enc.message_object(m, self.wrap(), map).map(|()| true),
            _ => {
                skip_object(map)?;
                enc.rule(self, Token::Object)
            }
        }
    }

    fn array<A: SeqAccess<'de>>(self, enc: &mut Encoder, seq: A) -> Ret<A::Error> {
        match self.kind {
            Kind::Message(m) => enc.message_array(m, self.wrap(), seq).map(|()| true),
            _ => {
                skip_array(seq)?;
                enc.rule(self, Token::Array)
            }
        }
    }
}

/// Hands the value serde reads to a sink.
struct Seed<'e, S> {
    enc: &'e mut Encoder,
    sink: S,
}

impl<'de, S: Sink<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: Sink<'de>> Seed<'_, S> {
    fn token<E: de::Error>(self, token: Token<'de>) -> Ret<E> {
        self.enc.rule(self.sink, token)
    }
}

impl<'de, S: Sink<'de>> Visitor<'de> for Seed<'_, S> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Ret<E> {
        self.token(Token::Null)
    }

    fn visit_none<E: de::Error>(self) -> Ret<E> {
        self.token(Token::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Ret<E> {
        self.token(Token::Bool(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Ret<E> {
        self.token(Token::Unsigned(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Ret<E> {
        self.token(Token::Signed(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Ret<E> {
        self.token(Token::Float(v))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Ret<E> {
        self.token(Token::String(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Ret<E> {
        self.token(Token::String(Cow::Owned(v.to_string())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Ret<E> {
        self.token(Token::String(Cow::Owned(v)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Ret<A::Error> {
        self.sink.object(self.enc, map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Ret<A::Error> {
        self.sink.array(self.enc, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::decode_message;
    use crate::Registry;

    const PROTO2: &str = r#"syntax = "proto2";
package p2;
import "google/protobuf/any.proto";
import "google/protobuf/struct.proto";
message M {
  optional group G = 2 { optional int32 x = 3; optional string y = 4; }
  repeated group R = 5 { optional int32 z = 6; }
  optional google.protobuf.Any any = 7;
  optional google.protobuf.Struct doc = 8;
  extensions 100 to 200;
}
extend M { optional int32 ext_n = 100; repeated int32 ext_list = 101; }
"#;

    fn m() -> MessageDescriptor {
        let mut r = Registry::new().unwrap();
        r.add_sources([("p2.proto", PROTO2)]).unwrap();
        r.message("p2.M").unwrap()
    }

    fn encode_m(json: &str) -> std::result::Result<Vec<u8>, String> {
        encode(&m(), json.as_bytes(), &JsonOptions::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn groups_are_written_between_their_start_and_end_keys() {
        let bytes = encode_m(r#"{"g":{"x":5,"y":"hi"},"r":[{"z":1},{"z":2}]}"#).unwrap();
        assert_eq!(
            bytes,
            [
                0x13, 0x18, 0x05, 0x22, 0x02, b'h', b'i', 0x14, // g
                0x2b, 0x30, 0x01, 0x2c, 0x2b, 0x30, 0x02, 0x2c, // r
            ]
        );
        // prost-reflect reads them back (it refused length-delimited ones).
        assert!(decode_message(&m(), &bytes).is_ok());
    }

    #[test]
    fn an_extension_given_twice_is_refused_like_a_field() {
        assert_eq!(
            encode_m(r#"{"[p2.ext_n]":1,"[p2.ext_n]":2}"#).unwrap_err(),
            "[p2.ext_n]: field '[p2.ext_n]' is given more than once"
        );
        assert_eq!(
            encode_m(r#"{"[p2.ext_list]":[1],"[p2.ext_n]":2}"#).unwrap(),
            [0xa0, 0x06, 0x02, 0xa8, 0x06, 0x01]
        );
    }

    /// `levels` Anys, each inside the last and giving its `@type` after its
    /// other key.
    fn anys_with_type_last(levels: usize) -> String {
        let url = r#""@type":"type.googleapis.com/p2.M""#;
        let mut any = format!(r#"{{"[p2.ext_n]":1,{url}}}"#);
        for _ in 1..levels {
            any = format!(r#"{{"any":{any},{url}}}"#);
        }
        format!(r#"{{"any":{any}}}"#)
    }

    #[test]
    fn anys_that_give_their_type_last_nest_to_a_bound() {
        let json = anys_with_type_last(8);
        assert!(encode_m(&json).is_ok(), "{:?}", encode_m(&json));
        let json = anys_with_type_last(9);
        let err = encode_m(&json).unwrap_err();
        assert!(
            err.ends_with(
                "an Any inside 8 others that give \"@type\" after other keys must give it first"
            ),
            "{err}"
        );
        let keys: Vec<String> = (0..1025).map(|i| format!(r#""k{i}":0"#)).collect();
        let json = format!(
            r#"{{"any":{{{},"@type":"type.googleapis.com/p2.M"}}}}"#,
            keys.join(",")
        );
        assert_eq!(
            encode_m(&json).unwrap_err(),
            "any: an Any gives more than 1024 keys before its \"@type\""
        );
    }

    #[test]
    fn a_struct_keeps_the_last_of_a_repeated_key_however_often_it_comes() {
        let entries = vec![r#""a":1"#; 5000].join(",");
        let json = format!(r#"{{"doc":{{{entries},"b":2,"a":3}}}}"#);
        let expected = encode_m(r#"{"doc":{"a":3,"b":2}}"#).unwrap();
        assert_eq!(encode_m(&json).unwrap(), expected);
    }
}
