use super::*;
use crate::limits::MAX_OPENAPI_QUERY_FIELDS;
use crate::Registry;

fn registry(name: &str, source: &str) -> Registry {
    let mut registry = Registry::new().unwrap();
    registry.add_sources([(name, source)]).unwrap();
    registry
}

/// The document of every method of `registry`, with these options.
fn document_for(registry: &Registry, json: &JsonOptions, stream_format: StreamFormat) -> Value {
    let options = Options {
        json,
        stream_format,
        title: "test",
    };
    let text = document_of(registry, None, &options).unwrap();
    if let Ok(dir) = std::env::var("GRPC_WASM_OPENAPI_OUT") {
        std::fs::write(format!("{dir}/{}.json", options.title), &text).unwrap();
    }
    serde_json::from_slice(&text).unwrap()
}

fn library() -> Registry {
    registry(
        "library.proto",
        include_str!("../../../protos/library.proto"),
    )
}

#[test]
fn bindings_become_operations_with_their_path_and_query_parameters() {
    let doc = document_for(&library(), &JsonOptions::default(), StreamFormat::Ndjson);
    let paths = doc["paths"].as_object().unwrap();
    let get_book = &paths["/v1/shelves/{name_1}/books/{name_2}"]["get"];
    assert_eq!(
        get_book["operationId"],
        "example_library_v1_Library_GetBook"
    );
    let names: Vec<&str> = get_book["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["name_1", "name_2"]);
    let list = &paths["/v1/shelves/{shelf}/books"]["get"];
    let query: Vec<(&str, &str)> = list["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["in"].as_str().unwrap()))
        .collect();
    assert_eq!(
        query,
        [
            ("shelf", "path"),
            ("page.size", "query"),
            ("page.token", "query"),
            ("genres", "query"),
            ("author", "query")
        ]
    );
    // An additional binding, and every method at its own path.
    assert_eq!(
        paths["/v1/books"]["get"]["operationId"],
        "example_library_v1_Library_ListBooks_2"
    );
    assert!(paths["/example.library.v1.Library/GetBook"]["post"].is_object());
    // A custom verb, a body of one field, a HEAD.
    assert!(paths["/v1/shelves/{name_1}/books/{name_2}:move"]["post"].is_object());
    assert_eq!(
        paths["/v1/shelves/{shelf}/books"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/example.library.v1.Book"
    );
    assert!(paths["/v1/shelves/{shelf}"]["head"].is_object());
    // A server stream as the filter sends it.
    let stream = &paths["/v1/shelves/{shelf}/books:stream"]["get"]["responses"]["200"]["content"];
    assert_eq!(
        stream["application/x-ndjson"]["x-itemSchema"]["$ref"],
        "#/components/schemas/example.library.v1.Book"
    );
    // Errors.
    assert_eq!(
        get_book["responses"]["default"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/google.rpc.Status"
    );
}

#[test]
fn schemas_follow_the_proto3_json_mapping_as_printed() {
    let source = r#"syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
enum Kind { KIND_UNSPECIFIED = 0; BIG = 1; }
message Node {
  int64 id = 1;
  uint32 small = 2;
  string display_name = 3;
  repeated Node children = 4;
  map<string, int32> counts = 5;
  Kind kind = 6;
  google.protobuf.Timestamp at = 7;
  google.protobuf.Int64Value maybe = 8;
  bytes data = 9;
  double ratio = 10;
}
service S {
  rpc Get(Node) returns (Node);
  rpc Old(Node) returns (Node) { option deprecated = true; }
}
"#;
    let r = registry("t.proto", source);
    let doc = document_for(&r, &JsonOptions::default(), StreamFormat::Ndjson);
    let node = &doc["components"]["schemas"]["t.Node"]["properties"];
    assert_eq!(node["id"]["type"], "string");
    assert_eq!(node["small"]["type"], "integer");
    assert!(node["displayName"].is_object(), "JSON names by default");
    assert_eq!(
        node["children"]["items"]["$ref"],
        "#/components/schemas/t.Node"
    );
    assert_eq!(node["counts"]["additionalProperties"]["type"], "integer");
    assert_eq!(node["kind"]["enum"], json!(["KIND_UNSPECIFIED", "BIG"]));
    assert_eq!(node["at"]["format"], "date-time");
    assert_eq!(node["maybe"]["type"], "string");
    assert_eq!(node["data"]["contentEncoding"], "base64");
    // `deprecated` marks the method's operations, and only those.
    assert_eq!(doc["paths"]["/t.S/Old"]["post"]["deprecated"], true);
    assert!(doc["paths"]["/t.S/Get"]["post"].get("deprecated").is_none());
    let names = JsonOptions {
        proto_field_names: true,
        enums_as_numbers: true,
        int64_as_number: true,
        ..JsonOptions::default()
    };
    let doc = document_for(&r, &names, StreamFormat::Array);
    let node = &doc["components"]["schemas"]["t.Node"]["properties"];
    assert!(node["display_name"].is_object());
    assert_eq!(node["kind"]["type"], "integer");
    assert_eq!(node["id"]["type"], "integer");
}

#[test]
fn a_path_bound_twice_alike_is_in_neither_operation() {
    let r = registry(
        "shelves.proto",
        include_str!("../../../protos/shelves.proto"),
    );
    let doc = document_for(&r, &JsonOptions::default(), StreamFormat::Ndjson);
    let paths = doc["paths"].as_object().unwrap();
    assert!(!paths.contains_key("/twins/{shelf}"));
    assert!(!paths.contains_key("/twins/{id}"));
    // Both methods stay at their own paths.
    assert!(paths["/shelves.Bookstore/TwinA"]["post"].is_object());
    assert!(paths["/shelves.Bookstore/TwinB"]["post"].is_object());
    // A dotted path variable is named with `_`; the field it fills is said.
    let patch = &paths["/shelves/{shelf}/books/{book_id}"]["patch"];
    assert_eq!(patch["parameters"][1]["description"], "`book.id`");
}

#[test]
fn a_wide_deep_request_is_bounded_in_query_parameters_and_time() {
    // Eight levels, each message 60 fields of the next: 60^8 field paths.
    let mut source = String::from("syntax = \"proto3\";\npackage w;\n");
    for level in 0..8 {
        source.push_str(&format!("message L{level} {{\n"));
        for f in 1..=60 {
            let kind = if level == 7 {
                "string".to_string()
            } else {
                format!("L{}", level + 1)
            };
            source.push_str(&format!("  {kind} f{f} = {f};\n"));
        }
        source.push_str("}\n");
    }
    source.push_str(
        "import \"google/api/annotations.proto\";\nservice S { rpc Get(L0) returns (L0) { option (google.api.http) = { get: \"/w\" }; } }\n",
    );
    let r = registry("w.proto", &source);
    let started = std::time::Instant::now();
    let doc = document_for(&r, &JsonOptions::default(), StreamFormat::Ndjson);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let get = &doc["paths"]["/w"]["get"];
    assert!(get["parameters"].as_array().unwrap().len() <= MAX_OPENAPI_QUERY_FIELDS);
    assert_eq!(
        get["description"],
        "Query parameters past the first 1024 fields of the request are left out."
    );
}
