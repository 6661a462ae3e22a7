//! The options of Envoy's `grpc_json_transcoder`, read in its own spelling
//! so that a configuration translates line by line: an
//! option with a counterpart here becomes it; one whose meaning this filter
//! has whatever the value (or for the value Envoy defaults to) is accepted
//! and dropped; any other value is refused, naming what the filter does
//! instead. docs/envoy.md's option table says the same for each.

use serde_json::{Map, Value};

/// Envoy's name → this filter's, for options that mean the same.
const RENAMED: [(&str, &str); 3] = [
    ("proto_descriptor_bin", "descriptor_set"),
    ("max_request_body_size", "max_request_bytes"),
    ("max_response_body_size", "max_response_bytes"),
];

/// `print_options` members: Envoy's name → this filter's.
const PRINT_RENAMED: [(&str, &str); 3] = [
    ("always_print_primitive_fields", "emit_defaults"),
    ("always_print_enums_as_ints", "enums_as_numbers"),
    ("preserve_proto_field_names", "proto_field_names"),
];

/// Options whose only accepted value is the one given, and why.
const ONLY: [(&str, &str, &str); 8] = [
    (
        "auto_mapping",
        "true",
        "every method answers at POST /pkg.Service/Method; limit them with \"services\"",
    ),
    (
        "match_incoming_request_route",
        "false",
        "the filter's path rewrite makes Envoy route the request by its gRPC path",
    ),
    (
        "match_unregistered_custom_verb",
        "false",
        "a verb no binding registers stays part of the last segment",
    ),
    (
        "ignored_query_parameters",
        "[]",
        "every query parameter must name a field",
    ),
    (
        "ignore_unknown_query_parameters",
        "false",
        "a query parameter that names no field is refused with 400",
    ),
    (
        "capture_unknown_query_parameters",
        "false",
        "a query parameter that names no field is refused with 400",
    ),
    (
        "case_insensitive_enum_parsing",
        "false",
        "enum names are matched as the proto spells them",
    ),
    (
        "proto_descriptor",
        "null",
        "a wasm filter reads no files: give the descriptor set itself as \"proto_descriptor_bin\" or \"descriptor_set\" (base64)",
    ),
];

/// Options this filter takes whatever their value: it always does what
/// the option asks for (or cannot do otherwise), as docs/envoy.md says.
const ANY_VALUE: [&str; 1] = [
    // gRPC errors always become a `google.rpc.Status` JSON body.
    "convert_grpc_status",
];

/// Rewrites Envoy's spellings in a configuration document into this
/// filter's, or says which option cannot be taken.
pub fn translate(doc: &mut Map<String, Value>) -> Result<(), String> {
    for (envoy, ours) in RENAMED {
        rename(doc, envoy, ours, "")?;
    }
    for name in ANY_VALUE {
        doc.remove(name);
    }
    for (name, only, why) in ONLY {
        check_only(doc, name, only, why, "")?;
    }
    let format = match doc.get_mut("print_options") {
        Some(Value::Object(print)) => translate_print_options(print)?,
        _ => None,
    };
    if let Some(format) = format {
        if doc.contains_key("stream_format") {
            return Err(both("print_options.stream_*_delimited", "stream_format"));
        }
        doc.insert("stream_format".into(), Value::String(format.into()));
    }
    if let Some(options) = doc.remove("request_validation_options") {
        translate_validation(doc, options)?;
    }
    Ok(())
}

/// Renames the members of `print_options`; Envoy's stream flags become
/// the `stream_format` they choose, returned for the top level.
fn translate_print_options(print: &mut Map<String, Value>) -> Result<Option<&'static str>, String> {
    for (envoy, ours) in PRINT_RENAMED {
        rename(print, envoy, ours, "print_options.")?;
    }
    check_only(
        print,
        "add_whitespace",
        "false",
        "JSON is written compact",
        "print_options.",
    )?;
    let newline = take_bool(print, "stream_newline_delimited")?;
    let sse = take_bool(print, "stream_sse_style_delimited")?;
    match (newline, sse) {
        // SSE wins where both are set, as in Envoy.
        (_, Some(true)) => Ok(Some("sse")),
        (Some(true), _) => Ok(Some("ndjson")),
        // Envoy's comma-separated array, written as it comes.
        (Some(false), _) => Err(
            "print_options.stream_newline_delimited: false is Envoy's streamed JSON array: give \"stream_format\": \"array\" (sent at the end) or \"ndjson\"".into(),
        ),
        _ => Ok(None),
    }
}

fn translate_validation(doc: &mut Map<String, Value>, options: Value) -> Result<(), String> {
    let Value::Object(mut options) = options else {
        return Err("request_validation_options: expected an object".into());
    };
    let prefix = "request_validation_options.";
    if let Some(reject) = take_bool(&mut options, "reject_unknown_method")? {
        if doc.contains_key("reject_unknown_methods") {
            return Err(both(
                "request_validation_options.reject_unknown_method",
                "reject_unknown_methods",
            ));
        }
        doc.insert("reject_unknown_methods".into(), Value::Bool(reject));
    }
    // Unknown query parameters are refused whatever this says.
    take_bool(&mut options, "reject_unknown_query_parameters")?;
    check_only(
        &mut options,
        "reject_binding_body_field_collisions",
        "false",
        "where the path and the body set one field the path wins, where the body and the query the body",
        prefix,
    )?;
    match options.keys().next() {
        Some(unknown) => Err(format!(
            "invalid plugin configuration: unknown field `{prefix}{unknown}`"
        )),
        None => Ok(()),
    }
}

fn rename(
    map: &mut Map<String, Value>,
    envoy: &str,
    ours: &str,
    prefix: &str,
) -> Result<(), String> {
    let Some(value) = map.remove(envoy) else {
        return Ok(());
    };
    if map.contains_key(ours) {
        return Err(both(
            &format!("{prefix}{envoy}"),
            &format!("{prefix}{ours}"),
        ));
    }
    // Envoy's JSON writes UInt32Values as numbers, and bytes as base64.
    map.insert(ours.to_string(), value);
    Ok(())
}

fn both(envoy: &str, ours: &str) -> String {
    format!("{envoy} (Envoy's name) and {ours} are one option: give it once")
}

/// Drops `name` when it holds `only` (its JSON text), else refuses it.
fn check_only(
    map: &mut Map<String, Value>,
    name: &str,
    only: &str,
    why: &str,
    prefix: &str,
) -> Result<(), String> {
    let Some(value) = map.remove(name) else {
        return Ok(());
    };
    if serde_json::from_str::<Value>(only).is_ok_and(|accepted| accepted == value) {
        return Ok(());
    }
    Err(format!(
        "{prefix}{name}: only {only} is supported ({why}); see docs/envoy.md, \"Coming from Envoy's grpc_json_transcoder\""
    ))
}

fn take_bool(map: &mut Map<String, Value>, name: &str) -> Result<Option<bool>, String> {
    match map.remove(name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(format!("{name}: expected true or false, got {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translated(doc: Value) -> Result<Value, String> {
        let Value::Object(mut map) = doc else {
            panic!("an object")
        };
        translate(&mut map).map(|()| Value::Object(map))
    }

    #[test]
    fn envoy_names_become_this_filters() {
        let doc = serde_json::json!({
            "proto_descriptor_bin": "AAAA",
            "services": ["a.B"],
            "max_request_body_size": 1024,
            "max_response_body_size": 2048,
            "auto_mapping": true,
            "convert_grpc_status": true,
            "match_incoming_request_route": false,
            "url_unescape_spec": "ALL_CHARACTERS_EXCEPT_SLASH",
            "ignored_query_parameters": [],
            "query_param_unescape_plus": true,
            "print_options": {
                "add_whitespace": false,
                "stream_sse_style_delimited": true,
                "always_print_primitive_fields": true,
                "always_print_enums_as_ints": true,
                "preserve_proto_field_names": true
            },
            "request_validation_options": {
                "reject_unknown_method": false,
                "reject_unknown_query_parameters": true,
                "reject_binding_body_field_collisions": false
            }
        });
        assert_eq!(
            translated(doc).unwrap(),
            serde_json::json!({
                "descriptor_set": "AAAA",
                "services": ["a.B"],
                "max_request_bytes": 1024,
                "max_response_bytes": 2048,
                "query_param_unescape_plus": true,
                "url_unescape_spec": "ALL_CHARACTERS_EXCEPT_SLASH",
                "print_options": {
                    "emit_defaults": true,
                    "enums_as_numbers": true,
                    "proto_field_names": true
                },
                "reject_unknown_methods": false,
                "stream_format": "sse"
            })
        );
    }

    #[test]
    fn what_the_filter_does_not_do_is_refused_by_name() {
        let cases = [
            (
                serde_json::json!({"case_insensitive_enum_parsing": true}),
                "case_insensitive_enum_parsing: only false is supported (enum names are matched as the proto spells them); see docs/envoy.md, \"Coming from Envoy's grpc_json_transcoder\"",
            ),
            (
                serde_json::json!({"print_options": {"add_whitespace": true}}),
                "print_options.add_whitespace: only false is supported (JSON is written compact); see docs/envoy.md, \"Coming from Envoy's grpc_json_transcoder\"",
            ),
            (
                serde_json::json!({"max_request_body_size": 1, "max_request_bytes": 2}),
                "max_request_body_size (Envoy's name) and max_request_bytes are one option: give it once",
            ),
            (
                serde_json::json!({"print_options": {"stream_sse_style_delimited": true}, "stream_format": "sse"}),
                "print_options.stream_*_delimited (Envoy's name) and stream_format are one option: give it once",
            ),
            (
                serde_json::json!({"request_validation_options": {"reject_unknown_methods": true}}),
                "invalid plugin configuration: unknown field `request_validation_options.reject_unknown_methods`",
            ),
            (
                serde_json::json!({"proto_descriptor": "/etc/api.pb"}),
                "proto_descriptor: only null is supported (a wasm filter reads no files: give the descriptor set itself as \"proto_descriptor_bin\" or \"descriptor_set\" (base64)); see docs/envoy.md, \"Coming from Envoy's grpc_json_transcoder\"",
            ),
        ];
        for (doc, err) in cases {
            assert_eq!(translated(doc).unwrap_err(), err);
        }
    }
}
