//! Callout mode: the module makes the gRPC call itself, through the host.
//! This file is its host-free half: what a call carries (deadline,
//! metadata, its upstream), and how a host's failure report becomes a gRPC
//! status; [`host`] drives the host's calls and takes their callbacks.

use crate::code::Code;
use crate::metadata::{
    self, decode_binary, is_binary_key, is_exchange_header, Metadata, MetadataValue,
    PROXY_CONTROLLED_PREFIX,
};
use crate::status::{percent_decode, Status};
use crate::timeout::parse_timeout;

use super::config::Callout;
use crate::contract::{METADATA_PREFIX, ORIGINAL_PATH_HEADER};

pub(crate) mod host;

/// The call's deadline in milliseconds: the request's `grpc-timeout`, or
/// the configured default. Never 0: Envoy fails a call with timeout 0 at once.
pub fn deadline_ms(callout: &Callout, grpc_timeout: Option<&str>) -> Result<u64, Status> {
    let Some(value) = grpc_timeout else {
        return Ok(callout.timeout_ms);
    };
    let timeout =
        parse_timeout(value).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))?;
    Ok(u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, callout.max_timeout_ms))
}

/// Whether a client's `grpc-metadata-<key>` goes on: never `x-envoy-*`,
/// since Envoy reads those headers on the calls it makes (retries,
/// timeouts, routing) and forwarding them would hand the client the
/// proxy's controls.
fn forwarded(callout: &Callout, key: &str) -> bool {
    if key.starts_with(PROXY_CONTROLLED_PREFIX) {
        return false;
    }
    callout
        .forward_metadata
        .as_ref()
        .is_none_or(|keys| keys.iter().any(|k| k == key))
}

/// The metadata of a call: the configured entries, then every request
/// header `grpc-metadata-<key>` as `<key>` that the configuration lets
/// through (never `x-envoy-*`), then the headers `callout.propagate`
/// names whose value metadata can carry (the core's rule, as for the
/// shim's `grpc.init{propagate}`), unless the configuration sets them; a
/// carried header replaces the client's `grpc-metadata-` entry of its name. `-bin` values stay base64 text,
/// which is how the host puts them on the wire; they are checked here so
/// that a bad one is the client's 400, not the server's.
pub fn call_metadata<'a>(
    callout: &Callout,
    headers: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<Vec<(String, String)>, Status> {
    let mut out = callout.metadata.clone();
    let mut checked = Metadata::new();
    let mut named = Vec::new();
    for (name, value) in headers {
        // A request that goes on as itself carries `grpc-metadata-*` as
        // the headers they are: unwrapped here, one would stand in for a
        // header the proxy set or checked (`x-forwarded-for`,
        // `authorization`) before the filters after this one.
        if callout.forward_request_headers {
            forward_header(name, value, &mut out);
            continue;
        }
        let prefixed = name.len() >= METADATA_PREFIX.len()
            && name[..METADATA_PREFIX.len()].eq_ignore_ascii_case(METADATA_PREFIX.as_bytes());
        if !prefixed {
            if propagates(callout, name) {
                let key = String::from_utf8_lossy(name).to_ascii_lowercase();
                named.push((key, String::from_utf8_lossy(value).into_owned()));
            }
            continue;
        }
        let key = String::from_utf8_lossy(&name[METADATA_PREFIX.len()..]).to_ascii_lowercase();
        if !forwarded(callout, &key) {
            continue;
        }
        let text = String::from_utf8_lossy(value).into_owned();
        let result = if is_binary_key(&key) {
            decode_binary(&key, value)
                .and_then(|bytes| checked.append(&key, MetadataValue::Binary(bytes)))
        } else {
            checked.append(&key, MetadataValue::Ascii(text.clone()))
        };
        result.map_err(|e| {
            let name = String::from_utf8_lossy(name);
            Status::new(Code::InvalidArgument, format!("{name}: {e}"))
        })?;
        out.push((key, text));
    }
    // The configuration's entries win over a carried header; a carried
    // header wins over the client's `grpc-metadata-<name>`, since a filter
    // before this one may have set it (an identity, a request id) and the
    // client must not replace it.
    let configured = callout.metadata.len();
    let carried: Vec<_> = metadata::propagated(&out[..configured], &named)
        .cloned()
        .collect();
    if !carried.is_empty() {
        let mut index = 0;
        out.retain(|(key, _)| {
            index += 1;
            index <= configured || !carried.iter().any(|(k, _)| k == key)
        });
        out.extend(carried);
    }
    Ok(out)
}

/// A serialized `envoy.config.core.v3.GrpcService` whose `envoy_grpc`
/// names `cluster` and, when not empty, the call's `:authority`: the form
/// of `proxy_grpc_call`'s upstream that carries an authority (a bare
/// cluster name gets the cluster's name as its authority). Field numbers:
/// `GrpcService.envoy_grpc` 1; `EnvoyGrpc.cluster_name` 1, `authority` 2.
pub fn envoy_grpc_service(cluster: &str, authority: &[u8]) -> Vec<u8> {
    let mut envoy_grpc = Vec::with_capacity(cluster.len() + authority.len() + 6);
    prost::encoding::bytes::encode(1, &cluster.as_bytes().to_vec(), &mut envoy_grpc);
    if !authority.is_empty() {
        prost::encoding::bytes::encode(2, &authority.to_vec(), &mut envoy_grpc);
    }
    let mut service = Vec::with_capacity(envoy_grpc.len() + 3);
    prost::encoding::bytes::encode(1, &envoy_grpc, &mut service);
    service
}

/// The request's `:authority` as the loopback call's, lower-cased: a host
/// and port (at most 255 bytes of letters, digits, `.-_:[]`), as only a
/// real one names a virtual host. Envoy keeps a client per distinct
/// authority for a while: a header of any size and case would let a
/// client make it keep as many, as large, as it likes.
pub fn loopback_authority(authority: &str) -> Result<String, Status> {
    let host_char = |b: u8| b.is_ascii_alphanumeric() || b".-_:[]".contains(&b);
    if authority.len() > MAX_AUTHORITY_BYTES || !authority.bytes().all(host_char) {
        let shown: String = authority.chars().take(40).collect();
        return Err(Status::new(
            Code::InvalidArgument,
            format!("the request's authority '{shown}' is no host[:port] of at most {MAX_AUTHORITY_BYTES} bytes"),
        ));
    }
    Ok(authority.to_ascii_lowercase())
}

/// A DNS name (253) and a port, rounded.
const MAX_AUTHORITY_BYTES: usize = 255;

/// Names the call's client: gRPC's `grpc-<implementation>/<version>`,
/// unless a forwarded request's own `user-agent` goes on.
pub fn add_user_agent(metadata: &mut Vec<(String, String)>) {
    if !metadata.iter().any(|(k, _)| k == "user-agent") {
        metadata.push(("user-agent".into(), crate::USER_AGENT.into()));
    }
}

fn propagates(callout: &Callout, name: &[u8]) -> bool {
    callout
        .propagate
        .iter()
        .any(|p| p.as_bytes().eq_ignore_ascii_case(name))
}

/// A request header as the call's metadata, as it would have reached the
/// upstream with the request: pseudo-headers, the exchange's own headers
/// (see [`is_exchange_header`]), the proxy's `x-envoy-*` and the filter's own
/// `x-grpc-wasm-original-path` stay behind; the value goes as it came
/// (the proxy took it as a header value), unless it is no text.
fn forward_header(name: &[u8], value: &[u8], out: &mut Vec<(String, String)>) {
    let key = String::from_utf8_lossy(name).to_ascii_lowercase();
    if key.starts_with(':')
        || key.starts_with(PROXY_CONTROLLED_PREFIX)
        || key == ORIGINAL_PATH_HEADER
        || is_exchange_header(&key)
    {
        return;
    }
    if let Ok(text) = std::str::from_utf8(value) {
        out.push((key, text.to_string()));
    }
}

/// The status a host reported when a call failed. Envoy appends its
/// response details in braces (`...{upstream_reset_before_response_started}`),
/// which is noise to a client: with `host_details` (a host known to add
/// them) that suffix is cut, and nothing else; elsewhere the server's
/// message stays byte for byte (gRPC's interop special_status_message).
/// Envoy reports an expired deadline as UNAVAILABLE, and a server may
/// reset a call at its deadline with CANCEL; once the deadline has passed,
/// either is DEADLINE_EXCEEDED.
pub fn closed_status(
    code: u32,
    message: &str,
    elapsed_ms: u64,
    deadline_ms: u64,
    host_details: bool,
) -> Status {
    let code = i32::try_from(code)
        .map(Code::from_i32)
        .unwrap_or(Code::Unknown);
    // Envoy reports the `grpc-message` header as it came: percent-encoded.
    let decoded = percent_decode(message.as_bytes());
    let message = if host_details {
        strip_details_suffix(&decoded)
    } else {
        &decoded
    };
    // Host timers may fire a little early by the module's clock: 5% slack.
    let expired =
        elapsed_ms.saturating_add(deadline_ms / 20) >= deadline_ms || message == ENVOY_TIMEOUT;
    if matches!(code, Code::Unavailable | Code::Cancelled) && expired {
        let expired = Status::deadline_exceeded(deadline_ms);
        return Status {
            message: format!("{} ({message})", expired.message),
            ..expired
        };
    }
    if code == Code::Ok {
        // A close without a failure, yet no message arrived.
        return Status::new(Code::Internal, "the call ended without a response message");
    }
    Status::new(code, message)
}

/// Envoy's message for a call that hit its timeout.
const ENVOY_TIMEOUT: &str = "upstream request timeout";

fn strip_details_suffix(message: &str) -> &str {
    let trimmed = message.trim_end();
    if !trimmed.ends_with('}') {
        return message;
    }
    // The suffix's opening brace: walk back over balanced braces.
    let mut depth = 0usize;
    for (i, c) in trimmed.char_indices().rev() {
        match c {
            '}' => depth += 1,
            '{' => {
                depth -= 1;
                if depth == 0 {
                    return trimmed[..i].trim_end();
                }
            }
            _ => {}
        }
    }
    trimmed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn callout() -> Callout {
        Callout {
            upstream: b"c".to_vec(),
            timeout_ms: 5000,
            metadata: vec![("x-origin".into(), "proxy".into())],
            upstream_header: None,
            max_timeout_ms: 60_000,
            forward_metadata: None,
            propagate: crate::proxy::config::DEFAULT_PROPAGATE
                .map(String::from)
                .to_vec(),
            forward_request_headers: false,
        }
    }

    #[test]
    fn trace_context_goes_on_under_its_own_names() {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (
                b"TraceParent",
                b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            (b"tracestate", b"congo=t61rcWkgMzE"),
            (b"x-request-id", b"r-1"),
            (b"authorization", b"Bearer t"),
        ];
        let traced = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            call_metadata(&callout(), headers.iter().copied()).unwrap(),
            vec![
                traced("x-origin", "proxy"),
                traced(
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                ),
                traced("tracestate", "congo=t61rcWkgMzE"),
            ]
        );
        let more = Callout {
            propagate: vec!["x-request-id".into()],
            ..callout()
        };
        let mut metadata = call_metadata(&more, headers.iter().copied()).unwrap();
        add_user_agent(&mut metadata);
        assert_eq!(
            metadata,
            vec![
                traced("x-origin", "proxy"),
                traced("x-request-id", "r-1"),
                traced("user-agent", crate::USER_AGENT),
            ]
        );
        assert!(crate::USER_AGENT.starts_with("grpc-wasm/0."));
        // The configuration's metadata wins over a header carried on under
        // the same name, and the carried header over the client's
        // grpc-metadata- entry (a filter before may have set it); a value
        // metadata cannot carry stays behind.
        let own: Vec<(&[u8], &[u8])> = vec![
            (b"x-request-id", b"theirs"),
            (b"grpc-metadata-x-request-id", b"mine"),
            (b"x-origin", b"client"),
            (b"traceparent", b"caf\xc3\xa9"),
        ];
        let named = Callout {
            propagate: vec![
                "x-request-id".into(),
                "x-origin".into(),
                "traceparent".into(),
            ],
            ..callout()
        };
        assert_eq!(
            call_metadata(&named, own.iter().copied()).unwrap(),
            vec![
                traced("x-origin", "proxy"),
                traced("x-request-id", "theirs")
            ]
        );
    }

    #[test]
    fn a_loopback_call_names_its_cluster_and_the_requests_authority() {
        let mut expected = b"\x0a\x12\x0a\x05inner\x12\x09a.example".to_vec();
        assert_eq!(envoy_grpc_service("inner", b"a.example"), expected);
        expected.truncate(2 + 7);
        expected[1] = 7;
        assert_eq!(envoy_grpc_service("inner", b""), expected);
        let call = Callout::to_loopback("inner", b"a.example", "/v1/a");
        assert_eq!(call.upstream, envoy_grpc_service("inner", b"a.example"));
        assert!(call.forward_request_headers);
    }

    #[test]
    fn a_bodiless_requests_call_carries_its_headers_as_they_would_go_upstream() {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/v1/shelves/1"),
            (b"Authorization", b"Bearer t"),
            (b"content-type", b"application/json"),
            (b"x-envoy-retry-on", b"5xx"),
            (b"te", b"trailers"),
            (b"grpc-timeout", b"1S"),
            (b"x-trace-bin", b"AQI="),
            (b"x-tab", b"a\tb caf\xc3\xa9"),
            (b"grpc-metadata-tenant", b"t1"),
            (b"x-grpc-wasm-original-path", b"/forged"),
        ];
        let route = Callout::to_loopback("library", b"books.example", "/v1/shelves/1");
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        // As they go upstream on a request with a body: values as they
        // came, `grpc-metadata-*` as itself (unwrapped, it would stand in
        // for a header the proxy checked), the original path the filter's.
        assert_eq!(
            call_metadata(&route, headers.iter().copied()).unwrap(),
            vec![
                pair("x-grpc-wasm-original-path", "/v1/shelves/1"),
                pair("authorization", "Bearer t"),
                pair("x-trace-bin", "AQI="),
                pair("x-tab", "a\tb caf\u{e9}"),
                pair("grpc-metadata-tenant", "t1"),
            ]
        );
        let smuggled: Vec<(&[u8], &[u8])> = vec![
            (b"x-forwarded-for", b"1.1.1.1,192.0.2.2"),
            (b"grpc-metadata-x-forwarded-for", b"10.1.2.3"),
            (b"grpc-metadata-authorization", b"Bearer smuggled"),
        ];
        let sent = call_metadata(&route, smuggled.iter().copied()).unwrap();
        assert_eq!(
            sent[1..],
            [
                pair("x-forwarded-for", "1.1.1.1,192.0.2.2"),
                pair("grpc-metadata-x-forwarded-for", "10.1.2.3"),
                pair("grpc-metadata-authorization", "Bearer smuggled"),
            ]
        );
        assert_eq!(
            loopback_authority("Books.Example:8080").unwrap(),
            "books.example:8080"
        );
        assert_eq!(loopback_authority("[::1]:80").unwrap(), "[::1]:80");
        for bad in ["a b", "a/b", &"a".repeat(256)] {
            let err = loopback_authority(bad).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{bad}");
        }
        // A configured callout forwards only grpc-metadata-*.
        assert_eq!(
            call_metadata(&callout(), headers.iter().copied()).unwrap(),
            vec![
                ("x-origin".to_string(), "proxy".to_string()),
                ("tenant".to_string(), "t1".to_string()),
            ]
        );
    }

    #[test]
    fn deadlines() {
        assert_eq!(deadline_ms(&callout(), None), Ok(5000));
        assert_eq!(deadline_ms(&callout(), Some("250m")), Ok(250));
        assert_eq!(deadline_ms(&callout(), Some("10u")), Ok(1));
        // A client asks for hours; the cap holds.
        assert_eq!(deadline_ms(&callout(), Some("99999999H")), Ok(60_000));
        let err = deadline_ms(&callout(), Some("soon")).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(
            err.message.starts_with("invalid grpc-timeout 'soon'"),
            "{}",
            err.message
        );
    }

    fn borrowed(pairs: &[(String, Vec<u8>)]) -> impl Iterator<Item = (&[u8], &[u8])> {
        pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_slice()))
    }

    #[test]
    fn metadata_from_prefixed_headers() {
        let headers = vec![
            ("content-type".to_string(), b"application/json".to_vec()),
            ("Grpc-Metadata-User".to_string(), b"ann".to_vec()),
            ("grpc-metadata-trace-bin".to_string(), b"AQI".to_vec()),
        ];
        assert_eq!(
            call_metadata(&callout(), borrowed(&headers)).unwrap(),
            vec![
                ("x-origin".to_string(), "proxy".to_string()),
                ("user".to_string(), "ann".to_string()),
                ("trace-bin".to_string(), "AQI".to_string())
            ]
        );
        let bad = vec![("grpc-metadata-trace-bin".to_string(), b"@@".to_vec())];
        let err = call_metadata(&callout(), borrowed(&bad)).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(
            err.message,
            "grpc-metadata-trace-bin: invalid value for metadata key 'trace-bin': not valid base64"
        );
        let reserved = vec![("grpc-metadata-grpc-timeout".to_string(), b"1S".to_vec())];
        assert!(call_metadata(&callout(), borrowed(&reserved))
            .unwrap_err()
            .message
            .contains("reserved"));
    }

    #[test]
    fn proxy_controls_never_pass_and_an_allowlist_narrows_the_rest() {
        let headers = vec![
            (
                "grpc-metadata-x-envoy-retry-on".to_string(),
                b"5xx".to_vec(),
            ),
            (
                "Grpc-Metadata-X-Envoy-Upstream-Rq-Timeout-Ms".to_string(),
                b"1".to_vec(),
            ),
            ("grpc-metadata-user".to_string(), b"ann".to_vec()),
            ("grpc-metadata-tenant".to_string(), b"t1".to_vec()),
        ];
        let configured = ("x-origin".to_string(), "proxy".to_string());
        let user = ("user".to_string(), "ann".to_string());
        let tenant = ("tenant".to_string(), "t1".to_string());
        assert_eq!(
            call_metadata(&callout(), borrowed(&headers)).unwrap(),
            vec![configured.clone(), user, tenant.clone()]
        );
        let narrowed = Callout {
            forward_metadata: Some(vec!["tenant".into(), "x-envoy-retry-on".into()]),
            ..callout()
        };
        assert_eq!(
            call_metadata(&narrowed, borrowed(&headers)).unwrap(),
            vec![configured, tenant]
        );
    }

    #[test]
    fn host_failures() {
        let s = closed_status(
            14,
            "upstream connect error{remote_connection_failure{x}}",
            3,
            1000,
            true,
        );
        assert_eq!(s, Status::new(Code::Unavailable, "upstream connect error"));
        let s = closed_status(14, "stream timeout{a}", 960, 1000, true);
        assert_eq!(
            s,
            Status::new(
                Code::DeadlineExceeded,
                "deadline of 1000 ms exceeded (stream timeout)"
            )
        );
        let s = closed_status(14, "upstream request timeout", 10, 1000, true);
        assert_eq!(s.code, Code::DeadlineExceeded);
        assert_eq!(
            closed_status(14, "no%20route", 3, 1000, true),
            Status::new(Code::Unavailable, "no route")
        );
        assert_eq!(
            closed_status(5, "no {such} book", 0, 10, true),
            Status::new(Code::NotFound, "no {such} book")
        );
        assert_eq!(
            closed_status(
                1,
                "the server reset the stream with CANCEL",
                1000,
                1000,
                true
            ),
            Status::new(
                Code::DeadlineExceeded,
                "deadline of 1000 ms exceeded (the server reset the stream with CANCEL)"
            )
        );
        assert_eq!(
            closed_status(1, "the server reset the stream with CANCEL", 10, 1000, true),
            Status::new(Code::Cancelled, "the server reset the stream with CANCEL")
        );
        assert_eq!(closed_status(99, "x", 0, 10, true).code, Code::Unknown);
        assert_eq!(closed_status(0, "", 0, 10, true).code, Code::Internal);
        // A host that adds nothing (the shim): the server's words, whole.
        let special =
            "\t\ntest with whitespace\r\nand Unicode BMP \u{263a} and non-BMP \u{1f608}\t\n";
        assert_eq!(closed_status(2, special, 0, 10, false).message, special);
        assert_eq!(
            closed_status(3, "cannot parse {\"a\": 1}", 0, 10, false).message,
            "cannot parse {\"a\": 1}"
        );
        // Envoy's suffix goes, and only that: other trailing text stays.
        assert_eq!(closed_status(2, special, 0, 10, true).message, special);
    }
}
