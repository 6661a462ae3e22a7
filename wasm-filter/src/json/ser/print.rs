//! Message → JSON, by the proto3 JSON mapping, written straight into a
//! string (no intermediate tree).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use prost::Message;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};

use super::layout::Layouts;
use super::quote::{quote_into, quoted_len};
use crate::json::wkt::{self, any_type};
use crate::json::{JsonOptions, WellKnown};
use crate::limits::{Depth, JSON_SLACK_BYTES};

pub(crate) struct Printer<'a> {
    pub(crate) options: &'a JsonOptions,
    pub(crate) out: String,
    /// Messages nest through fields, `Any` and `Struct`; each `Any` is
    /// decoded afresh, so the decoder's own limit does not see the whole
    /// depth: the printer counts it.
    depth: Depth,
    /// The most JSON this printer writes (see `json::cost`).
    limit: usize,
    /// Whether printing stopped at `limit`.
    pub(crate) over_limit: bool,
    /// The most JSON this printer keeps: past it, what it writes is
    /// counted and dropped, and a message whose JSON turns out to fit
    /// `limit` is printed again at its exact size (see `json::cost`).
    keep: usize,
    /// The JSON written and dropped past `keep`.
    dropped: usize,
    /// The length up to which [`Printer::check_limit`] has nothing to do.
    quiet_until: usize,
    /// The wire printer's messages open below their decoding root (see
    /// `json::wire`).
    pub(super) wire_level: usize,
    /// The wire printer's view of each message type it met.
    pub(super) layouts: Layouts,
}

type Result = std::result::Result<(), String>;

impl<'a> Printer<'a> {
    pub(crate) fn new(options: &'a JsonOptions, capacity: usize) -> Self {
        Printer {
            options,
            out: String::with_capacity(capacity),
            depth: Depth::default(),
            limit: usize::MAX,
            over_limit: false,
            keep: usize::MAX,
            dropped: 0,
            quiet_until: 0,
            wire_level: 0,
            layouts: Layouts::new(options.proto_field_names),
        }
    }

    /// A printer that stops once its output passes `limit` bytes.
    pub(crate) fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// A printer that keeps at most `keep` bytes of what it writes (and
    /// the room to grow of [`Printer::check_limit`]), counting the rest.
    pub(crate) fn keeping(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }

    /// The length of the whole JSON when the printer dropped part of it,
    /// whose text must then be printed again.
    pub(crate) fn dropped_json_len(&self) -> Option<usize> {
        (self.dropped > 0).then(|| self.dropped + self.out.len())
    }

    /// One message level down (see `limits::Depth`); each `enter` that
    /// succeeds is paired with a [`Printer::leave`].
    pub(super) fn enter(&mut self) -> Result {
        self.depth.enter()
    }

    pub(super) fn leave(&mut self) {
        self.depth.leave();
    }

    /// Stops a printer whose output passed its limit.
    #[inline]
    pub(super) fn check_limit(&mut self) -> Result {
        // Checked for every value written: most find nothing to do.
        if self.out.len() < self.quiet_until {
            return Ok(());
        }
        self.check_limit_now()
    }

    /// [`Printer::check_limit`], whatever the last check found.
    pub(crate) fn check_limit_now(&mut self) -> Result {
        if self.out.len() > self.keep {
            self.dropped += self.out.len();
            self.out.clear();
        }
        if self.dropped + self.out.len() > self.limit {
            return self.refuse();
        }
        self.grow_within_limit();
        // Until the JSON reaches this length nothing above can happen
        // (unless the string grew by itself, which only checks again early).
        // A string below the slack is checked again once it fills its
        // capacity (it grows by itself; see `grow_within_limit`).
        let capacity = self.out.capacity();
        let room = match self.limit {
            usize::MAX => usize::MAX,
            _ if capacity < JSON_SLACK_BYTES => capacity,
            _ => capacity - JSON_SLACK_BYTES,
        };
        self.quiet_until = self.keep.min(self.limit - self.dropped).min(room);
        Ok(())
    }

    /// Stops a printer whose output will pass its limit: `least` more
    /// bytes are sure to come (the elements of the lists found so far),
    /// so a list too long for the limit is refused before it is printed.
    pub(super) fn check_limit_ahead(&mut self, least: usize) -> Result {
        let sure = self
            .dropped
            .saturating_add(self.out.len())
            .saturating_add(least);
        if sure > self.limit {
            return self.refuse();
        }
        Ok(())
    }

    /// Stops the printer at its limit, for the caller to word the error.
    fn refuse(&mut self) -> Result {
        self.over_limit = true;
        Err(format!("its JSON passes {} bytes", self.limit))
    }

    /// Whether what this pass writes is only counted: once part of the
    /// JSON was dropped, the whole is printed again (or refused), so a
    /// value may [`Printer::count`] its length instead of writing it.
    pub(super) fn only_counts(&self) -> bool {
        self.dropped > 0
    }

    /// Counts `len` bytes of JSON as written, when [`Printer::only_counts`].
    pub(super) fn count(&mut self, len: usize) {
        self.dropped = self.dropped.saturating_add(len);
        self.quiet_until = self.quiet_until.saturating_sub(len);
    }

    /// Whether a value of `len` bytes of JSON is to be written: not when it
    /// would pass what the printer keeps, where it is only counted. A
    /// single string can print to six times its size, and growing the
    /// JSON by all of it at once would copy what is kept beside it.
    fn keeps(&mut self, len: usize) -> bool {
        if self.keep == usize::MAX || self.out.len().saturating_add(len) <= self.keep {
            if len > JSON_SLACK_BYTES {
                // With room after it: what follows must not double it.
                self.out.reserve_exact(len.saturating_add(JSON_SLACK_BYTES));
            }
            return true;
        }
        self.dropped = self
            .dropped
            .saturating_add(self.out.len())
            .saturating_add(len);
        self.out.clear();
        // The next check weighs what was dropped, even with nothing kept.
        self.quiet_until = 0;
        false
    }

    /// Grows the JSON before it fills, to twice its size but never past the
    /// limit and 64 KiB: left to itself, a string that passes the limit by
    /// a byte doubles, and a refused message held 24 times its wire size.
    fn grow_within_limit(&mut self) {
        let (len, capacity) = (self.out.len(), self.out.capacity());
        // A string smaller than the slack grows by itself, doubling to at
        // most 128 KiB: reserving the slack up front would cost every small
        // reply an allocation of 128 KiB and more.
        if capacity < JSON_SLACK_BYTES
            || capacity - len >= JSON_SLACK_BYTES
            || self.limit == usize::MAX
        {
            return;
        }
        let most = self.limit.min(self.keep).saturating_add(JSON_SLACK_BYTES);
        let doubled = capacity.saturating_mul(2);
        // Near the limit, straight to it: one more small step would copy
        // the whole string again.
        let target = if doubled.saturating_add(doubled / 2) > most {
            most
        } else {
            doubled
        }
        .max(len + JSON_SLACK_BYTES);
        self.out.reserve_exact(target - len);
    }

    pub(crate) fn message(&mut self, message: &DynamicMessage) -> Result {
        self.depth.enter()?;
        let result = self.message_fields(message);
        self.depth.leave();
        result
    }

    fn message_fields(&mut self, message: &DynamicMessage) -> Result {
        let desc = message.descriptor();
        if let Some(wkt) = WellKnown::of(&desc) {
            return self.well_known(&desc, wkt, message);
        }
        self.out.push('{');
        let mut first = true;
        self.fields(&desc, message, &mut first)?;
        self.out.push('}');
        Ok(())
    }

    fn fields(
        &mut self,
        desc: &MessageDescriptor,
        message: &DynamicMessage,
        first: &mut bool,
    ) -> Result {
        for field in desc.fields() {
            if !message.has_field(&field)
                && (!self.options.emit_defaults || field.supports_presence())
            {
                continue;
            }
            let name = if self.options.proto_field_names {
                field.name()
            } else {
                field.json_name()
            };
            self.key(name, first);
            self.field_value(&field, &message.get_field(&field))?;
        }
        for (ext, value) in message.extensions() {
            self.key(&format!("[{}]", ext.full_name()), first);
            if ext.is_list() {
                self.list(&ext.kind(), value)?;
            } else {
                self.single(&ext.kind(), value)?;
            }
        }
        Ok(())
    }

    pub(super) fn key(&mut self, name: &str, first: &mut bool) {
        if !*first {
            self.out.push(',');
        }
        *first = false;
        self.string(name);
        self.out.push(':');
    }

    fn field_value(&mut self, field: &FieldDescriptor, value: &Value) -> Result {
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                return Err("malformed map field".into());
            };
            return self.map(&entry.map_entry_value_field().kind(), value);
        }
        if field.is_list() {
            return self.list(&field.kind(), value);
        }
        self.single(&field.kind(), value)
    }

    fn list(&mut self, kind: &Kind, value: &Value) -> Result {
        let Value::List(items) = value else {
            return Err("expected a list value".into());
        };
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.single(kind, item)?;
        }
        self.out.push(']');
        Ok(())
    }

    /// Map entries in key order, so that the same message always prints the
    /// same text.
    fn map(&mut self, value_kind: &Kind, value: &Value) -> Result {
        let Value::Map(map) = value else {
            return Err("expected a map value".into());
        };
        let mut entries: Vec<(&MapKey, &Value)> = map.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        self.out.push('{');
        let mut first = true;
        for (key, v) in entries {
            let text = match key {
                MapKey::Bool(b) => b.to_string(),
                MapKey::I32(n) => n.to_string(),
                MapKey::I64(n) => n.to_string(),
                MapKey::U32(n) => n.to_string(),
                MapKey::U64(n) => n.to_string(),
                MapKey::String(s) => s.clone(),
            };
            self.key(&text, &mut first);
            self.single(value_kind, v)?;
        }
        self.out.push('}');
        Ok(())
    }

    pub(super) fn single(&mut self, kind: &Kind, value: &Value) -> Result {
        self.check_limit()?;
        match value {
            Value::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Value::I32(n) => self.integer(*n, false),
            Value::U32(n) => self.integer(*n, false),
            Value::I64(n) => self.integer(*n, !self.options.int64_as_number),
            Value::U64(n) => self.integer(*n, !self.options.int64_as_number),
            Value::F32(f) => self.float32(*f),
            Value::F64(f) => self.float64(*f),
            Value::String(s) => self.string(s),
            Value::Bytes(b) => self.bytes(b),
            Value::EnumNumber(n) => self.enumeration(kind, *n),
            Value::Message(m) => self.message(m)?,
            Value::List(_) | Value::Map(_) => return Err("nested list or map value".into()),
        }
        Ok(())
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        if !self.keeps(b.len().div_ceil(3).saturating_mul(4).saturating_add(2)) {
            return;
        }
        self.out.push('"');
        STANDARD.encode_string(b, &mut self.out);
        self.out.push('"');
    }

    fn integer(&mut self, n: impl itoa::Integer, quoted: bool) {
        let mut buf = itoa::Buffer::new();
        if quoted {
            self.out.push('"');
        }
        self.out.push_str(buf.format(n));
        if quoted {
            self.out.push('"');
        }
    }

    fn float64(&mut self, f: f64) {
        if f.is_finite() {
            self.shortest(ryu::Buffer::new().format_finite(f));
        } else {
            self.non_finite(f.is_nan(), f.is_sign_negative());
        }
    }

    /// The shortest text that reads back as the same f32, as Google's
    /// runtimes print float fields.
    fn float32(&mut self, f: f32) {
        if f.is_finite() {
            self.shortest(ryu::Buffer::new().format_finite(f));
        } else {
            self.non_finite(f.is_nan(), f.is_sign_negative());
        }
    }

    /// ryu's text without the `.0` it gives whole numbers: Google's
    /// printers (Envoy's transcoder among them) write `2`, not `2.0`.
    fn shortest(&mut self, text: &str) {
        self.out.push_str(text.strip_suffix(".0").unwrap_or(text));
    }

    fn non_finite(&mut self, nan: bool, negative: bool) {
        self.out.push_str(match (nan, negative) {
            (true, _) => "\"NaN\"",
            (false, true) => "\"-Infinity\"",
            (false, false) => "\"Infinity\"",
        });
    }

    fn enumeration(&mut self, kind: &Kind, n: i32) {
        let Kind::Enum(desc) = kind else {
            return self.integer(n, false);
        };
        if desc.full_name() == "google.protobuf.NullValue" {
            return self.out.push_str("null");
        }
        match desc.get_value(n) {
            Some(v) if !self.options.enums_as_numbers => self.string(v.name()),
            _ => self.integer(n, false),
        }
    }

    pub(super) fn string(&mut self, s: &str) {
        // Short strings are written, and counted if need be, like any value.
        if s.len() < 1024 || self.keeps(quoted_len(s)) {
            quote_into(&mut self.out, s);
        }
    }

    /// A key already written as JSON (`"name":`, see `layout.rs`).
    pub(super) fn quoted_key(&mut self, quoted: &str, first: &mut bool) {
        if !*first {
            self.out.push(',');
        }
        *first = false;
        self.out.push_str(quoted);
    }

    fn well_known(
        &mut self,
        desc: &MessageDescriptor,
        wkt: WellKnown,
        message: &DynamicMessage,
    ) -> Result {
        let number = |n: u32| message.get_field_by_number(n).map(|v| v.into_owned());
        match wkt {
            WellKnown::Timestamp => {
                let (s, n) = seconds_nanos(message);
                let text = wkt::format_timestamp(s, n)
                    .ok_or_else(|| format!("timestamp out of range: {s}s {n}ns"))?;
                self.string(&text);
            }
            WellKnown::Duration => {
                let (s, n) = seconds_nanos(message);
                let text = wkt::format_duration(s, n)
                    .ok_or_else(|| format!("duration out of range: {s}s {n}ns"))?;
                self.string(&text);
            }
            WellKnown::FieldMask => {
                let paths = match number(1) {
                    Some(Value::List(paths)) => paths,
                    _ => Vec::new(),
                };
                let mut joined = Vec::with_capacity(paths.len());
                for p in paths.iter().filter_map(Value::as_str) {
                    joined.push(
                        wkt::path_to_json(p)
                            .ok_or_else(|| format!("field mask path '{p}' has no JSON form"))?,
                    );
                }
                self.string(&joined.join(","));
            }
            WellKnown::Struct => {
                let Kind::Message(entry) = desc
                    .get_field(1)
                    .map(|f| f.kind())
                    .ok_or("malformed Struct")?
                else {
                    return Err("malformed Struct".into());
                };
                self.map(
                    &entry.map_entry_value_field().kind(),
                    &number(1).unwrap_or(Value::Map(Default::default())),
                )?;
            }
            WellKnown::ListValue => {
                let Some(field) = desc.get_field(1) else {
                    return Err("malformed ListValue".into());
                };
                self.list(&field.kind(), &message.get_field(&field))?;
            }
            WellKnown::Value => self.value(message)?,
            WellKnown::Wrapper => {
                let Some(field) = desc.get_field(1) else {
                    return Err("malformed wrapper".into());
                };
                self.single(&field.kind(), &message.get_field(&field))?;
            }
            WellKnown::Any => self.any(message)?,
        }
        Ok(())
    }

    fn value(&mut self, message: &DynamicMessage) -> Result {
        let Some((field, value)) = message.fields().next() else {
            return Err("google.protobuf.Value has no kind set".into());
        };
        match (field.number(), value) {
            (1, _) => self.out.push_str("null"),
            (2, Value::F64(f)) if f.is_finite() => self.float64(*f),
            (2, _) => return Err("google.protobuf.Value cannot hold NaN or Infinity".into()),
            (_, v) => self.single(&field.kind(), v)?,
        }
        Ok(())
    }

    fn any(&mut self, message: &DynamicMessage) -> Result {
        let type_url = message
            .get_field_by_number(1)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let bytes = message
            .get_field_by_number(2)
            .and_then(|v| v.as_bytes().cloned())
            .unwrap_or_default();
        if type_url.is_empty() && bytes.is_empty() {
            self.out.push_str("{}");
            return Ok(());
        }
        let inner_desc = any_type(&message.descriptor(), &type_url)?;
        let inner = DynamicMessage::decode(inner_desc.clone(), bytes.as_ref())
            .map_err(|e| format!("Any of {type_url} does not decode: {e}"))?;
        self.out.push('{');
        let mut first = true;
        self.key("@type", &mut first);
        self.string(&type_url);
        if WellKnown::of(&inner_desc).is_some() {
            self.key("value", &mut first);
            self.message(&inner)?;
        } else {
            self.fields(&inner_desc, &inner, &mut first)?;
        }
        self.out.push('}');
        Ok(())
    }
}

fn seconds_nanos(message: &DynamicMessage) -> (i64, i32) {
    let seconds = message
        .get_field_by_number(1)
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let nanos = message
        .get_field_by_number(2)
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    (seconds, nanos)
}

// Keeps `Message` in scope for `DynamicMessage::decode`.
#[allow(dead_code)]
fn _assert_message<T: Message>() {}
