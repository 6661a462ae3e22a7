//! JSON ⇄ protobuf for any message type, following the proto3 JSON mapping.
//!
//! Written here rather than taken from prost-reflect's serde support, which
//! maps a `DynamicMessage` tree to and from JSON. That tree is what hostile
//! input multiplies: decoding a response into it, or a request's JSON into
//! it, cost 22x to 132x the input in memory, where this module
//! reads the wire bytes and the JSON text as they come and bounds the JSON
//! it writes per wire byte (`cost`). The mapping's strict corners are also
//! the conformance suite's, not serde's: integers checked exactly (no
//! fraction, no overflow, 64-bit ones printed as strings), a field given
//! twice under its two names refused, Timestamp,
//! Duration and FieldMask forms, `Any` with `@type` anywhere, and errors
//! that name the field path (`location.latitude: …`).
//! The tree printer stays as the reference the fuzz targets compare with.

mod de;
mod ser;
mod wkt;

pub use ser::cost;
pub use ser::forget_layouts;
#[cfg(test)]
pub(crate) use ser::kept_pool_count;

use prost_reflect::{DynamicMessage, MessageDescriptor};

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
    /// Skip unknown fields (and unknown enum names) in input JSON instead of failing.
    pub ignore_unknown_fields: bool,
}

impl JsonOptions {
    /// The options as one number, for an embedder that calls the module's
    /// `grpc_wasm_set_json_options` export: bit 0 `emit_defaults`, 1
    /// `int64_as_number`, 2 `enums_as_numbers`, 3 `proto_field_names`, 4
    /// `ignore_unknown_fields`.
    pub fn bits(&self) -> u32 {
        u32::from(self.emit_defaults)
            | u32::from(self.int64_as_number) << 1
            | u32::from(self.enums_as_numbers) << 2
            | u32::from(self.proto_field_names) << 3
            | u32::from(self.ignore_unknown_fields) << 4
    }

    /// The options from [`JsonOptions::bits`]; unknown bits are ignored.
    pub fn from_bits(bits: u32) -> JsonOptions {
        let on = |i: u32| bits & (1 << i) != 0;
        JsonOptions {
            emit_defaults: on(0),
            int64_as_number: on(1),
            enums_as_numbers: on(2),
            proto_field_names: on(3),
            ignore_unknown_fields: on(4),
        }
    }
}

/// The google.protobuf types whose JSON form is not an object of fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WellKnown {
    Any,
    Timestamp,
    Duration,
    FieldMask,
    Struct,
    Value,
    ListValue,
    Wrapper,
}

impl WellKnown {
    pub(crate) fn of(desc: &MessageDescriptor) -> Option<WellKnown> {
        let name = desc.full_name().strip_prefix("google.protobuf.")?;
        Some(match name {
            "Any" => WellKnown::Any,
            "Timestamp" => WellKnown::Timestamp,
            "Duration" => WellKnown::Duration,
            "FieldMask" => WellKnown::FieldMask,
            "Struct" => WellKnown::Struct,
            "Value" => WellKnown::Value,
            "ListValue" => WellKnown::ListValue,
            "DoubleValue" | "FloatValue" | "Int64Value" | "UInt64Value" | "Int32Value"
            | "UInt32Value" | "BoolValue" | "StringValue" | "BytesValue" => WellKnown::Wrapper,
            _ => return None,
        })
    }
}

/// `print_options` as a configuration gives them (each a boolean).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrintOptions {
    #[serde(default)]
    pub emit_defaults: bool,
    #[serde(default)]
    pub int64_as_number: bool,
    #[serde(default)]
    pub enums_as_numbers: bool,
    #[serde(default)]
    pub proto_field_names: bool,
}

impl PrintOptions {
    pub fn json_options(&self, ignore_unknown_fields: bool) -> JsonOptions {
        JsonOptions {
            emit_defaults: self.emit_defaults,
            int64_as_number: self.int64_as_number,
            enums_as_numbers: self.enums_as_numbers,
            proto_field_names: self.proto_field_names,
            ignore_unknown_fields,
        }
    }
}

/// Parses JSON into a message of type `desc`.
pub fn json_to_message(
    desc: &MessageDescriptor,
    json: &[u8],
    options: &JsonOptions,
) -> Result<DynamicMessage, Error> {
    decode_message(desc, &json_to_protobuf(desc, json, options)?)
}

/// Parses JSON and encodes it as protobuf (deterministically: fields in
/// number order, map entries sorted by key).
pub fn json_to_protobuf(
    desc: &MessageDescriptor,
    json: &[u8],
    options: &JsonOptions,
) -> Result<Vec<u8>, Error> {
    de::encode(desc, json, options)
}

/// A message type with the codec's choice made once (whether its messages
/// take the flat path), for a caller that converts many messages of it.
#[derive(Debug, Clone)]
pub struct MessageType {
    desc: MessageDescriptor,
    flat: bool,
}

impl MessageType {
    pub fn new(desc: MessageDescriptor) -> MessageType {
        let flat = ser::is_flat(&desc);
        MessageType { desc, flat }
    }

    pub fn descriptor(&self) -> &MessageDescriptor {
        &self.desc
    }

    /// [`json_to_protobuf`] for this type.
    pub fn json_to_protobuf(&self, json: &[u8], options: &JsonOptions) -> Result<Vec<u8>, Error> {
        de::encode(&self.desc, json, options)
    }

    /// [`MessageType::json_to_protobuf`], writing every field the JSON
    /// gives even when it holds its default, so that the bytes appended to
    /// another encoding of the message replace each field they set (an
    /// HTTP binding's request line over its body).
    pub fn json_to_protobuf_explicit(
        &self,
        json: &[u8],
        options: &JsonOptions,
    ) -> Result<Vec<u8>, Error> {
        de::encode_explicit(&self.desc, json, options)
    }

    /// JSON for the top-level field `field` alone (an HTTP binding's
    /// `body: "field"`), encoded as a message of this type holding it.
    pub fn field_json_to_protobuf(
        &self,
        field: &str,
        json: &[u8],
        options: &JsonOptions,
    ) -> Result<Vec<u8>, Error> {
        de::encode_field(&self.desc, field, json, options)
    }

    /// [`protobuf_to_json`] for this type.
    pub fn protobuf_to_json(&self, bytes: &[u8], options: &JsonOptions) -> Result<String, Error> {
        ser::print_json(&self.desc, self.flat, bytes, options)
    }
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
    ser::message_to_json(message, options)
}

/// Decodes protobuf bytes of type `desc` and writes them as JSON text.
pub fn protobuf_to_json(
    desc: &MessageDescriptor,
    bytes: &[u8],
    options: &JsonOptions,
) -> Result<String, Error> {
    ser::print_json(desc, ser::is_flat(desc), bytes, options)
}

/// Every print option on (tests compare both paths under it).
#[cfg(test)]
pub(crate) fn every_print_option() -> JsonOptions {
    JsonOptions {
        emit_defaults: true,
        int64_as_number: true,
        enums_as_numbers: true,
        proto_field_names: true,
        ignore_unknown_fields: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Registry;

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([
            (
                "route_guide.proto",
                include_str!("../../../protos/route_guide.proto"),
            ),
            (
                "library.proto",
                include_str!("../../../protos/library.proto"),
            ),
        ])
        .unwrap();
        r
    }

    #[test]
    fn json_options_survive_their_bit_set() {
        for bits in 0..32 {
            assert_eq!(JsonOptions::from_bits(bits).bits(), bits);
        }
        let o = JsonOptions::from_bits(0b1_0010);
        assert!(o.int64_as_number && o.ignore_unknown_fields);
        assert_eq!(o, JsonOptions::from_bits(0b1_0010 | 1 << 31));
    }

    #[test]
    fn round_trips_a_nested_message() {
        let r = registry();
        let desc = r.message("routeguide.Feature").unwrap();
        let json = br#"{"name":"A","location":{"latitude":409146138,"longitude":-746188906}}"#;
        let bytes = json_to_protobuf(&desc, json, &JsonOptions::default()).unwrap();
        assert_eq!(
            bytes,
            [
                10, 1, 65, 18, 17, 8, 154, 166, 140, 195, 1, 16, 150, 159, 152, 156, 253, 255, 255,
                255, 255, 1
            ]
        );
        let back = protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap();
        assert_eq!(back, std::str::from_utf8(json).unwrap());
    }

    #[test]
    fn bad_field_errors_name_the_json_path() {
        let r = registry();
        let desc = r.message("routeguide.Feature").unwrap();
        let err = json_to_protobuf(
            &desc,
            br#"{"location":{"latitude":true}}"#,
            &JsonOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "location.latitude: expected integer, got boolean"
        );
        let err = json_to_protobuf(
            &desc,
            br#"{"location":{"latitude":"north"}}"#,
            &JsonOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "location.latitude: expected an integer, got a string that is not one"
        );
        let err = json_to_protobuf(
            &desc,
            br#"{"location":{"longitude":3000000000}}"#,
            &JsonOptions::default(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "location.longitude: integer out of range");
        let err = json_to_protobuf(&desc, br#"{"nam":"x"}"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(err.to_string(), "unknown field 'nam' in routeguide.Feature");
        let err = json_to_protobuf(&desc, br#"{"location":{"lat":1}}"#, &JsonOptions::default())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "location: unknown field 'lat' in routeguide.Point"
        );
        let desc = r.message("routeguide.RouteSummary").unwrap();
        let err = json_to_protobuf(
            &desc,
            br#"{"pointCount": 1, "point_count": 2}"#,
            &JsonOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "point_count: field 'point_count' is given more than once"
        );
        let desc = r.message("example.library.v1.ListBooksResponse").unwrap();
        let err = json_to_protobuf(
            &desc,
            br#"{"books": [{}, {"genre": "POETRY"}]}"#,
            &JsonOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "books[1].genre: unknown value 'POETRY' of enum example.library.v1.Genre"
        );
        let err =
            json_to_protobuf(&desc, br#"{"pointCount": 1,"#, &JsonOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid JSON: EOF while parsing an object at line 1 column 17"
        );
    }

    #[test]
    fn ignore_unknown_fields_option() {
        let r = registry();
        let desc = r.message("routeguide.Point").unwrap();
        let options = JsonOptions {
            ignore_unknown_fields: true,
            ..Default::default()
        };
        let bytes = json_to_protobuf(&desc, br#"{"latitude":1,"extra":[1,2]}"#, &options).unwrap();
        assert_eq!(bytes, [0x08, 0x01]);
    }

    #[test]
    fn print_options() {
        let r = registry();
        let desc = r.message("example.library.v1.Book").unwrap();
        let bytes = json_to_protobuf(
            &desc,
            br#"{"title":"T","genre":"HISTORY","pages":"12"}"#,
            &JsonOptions::default(),
        )
        .unwrap();
        let default = protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap();
        assert_eq!(default, r#"{"title":"T","genre":"HISTORY","pages":"12"}"#);
        let all = every_print_option();
        let printed = protobuf_to_json(&desc, &bytes, &all).unwrap();
        assert_eq!(
            printed,
            r#"{"name":"","author":"","title":"T","genre":2,"tags":[],"pages":12}"#
        );
        let camel = r.message("example.library.v1.UpdateBookRequest").unwrap();
        let b = json_to_protobuf(
            &camel,
            br#"{"updateMask":"title,author"}"#,
            &JsonOptions::default(),
        )
        .unwrap();
        let proto_names = JsonOptions {
            proto_field_names: true,
            ..Default::default()
        };
        assert_eq!(
            protobuf_to_json(&camel, &b, &proto_names).unwrap(),
            r#"{"update_mask":"title,author"}"#
        );
    }

    #[test]
    fn invalid_bytes_name_the_type() {
        let r = registry();
        let desc = r.message("routeguide.Point").unwrap();
        let err = protobuf_to_json(&desc, &[0x08], &JsonOptions::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid routeguide.Point message: "),
            "{err}"
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::descriptors::Registry;
    use crate::limits::MAX_NESTING;
    use proptest::prelude::*;

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "library.proto",
            include_str!("../../../protos/library.proto"),
        )])
        .unwrap();
        r
    }

    /// A registry with `google.protobuf.Value` (and so `Struct`) loaded.
    fn with_struct() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "s.proto",
            "syntax = \"proto3\"; import \"google/protobuf/struct.proto\"; message S { google.protobuf.Value v = 1; }",
        )])
        .unwrap();
        r
    }

    /// An `Any` holding an `Any` ... `levels` deep, around an `Empty`.
    fn nested_any(levels: usize) -> Vec<u8> {
        use prost::Message;
        let mut any = prost_types::Any {
            type_url: "type.googleapis.com/google.protobuf.Empty".into(),
            value: Vec::new(),
        };
        for _ in 1..levels {
            any = prost_types::Any {
                type_url: "type.googleapis.com/google.protobuf.Any".into(),
                value: any.encode_to_vec(),
            };
        }
        any.encode_to_vec()
    }

    /// Runs `f` on a thread with the stack a wasm host gives a module, so
    /// that a walk too deep for it fails the test instead of passing on a
    /// native thread's larger stack.
    fn on_wasm_sized_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(512 << 10)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn any_inside_any_prints_to_the_nesting_limit_and_no_further() {
        on_wasm_sized_stack(|| {
            let r = registry();
            let any = r.message("google.protobuf.Any").unwrap();
            let ok = protobuf_to_json(&any, &nested_any(MAX_NESTING), &JsonOptions::default());
            assert!(ok.unwrap().starts_with(
                r#"{"@type":"type.googleapis.com/google.protobuf.Any","value":{"@type""#
            ));
            for levels in [MAX_NESTING + 1, 5000] {
                let err = protobuf_to_json(&any, &nested_any(levels), &JsonOptions::default());
                assert_eq!(
                    err.unwrap_err().to_string(),
                    "cannot write google.protobuf.Any as JSON: message nesting exceeds 100 levels"
                );
            }
        });
    }

    #[test]
    fn struct_inside_struct_parses_to_the_nesting_limit_and_no_further() {
        on_wasm_sized_stack(|| {
            let r = with_struct();
            let value = r.message("google.protobuf.Value").unwrap();
            // Each level of {"a": ...} is a Struct and a Value: two messages.
            let nest = |levels: usize| {
                format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels)).into_bytes()
            };
            assert!(json_to_protobuf(&value, &nest(49), &JsonOptions::default()).is_ok());
            let err = json_to_protobuf(&value, &nest(50), &JsonOptions::default()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "{}: message nesting exceeds 100 levels",
                    vec!["a"; 50].join(".")
                )
            );
        });
    }

    #[test]
    fn a_self_recursive_message_decodes_to_the_nesting_limit_and_no_further() {
        use prost::Message;
        use prost_types::value::Kind;
        on_wasm_sized_stack(|| {
            let r = with_struct();
            let desc = r.message("google.protobuf.Value").unwrap();
            // Each level is a Value and a ListValue: two messages.
            let nest = |levels: usize| {
                let mut value = prost_types::Value {
                    kind: Some(Kind::NullValue(0)),
                };
                for _ in 0..levels {
                    let list = prost_types::ListValue {
                        values: vec![value],
                    };
                    value = prost_types::Value {
                        kind: Some(Kind::ListValue(list)),
                    };
                }
                value.encode_to_vec()
            };
            let ok = protobuf_to_json(&desc, &nest(49), &JsonOptions::default()).unwrap();
            assert_eq!(ok, format!("{}null{}", "[".repeat(49), "]".repeat(49)));
            // The printer reads the wire and counts the levels itself.
            let err = protobuf_to_json(&desc, &nest(60), &JsonOptions::default()).unwrap_err();
            assert_eq!(
                err.to_string(),
                "cannot write google.protobuf.Value as JSON: message nesting exceeds 100 levels"
            );
            // So does the general path, which decodes first.
            let err = decode_message(&desc, &nest(60)).unwrap_err();
            assert!(err.to_string().contains("recursion limit reached"), "{err}");
        });
    }

    proptest! {
        #[test]
        fn arbitrary_json_text_never_panics(text in "\\PC{0,200}") {
            let r = registry();
            let desc = r.message("example.library.v1.UpdateBookRequest").unwrap();
            let _ = json_to_protobuf(&desc, text.as_bytes(), &JsonOptions::default());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let r = registry();
            let desc = r.message("example.library.v1.ListBooksResponse").unwrap();
            let _ = protobuf_to_json(&desc, &bytes, &JsonOptions::default());
        }

        #[test]
        fn printed_json_parses_back_to_the_same_bytes(
            title in "\\PC{0,20}", pages in any::<i64>(), tags in proptest::collection::vec("[a-z]{0,5}", 0..4)
        ) {
            let r = registry();
            let desc = r.message("example.library.v1.Book").unwrap();
            let json = serde_json::json!({"title": title, "pages": pages.to_string(), "tags": tags}).to_string();
            let bytes = json_to_protobuf(&desc, json.as_bytes(), &JsonOptions::default()).unwrap();
            let printed = protobuf_to_json(&desc, &bytes, &JsonOptions::default()).unwrap();
            let again = json_to_protobuf(&desc, printed.as_bytes(), &JsonOptions::default()).unwrap();
            prop_assert_eq!(bytes, again);
        }
    }
}
