//! JSON ⇄ protobuf for any message type, following the proto3 JSON mapping.

use prost_reflect::{DeserializeOptions, DynamicMessage, ReflectMessage, MessageDescriptor, SerializeOptions};

use crate::deterministic::encode_deterministic;
use crate::error::Error;

/// How JSON is read and written. The defaults are the proto3 JSON mapping's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonOptions {
    /// Write fields that hold their default value (0, "", false, []).
    pub emit_defaults: bool,
    /// Write 64-bit integers as JSON numbers instead of strings.
    pub int64_as_number: bool,
    /// Write enums as numbers instead of names.
    pub enums_as_numbers: bool,
    /// Write the `.proto` field names instead of lowerCamelCase.
    pub proto_field_names: bool,
    /// Skip unknown fields in input JSON instead of failing.
    pub ignore_unknown_fields: bool,
}

impl JsonOptions {
    fn serialize_options(&self) -> SerializeOptions {
        SerializeOptions::new()
            .skip_default_fields(!self.emit_defaults)
            .stringify_64_bit_integers(!self.int64_as_number)
            .use_enum_numbers(self.enums_as_numbers)
            .use_proto_field_name(self.proto_field_names)
    }

    fn deserialize_options(&self) -> DeserializeOptions {
        DeserializeOptions::new().deny_unknown_fields(!self.ignore_unknown_fields)
    }
}

/// Parses JSON into a message of type `desc`.
pub fn json_to_message(desc: &MessageDescriptor, json: &[u8], options: &JsonOptions) -> Result<DynamicMessage, Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(&mut de, &mut track);
    let message = DynamicMessage::deserialize_with_options(desc.clone(), tracked, &options.deserialize_options())
        .map_err(|e| json_error(track.path().to_string(), &e))?;
    de.end().map_err(|e| json_error(String::new(), &e))?;
    Ok(message)
}

/// Parses JSON and encodes it as protobuf (deterministically: map entries
/// sorted by key).
pub fn json_to_protobuf(desc: &MessageDescriptor, json: &[u8], options: &JsonOptions) -> Result<Vec<u8>, Error> {
    json_to_message(desc, json, options).map(|m| encode_deterministic(&m))
}

/// Decodes protobuf bytes of type `desc`.
pub fn decode_message(desc: &MessageDescriptor, bytes: &[u8]) -> Result<DynamicMessage, Error> {
    DynamicMessage::decode(desc.clone(), bytes).map_err(|e| Error::Decode {
        message_type: desc.full_name().to_string(),
        reason: e.to_string(),
    })
}

/// Writes a message as JSON text.
pub fn message_to_json(message: &DynamicMessage, options: &JsonOptions) -> Result<String, Error> {
    let mut out = Vec::with_capacity(128);
    let mut ser = serde_json::Serializer::new(&mut out);
    message
        .serialize_with_options(&mut ser, &options.serialize_options())
        .map_err(|e| Error::Encode {
            message_type: message.descriptor().full_name().to_string(),
            reason: e.to_string(),
        })?;
    // serde_json writes only valid UTF-8.
    String::from_utf8(out).map_err(|e| Error::Encode {
        message_type: message.descriptor().full_name().to_string(),
        reason: e.to_string(),
    })
}

/// Decodes protobuf bytes of type `desc` and writes them as JSON text.
pub fn protobuf_to_json(desc: &MessageDescriptor, bytes: &[u8], options: &JsonOptions) -> Result<String, Error> {
    message_to_json(&decode_message(desc, bytes)?, options)
}

/// Turns serde's wording into what a user of a JSON API expects:
/// `expected <what>, got <what>`, without serde's line/column (the path says
/// where).
fn json_error(path: String, err: &serde_json::Error) -> Error {
    let text = err.to_string();
    if matches!(err.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof) {
        // Not JSON at all: the position in the text is what helps.
        return Error::Json { path: String::new(), message: format!("invalid JSON: {text}") };
    }
    let path = if path == "." || path == "?" { String::new() } else { path };
    let text = match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        _ => text,
    };
    let message = match text.strip_prefix("invalid type: ").and_then(|rest| rest.split_once(", expected ")) {
        Some((got, expected)) => format!("expected {expected}, got {got}"),
        None => plain_parse_error(&text).map(str::to_string).unwrap_or(text),
    };
    Error::Json { path, message }
}

/// Quoted numbers are parsed with Rust's number parsers, whose messages do
/// not say what was expected.
fn plain_parse_error(text: &str) -> Option<&'static str> {
    Some(match text {
        "invalid digit found in string" | "cannot parse integer from empty string" => {
            "expected an integer, got a string that is not one"
        }
        "number too large to fit in target type"
        | "number too small to fit in target type"
        | "out of range integral type conversion attempted" => {
            "integer out of range"
        }
        "invalid float literal" => "expected a number, got a string that is not one",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Registry;

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([
            ("route_guide.proto", include_str!("../../protos/route_guide.proto")),
            ("library.proto", include_str!("../../protos/library.proto")),
        ])
        .unwrap();
        r
    }

    #[test]
    fn round_trips_a_nested_message() {
        let r = registry();
        let desc = r.message("routeguide.Feature").unwrap();
        let json = br#"{"name":"A","location":{"latitude":409146138,"longitude":-746188906}}"#;
        let bytes = json_to_protobuf(&desc, json, &JsonOptions::default()).unwrap();
        assert_eq!(
            bytes,
            [10, 1, 65, 18, 17, 8, 154, 166, 140, 195, 1, 16, 150, 159, 152, 156, 253, 255, 255, 255, 255, 1]
        );
        let back = protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap();
        assert_eq!(back, std::str::from_utf8(json).unwrap());
    }

    #[test]
    fn bad_field_errors_name_the_json_path() {
        let r = registry();
        let desc = r.message("routeguide.Feature").unwrap();
        let err = json_to_protobuf(&desc, br#"{"location":{"latitude":true}}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "location.latitude: expected a 32-bit signed integer, got boolean `true`");
        let err = json_to_protobuf(&desc, br#"{"location":{"latitude":"north"}}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "location.latitude: expected an integer, got a string that is not one");
        let err = json_to_protobuf(&desc, br#"{"location":{"longitude":3000000000}}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "location.longitude: integer out of range");
        let err = json_to_protobuf(&desc, br#"{"nam":"x"}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "unrecognized field name 'nam'");
        let err = json_to_protobuf(&desc, br#"{"location":{"lat":1}}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "location: unrecognized field name 'lat'");
        let desc = r.message("routeguide.RouteSummary").unwrap();
        let err = json_to_protobuf(&desc, br#"{"pointCount": 1,"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "invalid JSON: EOF while parsing a value at line 1 column 17");
    }

    #[test]
    fn ignore_unknown_fields_option() {
        let r = registry();
        let desc = r.message("routeguide.Point").unwrap();
        let options = JsonOptions { ignore_unknown_fields: true, ..Default::default() };
        let bytes = json_to_protobuf(&desc, br#"{"latitude":1,"extra":[1,2]}"#, &options).unwrap();
        assert_eq!(bytes, [0x08, 0x01]);
    }

    #[test]
    fn print_options() {
        let r = registry();
        let desc = r.message("example.library.v1.Book").unwrap();
        let bytes = json_to_protobuf(&desc, br#"{"title":"T","genre":"HISTORY","pages":"12"}"#, &JsonOptions::default()).unwrap();
        let default = protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap();
        assert_eq!(default, r#"{"title":"T","genre":"HISTORY","pages":"12"}"#);
        let all = JsonOptions {
            emit_defaults: true,
            int64_as_number: true,
            enums_as_numbers: true,
            proto_field_names: true,
            ignore_unknown_fields: false,
        };
        let printed = protobuf_to_json(&desc, &bytes, &all).unwrap();
        assert_eq!(printed, r#"{"name":"","author":"","title":"T","genre":2,"tags":[],"pages":12}"#);
        let camel = r.message("example.library.v1.UpdateBookRequest").unwrap();
        let b = json_to_protobuf(&camel, br#"{"updateMask":"title,author"}"#, &JsonOptions::default()).unwrap();
        let proto_names = JsonOptions { proto_field_names: true, ..Default::default() };
        assert_eq!(protobuf_to_json(&camel, &b, &proto_names).unwrap(), r#"{"update_mask":"title,author"}"#);
    }

    #[test]
    fn invalid_bytes_name_the_type() {
        let r = registry();
        let desc = r.message("routeguide.Point").unwrap();
        let err = protobuf_to_json(&desc, &[0x08], &JsonOptions::default()).unwrap_err();
        assert!(err.to_string().starts_with("invalid routeguide.Point message: "), "{err}");
    }
}
