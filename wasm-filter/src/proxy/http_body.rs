//! `google.api.HttpBody`: where a binding's request body or response is
//! one, the HTTP body is not JSON but the bytes themselves (an upload, a
//! download), with the message's `content_type` as its Content-Type.

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor, Value};

use crate::error::Error;
use crate::json::decode_message;

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
    /// Its top-level field with this number is one.
    Field(u32),
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
/// `response_body` (`"*"` or `""`: the whole message; else a top-level
/// field, by its name or JSON name).
pub fn at(desc: &MessageDescriptor, selector: &str) -> Option<At> {
    if matches!(selector, "" | "*") {
        return is_http_body(desc).then_some(At::Whole);
    }
    let field = desc
        .get_field_by_name(selector)
        .or_else(|| desc.get_field_by_json_name(selector))?;
    match field.kind() {
        Kind::Message(inner) if !field.is_list() && !field.is_map() && is_http_body(&inner) => {
            Some(At::Field(field.number()))
        }
        _ => None,
    }
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
    let inner = delimited(CONTENT_TYPE, content_type.len()) + delimited(DATA, data.len());
    let mut out = Vec::with_capacity(inner + 16);
    if let At::Field(number) = at {
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

/// The HttpBody at `at` of a response message of type `desc`. A message
/// without it set answers an empty body of the default type.
pub fn decode(desc: &MessageDescriptor, at: At, bytes: &[u8]) -> Result<RawBody, Error> {
    let message = decode_message(desc, bytes)?;
    let field = match at {
        At::Whole => None,
        At::Field(number) => Some(message.get_field_by_number(number)),
    };
    let body: &DynamicMessage = match &field {
        None => &message,
        Some(Some(value)) => match value.as_ref() {
            Value::Message(inner) => inner,
            _ => return Ok(RawBody::default()),
        },
        Some(None) => return Ok(RawBody::default()),
    };
    let content_type = match body.get_field_by_number(CONTENT_TYPE).as_deref() {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => DEFAULT_CONTENT_TYPE.to_string(),
    };
    let data = match body.get_field_by_number(DATA).as_deref() {
        Some(Value::Bytes(b)) => b.to_vec(),
        _ => Vec::new(),
    };
    Ok(RawBody { content_type, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    const PROTO: &str = r#"syntax = "proto3";
package files;
import "google/api/httpbody.proto";
message Put { string name = 1; google.api.HttpBody file = 2; }
message Other { string name = 1; repeated google.api.HttpBody files = 2; }
"#;

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
        assert_eq!(at(&put, "file"), Some(At::Field(2)));
        assert_eq!(at(&put, "*"), None);
        assert_eq!(at(&put, "name"), None);
        assert_eq!(at(&other, "files"), None, "a list is JSON");
    }

    #[test]
    fn encodes_what_prost_reflect_decodes_and_back() {
        let r = registry();
        let put = r.message("files.Put").unwrap();
        let bytes = encode(At::Field(2), "image/png", &[0, 1, 2, 255]);
        let message = decode_message(&put, &bytes).unwrap();
        let file = message.get_field_by_name("file").unwrap();
        let file = file.as_message().unwrap();
        assert_eq!(
            file.get_field_by_name("content_type").unwrap().as_str(),
            Some("image/png")
        );
        assert_eq!(
            decode(&put, At::Field(2), &bytes).unwrap(),
            RawBody {
                content_type: "image/png".into(),
                data: vec![0, 1, 2, 255]
            }
        );
        let body = r.message("google.api.HttpBody").unwrap();
        assert_eq!(encode(At::Whole, "", b""), Vec::<u8>::new());
        assert_eq!(
            decode(&body, At::Whole, b"").unwrap(),
            RawBody {
                content_type: DEFAULT_CONTENT_TYPE.into(),
                data: Vec::new()
            }
        );
        assert!(decode(&body, At::Whole, &[0x12, 0x05, 1]).is_err());
    }
}
