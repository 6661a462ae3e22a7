//! Descriptions of what a descriptor pool holds, as plain JSON: the
//! services (with their methods and streaming kinds), messages and enums,
//! for every host's `services` / `describe` (as `grpcurl list` and
//! `describe` show them).

use crate::web::has_no_side_effects;
use prost_reflect::{
    Cardinality, DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    MethodDescriptor, ServiceDescriptor,
};
use serde_json::{json, Value};

pub fn services(pool: &DescriptorPool) -> Value {
    Value::Array(pool.services().map(|s| service(&s)).collect())
}

/// The service, method, message or enum called `name`.
pub fn describe(pool: &DescriptorPool, name: &str) -> Option<Value> {
    let name = name.trim_start_matches(['.', '/']);
    if let Some(found) = pool.get_service_by_name(name) {
        return Some(service(&found));
    }
    if let Some(found) = pool.get_message_by_name(name) {
        return Some(message(&found));
    }
    if let Some(found) = pool.get_enum_by_name(name) {
        return Some(enumeration(&found));
    }
    let (service_name, method_name) = name.rsplit_once(['/', '.'])?;
    let found = pool
        .get_service_by_name(service_name)?
        .methods()
        .find(|m| m.name() == method_name)?;
    Some(method(&found))
}

fn service(service: &ServiceDescriptor) -> Value {
    json!({
        "kind": "service",
        "name": service.full_name(),
        "methods": service.methods().map(|m| method(&m)).collect::<Vec<_>>(),
    })
}

fn method(method: &MethodDescriptor) -> Value {
    let kind = match (method.is_client_streaming(), method.is_server_streaming()) {
        (false, false) => "unary",
        (false, true) => "server_streaming",
        (true, false) => "client_streaming",
        (true, true) => "bidi_streaming",
    };
    json!({
        "kind": "method",
        "name": method.name(),
        "path": format!("/{}/{}", method.parent_service().full_name(), method.name()),
        "streaming": kind,
        "input": method.input().full_name(),
        "output": method.output().full_name(),
        "idempotent": has_no_side_effects(method),
    })
}

fn message(message: &MessageDescriptor) -> Value {
    json!({
        "kind": "message",
        "name": message.full_name(),
        "fields": message.fields().map(|f| field(&f)).collect::<Vec<_>>(),
    })
}

fn field(field: &FieldDescriptor) -> Value {
    let mut value = json!({
        "name": field.name(),
        "jsonName": field.json_name(),
        "number": field.number(),
    });
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            value["map"] = json!({
                "key": kind(&entry.map_entry_key_field().kind()),
                "value": kind(&entry.map_entry_value_field().kind()),
            });
        }
        return value;
    }
    value["type"] = kind(&field.kind());
    value["repeated"] = json!(field.cardinality() == Cardinality::Repeated);
    if let Some(oneof) = field
        .containing_oneof()
        .filter(|_| !field.field_descriptor_proto().proto3_optional())
    {
        value["oneof"] = json!(oneof.name());
    }
    value
}

/// A scalar's name (`int64`, `string`...), or `{"message": name}` /
/// `{"enum": name}`.
fn kind(kind: &Kind) -> Value {
    match kind {
        Kind::Message(m) => json!({ "message": m.full_name() }),
        Kind::Enum(e) => json!({ "enum": e.full_name() }),
        scalar => json!(format!("{scalar:?}").to_ascii_lowercase()),
    }
}

fn enumeration(enumeration: &EnumDescriptor) -> Value {
    json!({
        "kind": "enum",
        "name": enumeration.full_name(),
        "values": enumeration
            .values()
            .map(|v| json!({ "name": v.name(), "number": v.number() }))
            .collect::<Vec<_>>(),
    })
}
