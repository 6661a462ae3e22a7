//! `google.api.http` bindings: path templates ([`template`]), a method's
//! bindings ([`binding`]), and the request message assembled from path
//! variables, query parameters and the body ([`request`]).

mod binding;
mod request;
mod template;

pub use binding::*;

/// How server-streamed messages reach an HTTP client (the filter's
/// `stream_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamFormat {
    /// One JSON document per line, sent as the messages arrive.
    #[default]
    Ndjson,
    /// Server-sent events (`data: {...}`), sent as the messages arrive.
    Sse,
    /// One JSON array, sent at the end (the messages are held).
    Array,
}
pub use request::*;
pub use template::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::JsonOptions;
    use crate::limits::{MAX_FIELD_PATH_BYTES, MAX_NESTING};
    use crate::Registry;

    fn library() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "library.proto",
            include_str!("../../../protos/library.proto"),
        )])
        .unwrap();
        r
    }

    fn binding(r: &Registry, method: &str, index: usize) -> Binding {
        let m = r
            .method(&format!("/example.library.v1.Library/{method}"))
            .unwrap();
        bindings_of(&m).0.remove(index)
    }

    #[test]
    fn the_root_template_matches_the_root_only() {
        let t = Template::parse("/").unwrap();
        assert_eq!(t.matches("/"), Some(vec![]));
        assert_eq!(t.matches("/a"), None);
        assert_eq!(t.matches(""), None);
    }

    #[test]
    fn a_binding_the_filter_cannot_use_is_left_out_alone() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "b.proto",
            r#"syntax = "proto3";
package b;
import "google/api/annotations.proto";
message Inner { string content = 1; }
message Reply { Inner nested = 1; string text = 2; }
message Ask { string id = 1; }
service S {
  rpc Root(Ask) returns (Reply) {
    option (google.api.http) = {
      get: "/"
      additional_bindings { get: "/v1/{id}" response_body: "nested.text" }
      additional_bindings { post: "/v1/{id}" body: "missing" }
      additional_bindings { get: "/v1/bad{" }
      additional_bindings { get: "/v1/{id}/text" response_body: "text" }
    };
  }
}"#,
        )])
        .unwrap();
        let (kept, left_out) = bindings_of(&r.method("/b.S/Root").unwrap());
        let kept: Vec<(String, Option<PathVars>)> = kept
            .iter()
            .map(|b| (b.http_method.clone(), b.template.matches("/")))
            .collect();
        assert_eq!(
            kept,
            vec![("GET".to_string(), Some(vec![])), ("GET".to_string(), None)]
        );
        assert_eq!(
            left_out,
            vec![
                "/b.S/Root (GET /v1/{id}): response_body 'nested.text' names no field of b.Reply (a field, or a dotted path through singular message fields, at most 8 deep)",
                "/b.S/Root (POST /v1/{id}): body 'missing' names no field of b.Ask (a field, or a dotted path through singular message fields, at most 8 deep)",
                "/b.S/Root (GET /v1/bad{): invalid path template '/v1/bad{': bad segment 'bad{'",
            ]
        );
    }

    #[test]
    fn templates_match_and_bind() {
        let t = Template::parse("/v1/{name=shelves/*/books/*}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/1/books/2"),
            Some(vec![(
                vec!["name".to_string()],
                "shelves/1/books/2".to_string()
            )])
        );
        assert_eq!(t.matches("/v1/shelves/1/books"), None);
        let t = Template::parse("/v1/shelves/{shelf}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/a%20b"),
            Some(vec![(vec!["shelf".to_string()], "a b".to_string())])
        );
        let t = Template::parse("/v1/search/{query=**}").unwrap();
        assert_eq!(
            t.matches("/v1/search/a/b%2Fc"),
            Some(vec![(vec!["query".to_string()], "a/b%2Fc".to_string())])
        );
        // Envoy's url_unescape_spec, for several segments only.
        let query = |path: &str, spec| t.matches_verb(path, true, spec).unwrap()[0].1.clone();
        let path = "/v1/search/x/a%3Ab%2Fc%20d%5B";
        assert_eq!(
            query(path, UrlUnescape::AllCharactersExceptReserved),
            "x/a%3Ab%2Fc d%5B"
        );
        assert_eq!(
            query(path, UrlUnescape::AllCharactersExceptSlash),
            "x/a:b%2Fc d["
        );
        assert_eq!(query(path, UrlUnescape::AllCharacters), "x/a:b/c d[");
        // A `**` that takes one segment is still several.
        assert_eq!(
            query("/v1/search/a%3Ab", UrlUnescape::AllCharactersExceptReserved),
            "a%3Ab"
        );
        assert!(is_raw_form_of("/v1/a%3Ab?x=%3A", b"/v1/a:b", "x=%3A"));
        assert!(!is_raw_form_of("/v1/a%3Ab", b"/v2/a:b", ""), "rewritten");
        assert!(!is_raw_form_of("/v1//a", b"/v1/a", ""), "merged slashes");
        assert!(is_raw_form_of("/v1/a%FFb", b"/v1/a\xffb", ""), "not UTF-8");
        assert_eq!(escaped_again(b"/v1/a\xff%b?"), "/v1/a%FF%25b%3F");
        assert_eq!(escaped_again("/v1/\u{e9}?".as_bytes()), "/v1/\u{e9}%3F");
        assert!(
            !is_raw_form_of("/v1/a%2Fb", b"/v1/a/b", ""),
            "a segment split"
        );
        assert!(is_raw_form_of("/v1/a%3F", b"/v1/a?", ""), "a ? of the path");
        assert_eq!(escaped_again(b"/v1/a?%41"), "/v1/a%3F%2541");
        assert_eq!(
            percent_decode("%+1%4g%41", UrlUnescape::AllCharacters),
            "%+1%4gA"
        );
        // Escapes that decode to no UTF-8 are refused, never replaced.
        let one = Template::parse("/v1/{name}").unwrap();
        let request = RequestPath::parse("/v1/a%FFb", true).unwrap();
        let spans = one.spans(&request).unwrap();
        assert_eq!(
            one.bind(&request, &spans, UrlUnescape::AllCharacters)
                .unwrap_err(),
            "path variable 'name': its escapes decode to bytes that are not UTF-8"
        );
        assert_eq!(
            one.matches("/v1/%C3%A9%EF%BF%BD").unwrap()[0].1,
            "\u{e9}\u{fffd}"
        );
        // No `=` or no name: nothing, as in Envoy.
        assert_eq!(
            query_pairs("tags&exact&=x&a=1&b=&").unwrap(),
            [("a", "1".to_string()), ("b", String::new())]
        );
        assert_eq!(
            query_pairs("a=1&b=%FF").unwrap_err(),
            "query parameter 'b': its value's escapes decode to bytes that are not UTF-8"
        );
        let name = one.matches_verb(
            "/v1/a%3Ab%2Fc",
            true,
            UrlUnescape::AllCharactersExceptReserved,
        );
        assert_eq!(name.unwrap()[0].1, "a:b/c");
        let t = Template::parse("/v1/{name=shelves/*/books/*}:move").unwrap();
        assert!(t.matches("/v1/shelves/1/books/2:move").is_some());
        assert!(t.matches("/v1/shelves/1/books/2").is_none());
        let t = Template::parse("/v1/{book.name=shelves/*/books/*}").unwrap();
        assert_eq!(
            t.matches("/v1/shelves/3/books/4").unwrap()[0].0,
            vec!["book".to_string(), "name".to_string()]
        );
        assert!(Template::parse("v1/x").is_err());
        assert!(Template::parse("/v1/**/x").is_err());
        assert!(Template::parse("/v1/{x").is_err());
        // As in Envoy: a ':' with no verb after it.
        assert_eq!(
            Template::parse("/v1/x:").unwrap_err(),
            "invalid path template '/v1/x:': a ':' must be followed by a verb"
        );
    }

    #[test]
    fn bindings_come_from_the_annotations() {
        let r = library();
        let list = bindings_of(&r.method("/example.library.v1.Library/ListBooks").unwrap()).0;
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].http_method.as_str(), list[1].http_method.as_str()),
            ("GET", "GET")
        );
        let head = binding(&r, "HeadShelf", 0);
        assert_eq!(head.http_method, "HEAD");
        assert_eq!(binding(&r, "SearchBooks", 0).response_body, "books");
        assert_eq!(binding(&r, "CreateBook", 0).body, "book");
    }

    #[test]
    fn query_field_paths_are_bounded_before_use() {
        assert_eq!(
            query_field_path("page.size"),
            Ok(vec!["page".to_string(), "size".to_string()])
        );
        let deep = vec!["a"; MAX_NESTING + 1].join(".");
        assert_eq!(
            query_field_path(&deep),
            Err(format!(
                "query parameter '{}...': field path deeper than 100 fields",
                &deep[..40]
            ))
        );
        let long = "x".repeat(MAX_FIELD_PATH_BYTES + 1);
        assert_eq!(
            query_field_path(&long),
            Err(format!(
                "query parameter '{}...': field path longer than 1024 bytes",
                "x".repeat(40)
            ))
        );
        assert!(query_field_path(&vec!["a"; MAX_NESTING].join(".")).is_ok());
    }

    #[test]
    fn query_names_name_fields_as_sent_then_decoded() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "q.proto",
            r#"syntax = "proto3";
package q;
import "google/api/annotations.proto";
message Shelf {
  string search_decoded = 1 [json_name = "search[decoded]"];
  string search_encoded = 2 [json_name = "search%5Bencoded%5D"];
}
message Find { Shelf shelf = 1; string theme = 2; }
service S { rpc Go(Find) returns (Find) { option (google.api.http) = { post: "/shelf" body: "*" }; } }"#,
        )])
        .unwrap();
        let b = bindings_of(&r.method("/q.S/Go").unwrap()).0.remove(0);
        let found = |query: &str| request(&b, "/shelf", query, b"");
        // Envoy's QueryParamsDecodedName: a name decoded, or as sent.
        for query in ["shelf.search%5Bdecoded%5D=G", "shelf.search[decoded]=G"] {
            assert_eq!(
                found(query).unwrap(),
                r#"{"shelf":{"search[decoded]":"G"}}"#,
                "{query}"
            );
        }
        assert_eq!(
            found("shelf.search%5Bencoded%5D=G").unwrap(),
            r#"{"shelf":{"search%5Bencoded%5D":"G"}}"#
        );
        assert!(found("shelf.search[encoded]=G").is_err());
        // A name is split at its dots as sent: %2E splits nothing.
        assert!(found("shelf%2Esearch_decoded=G").is_err());
        assert_eq!(found("th%65me=x").unwrap(), r#"{"theme":"x"}"#);
    }

    /// The request message `request_message` builds, printed as JSON.
    fn request(binding: &Binding, path: &str, query: &str, body: &[u8]) -> Result<String, String> {
        let vars = binding.template.matches(path).unwrap();
        let options = JsonOptions::default();
        let bytes = request_message(binding, vars, query, (body, None), &options)?;
        Ok(binding
            .method
            .input_type()
            .protobuf_to_json(&bytes, &options)
            .unwrap())
    }

    #[test]
    fn request_message_from_path_query_and_body() {
        let r = library();
        let create = binding(&r, "CreateBook", 0);
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", br#"{"title":"T"}"#).unwrap(),
            r#"{"shelf":"7","book":{"title":"T"}}"#
        );
        // The query may not replace what the path bound, by either name.
        for query in ["shelf=8", "shelf=7"] {
            assert_eq!(
                request(&create, "/v1/shelves/7/books", query, b"").unwrap_err(),
                "query parameter 'shelf' sets shelf, which the path binds"
            );
        }
        // An empty body still sets a message body field, as Envoy reads it.
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", b"").unwrap(),
            r#"{"shelf":"7","book":{}}"#
        );
        // Where the body is the whole message, the query still counts (Envoy
        // reads it too): it sets what the body leaves unset, and the body
        // wins where both set a field, as in Envoy.
        let shelf = binding(&r, "CreateShelf", 0);
        assert_eq!(
            request(
                &shelf,
                "/v1/shelves",
                "theme=line",
                br#"{"theme":"body","id":"3"}"#
            )
            .unwrap(),
            r#"{"id":"3","theme":"body"}"#
        );
        assert_eq!(
            request(&shelf, "/v1/shelves", "theme=line", br#"{"id":"3"}"#).unwrap(),
            r#"{"id":"3","theme":"line"}"#
        );
        let list = binding(&r, "ListBooks", 0);
        assert_eq!(
            request(
                &list,
                "/v1/shelves/3/books",
                "author=bob&page.size=5&genres=HISTORY&genres=2",
                b""
            )
            .unwrap(),
            r#"{"shelf":"3","page":{"size":5},"genres":["HISTORY","HISTORY"],"author":"bob"}"#
        );
        assert_eq!(
            request(&list, "/v1/shelves/3/books", "nope=1", b"").unwrap_err(),
            "nope: no such field in example.library.v1.ListBooksRequest"
        );
        let update = binding(&r, "UpdateBook", 0);
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "updateMask=title",
                br#"{"title":"New"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"New"},"updateMask":"title"}"#
        );
    }

    #[test]
    fn the_path_wins_over_the_body_the_body_over_the_query_and_errors_name_the_body_field() {
        let r = library();
        let update = binding(&r, "UpdateBook", 0);
        // The path's name replaces the body's; the rest of the book stays.
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "",
                br#"{"name":"shelves/9/books/9","title":"T"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"T"}}"#
        );
        // The body wins over the query, as in Envoy; the query sets what
        // the body leaves unset, a default too.
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "book.pages=0&book.title=",
                br#"{"title":"T","pages":"5"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"T","pages":"5"}}"#
        );
        assert_eq!(
            request(
                &update,
                "/v1/shelves/1/books/2",
                "book.title=Q",
                br#"{"pages":"5"}"#
            )
            .unwrap(),
            r#"{"book":{"name":"shelves/1/books/2","title":"Q","pages":"5"}}"#
        );
        assert_eq!(
            request(&update, "/v1/shelves/1/books/2", "", br#"{"pages":true}"#).unwrap_err(),
            "book.pages: expected integer, got boolean"
        );
        assert_eq!(
            request(&update, "/v1/shelves/1/books/2", "", b"{\"title\":").unwrap_err(),
            "invalid JSON: EOF while parsing a value at line 1 column 9"
        );
        let create = binding(&r, "CreateBook", 0);
        assert_eq!(
            request(&create, "/v1/shelves/7/books", "", b"[1]").unwrap_err(),
            "book: expected object, got array"
        );
    }

    #[test]
    fn response_body_selects_a_field() {
        let r = library();
        let search = binding(&r, "SearchBooks", 0);
        assert_eq!(
            response_part(&search, r#"{"books":[{"title":"a"}],"nextPageToken":"x"}"#),
            r#"[{"title":"a"}]"#
        );
        assert_eq!(response_part(&search, "{}"), "[]");
    }

    #[test]
    fn body_and_response_body_may_name_a_nested_field() {
        let mut r = Registry::new().unwrap();
        r.add_sources([(
            "n.proto",
            r#"syntax = "proto3";
package n;
import "google/api/annotations.proto";
message Note { string text = 1; int32 stars = 2; }
message Attachment { Note note = 1; string label = 2; }
message Ask { string id = 1; Attachment attachment = 2; }
service S {
  rpc Put(Ask) returns (Ask) {
    option (google.api.http) = {
      post: "/v1/{id}" body: "attachment.note" response_body: "attachment.note"
      additional_bindings { get: "/v1/{id}/label" response_body: "attachment.label" }
    };
  }
}"#,
        )])
        .unwrap();
        let (mut kept, left_out) = bindings_of(&r.method("/n.S/Put").unwrap());
        assert_eq!(left_out, Vec::<String>::new());
        let label = kept.remove(1);
        let put = kept.remove(0);
        let options = JsonOptions::default();
        let vars = vec![(vec!["id".to_string()], "7".to_string())];
        let bytes = request_message(
            &put,
            vars,
            "",
            (br#"{"text":"hi","stars":3}"#, None),
            &options,
        )
        .unwrap();
        let ask = crate::json::decode_message(&r.message("n.Ask").unwrap(), &bytes).unwrap();
        let printed = crate::json::message_to_json(&ask, &options).unwrap();
        assert_eq!(
            printed,
            r#"{"id":"7","attachment":{"note":{"text":"hi","stars":3}}}"#
        );
        assert_eq!(response_part(&put, &printed), r#"{"stars":3,"text":"hi"}"#);
        // Not printed (a default): the field's own default.
        assert_eq!(response_part(&put, r#"{"id":"7"}"#), "{}");
        assert_eq!(response_part(&label, r#"{"id":"7"}"#), "null");
        assert_eq!(
            response_part(&label, r#"{"attachment":{"label":"x"}}"#),
            r#""x""#
        );
        // An empty body still sets the nested message, present and empty.
        let bytes = request_message(&put, vec![], "", (b"", None), &options).unwrap();
        assert_eq!(bytes, vec![0x12, 0x02, 0x0a, 0x00]);
    }
}
