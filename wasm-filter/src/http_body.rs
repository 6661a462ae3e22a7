//! `google.api.HttpBody`: where a binding's request body or response is
//! one, the HTTP body is not JSON but the bytes themselves (an upload, a
//! download), with the message's `content_type` as its Content-Type.

use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, key_len, skip_field,
    DecodeContext, WireType,
};
use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};

const FULL_NAME: &str = "google.api.HttpBody";
const CONTENT_TYPE: u32 = 1;
const DATA: u32 = 2;

/// The Content-Type of a response whose HttpBody names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Where a message holds the HttpBody a binding reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The message is one.
    Whole,
    /// The field these numbers lead to, through singular message fields
    /// (`body: "file"`, or Envoy's dotted `"attachment.file"`), is one.
    Field(FieldPath),
}

/// How deep a binding's `body` or `response_body` may name its HttpBody.
pub const MAX_BODY_PATH: usize = 8;

/// Field numbers from the message down to its HttpBody field: a path
/// kept inline (a binding is copied into each request's route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPath {
    numbers: [u32; MAX_BODY_PATH],
    len: u8,
}

impl FieldPath {
    /// `None` when `numbers` is empty or deeper than [`MAX_BODY_PATH`].
    pub fn new(numbers: &[u32]) -> Option<FieldPath> {
        if numbers.is_empty() || numbers.len() > MAX_BODY_PATH {
            return None;
        }
        let mut path = FieldPath {
            numbers: [0; MAX_BODY_PATH],
            len: numbers.len() as u8,
        };
        path.numbers[..numbers.len()].copy_from_slice(numbers);
        Some(path)
    }

    pub fn numbers(&self) -> &[u32] {
        &self.numbers[..usize::from(self.len)]
    }
}

/// A body passed raw, and its Content-Type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawBody {
    pub content_type: String,
    pub data: Vec<u8>,
}

impl Default for RawBody {
    fn default() -> RawBody {
        RawBody {
            content_type: DEFAULT_CONTENT_TYPE.to_string(),
            data: Vec::new(),
        }
    }
}

/// Whether `desc` is `google.api.HttpBody` as published (a type of that
/// name without its two fields is transcoded as any other message).
fn is_http_body(desc: &MessageDescriptor) -> bool {
    let has = |number: u32, kind: Kind| {
        desc.get_field(number)
            .is_some_and(|f| f.kind() == kind && !f.is_list())
    };
    desc.full_name() == FULL_NAME && has(CONTENT_TYPE, Kind::String) && has(DATA, Kind::Bytes)
}

/// Where `desc` holds an HttpBody for a binding's `body` or
/// `response_body` (`"*"` or `""`: the whole message; else a field, by its
/// name or JSON name, or a dotted path of them through singular message
/// fields, as Envoy's transcoder reads it).
pub fn at(desc: &MessageDescriptor, selector: &str) -> Option<At> {
    if matches!(selector, "" | "*") {
        return is_http_body(desc).then_some(At::Whole);
    }
    let fields = singular_path(desc, selector)?;
    let last = fields.last()?;
    match last.kind() {
        Kind::Message(inner) if !last.is_list() && !last.is_map() && is_http_body(&inner) => {
            let numbers: Vec<u32> = fields.iter().map(|f| f.number()).collect();
            FieldPath::new(&numbers).map(At::Field)
        }
        _ => None,
    }
}

/// The fields a dotted `selector` names from `desc` (each by its name or
/// JSON name, none a group), all but the last singular message fields (no
/// list, no map):
/// the fields a binding's `body` or `response_body` may name.
pub fn singular_path(desc: &MessageDescriptor, selector: &str) -> Option<Vec<FieldDescriptor>> {
    let mut fields: Vec<FieldDescriptor> = Vec::new();
    let mut current = desc.clone();
    for name in selector.split('.') {
        if let Some(previous) = fields.last() {
            let Kind::Message(inner) = previous.kind() else {
                return None;
            };
            if previous.is_list() || previous.is_map() {
                return None;
            }
            current = inner;
        }
        // A proto2 group is delimited by tags, not by a length.
        let field = current
            .get_field_by_name(name)
            .or_else(|| current.get_field_by_json_name(name))
            .filter(|f| !f.is_group())?;
        fields.push(field);
        if fields.len() > MAX_BODY_PATH {
            return None;
        }
    }
    Some(fields)
}

/// `inner`, the encoding of the last field of `numbers` within its own
/// message, wrapped in each message field that leads to it: the encoding
/// of the outermost message.
pub fn wrap(numbers: &[u32], inner: Vec<u8>) -> Vec<u8> {
    let Some((&outer, rest)) = numbers.split_first() else {
        return inner;
    };
    if rest.is_empty() {
        return inner;
    }
    let nested = wrap(rest, inner);
    let mut out = Vec::with_capacity(nested.len() + 10);
    encode_key(outer, WireType::LengthDelimited, &mut out);
    encode_varint(nested.len() as u64, &mut out);
    out.extend_from_slice(&nested);
    out
}

/// The protobuf of a request whose HttpBody at `at` holds `data`, with
/// the request's `content_type`, written in one go (the data is copied
/// once).
pub fn encode(at: At, content_type: &str, data: &[u8]) -> Vec<u8> {
    let delimited = |number: u32, len: usize| {
        if len == 0 {
            0
        } else {
            key_len(number) + encoded_len_varint(len as u64) + len
        }
    };
    let numbers = match &at {
        At::Whole => &[][..],
        At::Field(path) => path.numbers(),
    };
    // Each enclosing message's length is the length of what it holds, from
    // the HttpBody outwards.
    let mut lengths = Vec::with_capacity(numbers.len());
    let mut length = delimited(CONTENT_TYPE, content_type.len()) + delimited(DATA, data.len());
    for &number in numbers.iter().rev() {
        lengths.push(length);
        length += key_len(number) + encoded_len_varint(length as u64);
    }
    let mut out = Vec::with_capacity(length);
    for (&number, &inner) in numbers.iter().zip(lengths.iter().rev()) {
        encode_key(number, WireType::LengthDelimited, &mut out);
        encode_varint(inner as u64, &mut out);
    }
    for (number, bytes) in [(CONTENT_TYPE, content_type.as_bytes()), (DATA, data)] {
        if !bytes.is_empty() {
            encode_key(number, WireType::LengthDelimited, &mut out);
            encode_varint(bytes.len() as u64, &mut out);
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// The HttpBody at `at` of a response message, read from its wire bytes
/// as a protobuf parser merges them (a field given again replaces the
/// earlier value, occurrences of the message field merge). Everything else
/// is skipped, not built: a message decoded whole held up to 28 times its
/// size. Its `content_type` becomes a response header, so it
/// must be one: visible ASCII, spaces and tabs, at most
/// [`MAX_CONTENT_TYPE_BYTES`].
pub fn decode(at: At, bytes: &[u8]) -> Result<RawBody, String> {
    let mut found = Found::default();
    match &at {
        At::Whole => found.read(bytes)?,
        At::Field(path) => visit(path.numbers(), bytes, &mut found)?,
    }
    let content_type = match found.content_type {
        None | Some(b"") => DEFAULT_CONTENT_TYPE,
        Some(value) if is_header_value(value) => {
            std::str::from_utf8(value).map_err(|e| e.to_string())?
        }
        Some(value) => {
            return Err(format!(
                "its content_type ({} bytes) is no header value: visible ASCII, at most {MAX_CONTENT_TYPE_BYTES} bytes",
                value.len()
            ))
        }
    };
    let mut data = Vec::new();
    data.try_reserve_exact(found.data.len())
        .map_err(|e| e.to_string())?;
    data.extend_from_slice(found.data);
    Ok(RawBody {
        content_type: content_type.to_string(),
        data,
    })
}

/// Reads every occurrence of the field `numbers` lead to: a parser merges
/// the occurrences of each enclosing message, so their HttpBody fields
/// merge in the order they come.
fn visit<'a>(numbers: &[u32], mut bytes: &'a [u8], found: &mut Found<'a>) -> Result<(), String> {
    let Some((&number, rest)) = numbers.split_first() else {
        return found.read(bytes);
    };
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes).map_err(|e| e.to_string())?;
        if tag == number {
            visit(rest, delimited(wire_type, &mut bytes)?, found)?;
        } else {
            skip_field(wire_type, tag, &mut bytes, DecodeContext::default())
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

use crate::limits::MAX_CONTENT_TYPE_BYTES;

fn is_header_value(value: &[u8]) -> bool {
    value.len() <= MAX_CONTENT_TYPE_BYTES
        && value
            .iter()
            .all(|&b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
}

/// The last `content_type` and `data` of an HttpBody's occurrences.
#[derive(Default)]
struct Found<'a> {
    content_type: Option<&'a [u8]>,
    data: &'a [u8],
}

impl<'a> Found<'a> {
    fn read(&mut self, mut bytes: &'a [u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            let (tag, wire_type) = decode_key(&mut bytes).map_err(|e| e.to_string())?;
            match tag {
                CONTENT_TYPE => self.content_type = Some(delimited(wire_type, &mut bytes)?),
                DATA => self.data = delimited(wire_type, &mut bytes)?,
                // The extensions and anything unknown.
                _ => skip_field(wire_type, tag, &mut bytes, DecodeContext::default())
                    .map_err(|e| e.to_string())?,
            }
        }
        Ok(())
    }
}

/// A length-delimited value; any other wire type is malformed, as a
/// parser finds it for a string, bytes or message field.
fn delimited<'a>(wire_type: WireType, bytes: &mut &'a [u8]) -> Result<&'a [u8], String> {
    if wire_type != WireType::LengthDelimited {
        return Err(format!("invalid wire type: {wire_type:?}"));
    }
    let len = decode_varint(bytes).map_err(|e| e.to_string())?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= bytes.len())
        .ok_or("buffer underflow")?;
    let (value, rest) = bytes.split_at(len);
    *bytes = rest;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::decode_message;
    use crate::Registry;

    const PROTO: &str = r#"syntax = "proto3";
package files;
import "google/api/httpbody.proto";
message Put { string name = 1; google.api.HttpBody file = 2; }
message Other { string name = 1; repeated google.api.HttpBody files = 2; }
message Deep { string name = 1; Put put = 3; repeated Put puts = 4; }
"#;

    fn field(number: u32) -> At {
        At::Field(FieldPath::new(&[number]).unwrap())
    }

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([("files.proto", PROTO)]).unwrap();
        r
    }

    #[test]
    fn finds_the_http_body_a_binding_names() {
        let r = registry();
        let body = r.message("google.api.HttpBody").unwrap();
        let put = r.message("files.Put").unwrap();
        let other = r.message("files.Other").unwrap();
        assert_eq!(at(&body, "*"), Some(At::Whole));
        assert_eq!(at(&body, ""), Some(At::Whole));
        assert_eq!(at(&put, "file"), Some(field(2)));
        assert_eq!(at(&put, "*"), None);
        assert_eq!(at(&put, "name"), None);
        assert_eq!(at(&other, "files"), None, "a list is JSON");
        let deep = r.message("files.Deep").unwrap();
        let put_file = At::Field(FieldPath::new(&[3, 2]).unwrap());
        assert_eq!(at(&deep, "put.file"), Some(put_file));
        assert_eq!(at(&deep, "put.name"), None);
        assert_eq!(at(&deep, "puts.file"), None, "through a list");
        assert_eq!(at(&deep, "put.file.data"), None);
        assert_eq!(at(&deep, "put"), None);
    }

    #[test]
    fn a_nested_http_body_is_written_and_read_through_its_messages() {
        let r = registry();
        let deep = r.message("files.Deep").unwrap();
        let put_file = At::Field(FieldPath::new(&[3, 2]).unwrap());
        let bytes = encode(put_file, "text/csv", b"a,b\n");
        let message = decode_message(&deep, &bytes).unwrap();
        let put = message.get_field_by_name("put").unwrap();
        let file = put.as_message().unwrap().get_field_by_name("file").unwrap();
        let file = file.as_message().unwrap();
        assert_eq!(
            file.get_field_by_name("data")
                .unwrap()
                .as_bytes()
                .unwrap()
                .as_ref(),
            b"a,b\n"
        );
        // A second occurrence of `put` merges: its file's data wins.
        let mut twice = bytes.clone();
        twice.extend(encode(put_file, "", b"new"));
        twice.extend([0x0a, 0x01, b'n']);
        assert_eq!(
            decode(put_file, &twice).unwrap(),
            RawBody {
                content_type: "text/csv".into(),
                data: b"new".to_vec()
            }
        );
        assert_eq!(
            wrap(&[3, 2], vec![0x12, 0x00]),
            vec![0x1a, 0x02, 0x12, 0x00]
        );
        assert_eq!(wrap(&[2], vec![0x12, 0x00]), vec![0x12, 0x00]);
        assert!(FieldPath::new(&[1; MAX_BODY_PATH + 1]).is_none());
    }

    #[test]
    fn encodes_what_prost_reflect_decodes_and_back() {
        let r = registry();
        let put = r.message("files.Put").unwrap();
        let bytes = encode(field(2), "image/png", &[0, 1, 2, 255]);
        let message = decode_message(&put, &bytes).unwrap();
        let file = message.get_field_by_name("file").unwrap();
        let file = file.as_message().unwrap();
        assert_eq!(
            file.get_field_by_name("content_type").unwrap().as_str(),
            Some("image/png")
        );
        assert_eq!(
            decode(field(2), &bytes).unwrap(),
            RawBody {
                content_type: "image/png".into(),
                data: vec![0, 1, 2, 255]
            }
        );
        assert_eq!(encode(At::Whole, "", b""), Vec::<u8>::new());
        assert_eq!(decode(At::Whole, b"").unwrap(), RawBody::default());
        assert_eq!(
            decode(At::Whole, &[0x12, 0x05, 1]).unwrap_err(),
            "buffer underflow"
        );
        assert_eq!(
            decode(At::Whole, &[0x10, 0x01]).unwrap_err(),
            "invalid wire type: Varint"
        );
    }

    #[test]
    fn merges_as_a_parser_does_and_skips_the_rest() {
        // Field 2 given twice (merged: the later data wins, the earlier
        // content type stays), a name, extensions and an unknown group.
        let mut bytes = encode(field(2), "text/csv", b"old");
        bytes.extend([0x0a, 0x01, b'n']);
        bytes.extend(encode(field(2), "", b"new"));
        bytes.extend([0x12, 0x04, 0x1a, 0x02, 0x0a, 0x00]);
        bytes.extend([0x3b, 0x08, 0x01, 0x3c]);
        assert_eq!(
            decode(field(2), &bytes).unwrap(),
            RawBody {
                content_type: "text/csv".into(),
                data: b"new".to_vec()
            }
        );
        // Not set at all: an empty body.
        assert_eq!(
            decode(field(2), &[0x0a, 0x01, b'n']).unwrap(),
            RawBody::default()
        );
    }

    #[test]
    fn a_content_type_that_is_no_header_value_is_refused() {
        for bad in ["text/plain\r\nset-cookie: a=b", "a\0b", "caf\u{e9}"] {
            let err = decode(At::Whole, &encode(At::Whole, bad, b"x")).unwrap_err();
            assert!(err.starts_with("its content_type ("), "{err}");
        }
        let long = "a".repeat(MAX_CONTENT_TYPE_BYTES + 1);
        assert!(decode(At::Whole, &encode(At::Whole, &long, b"")).is_err());
        let fine = "multipart/form-data; boundary=\"x y\"\t";
        assert_eq!(
            decode(At::Whole, &encode(At::Whole, fine, b""))
                .unwrap()
                .content_type,
            fine
        );
    }
}
