//! JSON Schemas (OpenAPI 3.1's dialect) of messages as the core prints
//! them: the proto3 JSON mapping with the print options in force. Each
//! message is a component, referred to by its full name, so that
//! recursive messages are references, never expansions.

use std::collections::{BTreeMap, VecDeque};

use prost_reflect::{Cardinality, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{json, Map, Value};

use crate::json::JsonOptions;
use crate::limits::MAX_OPENAPI_SCHEMAS;

/// The components a document refers to, gathered as operations name them.
pub struct Components<'a> {
    options: &'a JsonOptions,
    schemas: BTreeMap<String, Value>,
    waiting: VecDeque<MessageDescriptor>,
}

impl<'a> Components<'a> {
    pub fn new(options: &'a JsonOptions) -> Self {
        Components {
            options,
            schemas: BTreeMap::new(),
            waiting: VecDeque::new(),
        }
    }

    /// The schema of a message where it is used: a well-known type's own
    /// JSON form, else a reference to its component.
    pub fn message(&mut self, message: &MessageDescriptor) -> Value {
        if let Some(known) = well_known(message, self.options) {
            return known;
        }
        let name = message.full_name().to_string();
        if !self.schemas.contains_key(&name) {
            self.schemas.insert(name.clone(), Value::Null);
            self.waiting.push_back(message.clone());
        }
        json!({ "$ref": format!("#/components/schemas/{name}") })
    }

    /// The schema of one field's value, as the field holds it (a list for
    /// a repeated field, an object for a map).
    pub fn field(&mut self, field: &FieldDescriptor) -> Value {
        if field.is_map() {
            if let Kind::Message(entry) = field.kind() {
                let value = self.kind(&entry.map_entry_value_field().kind());
                return json!({ "type": "object", "additionalProperties": value });
            }
        }
        let one = self.kind(&field.kind());
        if field.cardinality() == Cardinality::Repeated {
            return json!({ "type": "array", "items": one });
        }
        one
    }

    /// A scalar's, an enum's or a message's schema.
    pub fn kind(&mut self, kind: &Kind) -> Value {
        match kind {
            Kind::Message(m) => self.message(m),
            Kind::Enum(e) => {
                if self.options.enums_as_numbers {
                    json!({ "type": "integer", "format": "int32" })
                } else {
                    let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
                    json!({ "type": "string", "enum": names })
                }
            }
            scalar => scalar_schema(scalar, self.options),
        }
    }

    /// Builds every component named so far and those they name in turn;
    /// the `components.schemas` object. Fails past
    /// [`MAX_OPENAPI_SCHEMAS`] messages.
    pub fn finish(mut self) -> Result<Value, String> {
        while let Some(message) = self.waiting.pop_front() {
            if self.schemas.len() > MAX_OPENAPI_SCHEMAS {
                return Err(format!(
                    "the document would describe more than {MAX_OPENAPI_SCHEMAS} messages"
                ));
            }
            let schema = self.object(&message);
            self.schemas.insert(message.full_name().to_string(), schema);
        }
        Ok(Value::Object(self.schemas.into_iter().collect()))
    }

    fn object(&mut self, message: &MessageDescriptor) -> Value {
        let mut properties = Map::new();
        for field in message.fields() {
            let name = property_name(&field, self.options);
            properties.insert(name, self.field(&field));
        }
        json!({ "type": "object", "title": message.name(), "properties": properties })
    }
}

/// A field's name in JSON with these options.
pub fn property_name(field: &FieldDescriptor, options: &JsonOptions) -> String {
    if options.proto_field_names {
        field.name().to_string()
    } else {
        field.json_name().to_string()
    }
}

/// The proto3 JSON form of a scalar.
fn scalar_schema(kind: &Kind, options: &JsonOptions) -> Value {
    let wide = |format: &str| {
        if options.int64_as_number {
            json!({ "type": "integer", "format": format })
        } else {
            // Printed as a string: JSON numbers lose precision past 2^53.
            json!({ "type": "string", "format": format, "pattern": "^-?[0-9]+$" })
        }
    };
    match kind {
        Kind::Double | Kind::Float => {
            // NaN and the infinities are printed as strings.
            json!({ "oneOf": [
                { "type": "number" },
                { "type": "string", "enum": ["NaN", "Infinity", "-Infinity"] },
            ] })
        }
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            json!({ "type": "integer", "format": "int32" })
        }
        Kind::Uint32 | Kind::Fixed32 => {
            json!({ "type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295u64 })
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => wide("int64"),
        Kind::Uint64 | Kind::Fixed64 => wide("uint64"),
        Kind::Bool => json!({ "type": "boolean" }),
        Kind::String => json!({ "type": "string" }),
        Kind::Bytes => json!({ "type": "string", "contentEncoding": "base64" }),
        Kind::Message(_) | Kind::Enum(_) => json!({}),
    }
}

/// The JSON forms the proto3 mapping gives the well-known types.
fn well_known(message: &MessageDescriptor, options: &JsonOptions) -> Option<Value> {
    let wrapped = |kind: Kind| scalar_schema(&kind, options);
    Some(match message.full_name() {
        "google.protobuf.Timestamp" => json!({ "type": "string", "format": "date-time" }),
        "google.protobuf.Duration" => {
            json!({ "type": "string", "pattern": "^-?[0-9]+(\\.[0-9]{1,9})?s$" })
        }
        "google.protobuf.FieldMask" => json!({ "type": "string" }),
        "google.protobuf.Struct" => json!({ "type": "object" }),
        "google.protobuf.Value" => json!({}),
        "google.protobuf.ListValue" => json!({ "type": "array" }),
        "google.protobuf.Empty" => json!({ "type": "object" }),
        "google.protobuf.Any" => json!({
            "type": "object",
            "properties": { "@type": { "type": "string" } },
            "required": ["@type"],
        }),
        "google.protobuf.DoubleValue" | "google.protobuf.FloatValue" => wrapped(Kind::Double),
        "google.protobuf.Int64Value" => wrapped(Kind::Int64),
        "google.protobuf.UInt64Value" => wrapped(Kind::Uint64),
        "google.protobuf.Int32Value" => wrapped(Kind::Int32),
        "google.protobuf.UInt32Value" => wrapped(Kind::Uint32),
        "google.protobuf.BoolValue" => wrapped(Kind::Bool),
        "google.protobuf.StringValue" => wrapped(Kind::String),
        "google.protobuf.BytesValue" => wrapped(Kind::Bytes),
        _ => return None,
    })
}
