//! Custom metadata: ASCII values, and binary values under `-bin` keys that
//! travel base64-encoded.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Emits unpadded base64, as gRPC implementations do, and accepts both forms
/// on input, as the gRPC spec requires.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

// Which headers a call's metadata may hold, for every host: what a user
// sets (`Metadata::append`), what a proxy forwards of a request
// (`is_exchange_header`), what a caller names to carry on
// (`check_propagated`).

/// Headers the transport writes itself, or hop-by-hop ones: never a call's
/// metadata, whoever names them.
const TRANSPORT: [&str; 9] = [
    "content-type",
    "te",
    "host",
    "connection",
    "transfer-encoding",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "content-length",
];

/// Headers of an HTTP exchange that gRPC writes for the call itself
/// (`grpc-*` and the content coding it accepts): a forwarded request's
/// are not the call's metadata.
const EXCHANGE: [&str; 4] = [
    "accept-encoding",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
];

/// The headers a proxy (Envoy) reads as its own controls.
pub const PROXY_CONTROLLED_PREFIX: &str = "x-envoy-";

/// Whether a request header (its lower-case name) says something about
/// the HTTP exchange rather than the call, so that a proxy forwarding the
/// request's headers as metadata leaves it behind.
pub fn is_exchange_header(key: &str) -> bool {
    TRANSPORT.contains(&key) || EXCHANGE.contains(&key)
}

/// Keys a user may not set: the transport's, gRPC's own `grpc-*`, and the
/// user-agent that names the client.
fn is_reserved(key: &str) -> bool {
    key.starts_with("grpc-") || TRANSPORT.contains(&key) || key == "user-agent"
}

/// A request header that a call may carry on as metadata when a caller
/// names it (the shim's `grpc.init{propagate}`, the filter's
/// `callout.propagate`): its lower-case name, or why not. Reserved keys,
/// the exchange's own headers and the proxy's controls are refused where
/// they are named, rather than failing or silently missing from every
/// call that meets them.
pub fn check_propagated(name: &str) -> Result<String, MetadataError> {
    let key = name.to_ascii_lowercase();
    check_key(&key)?;
    if is_reserved(&key) || is_exchange_header(&key) || key.starts_with(PROXY_CONTROLLED_PREFIX) {
        return Err(MetadataError::NotPropagated(key));
    }
    Ok(key)
}

/// Whether a named request header's value can go on as metadata, as it
/// came: printable ASCII, and under a `-bin` key base64 with nothing
/// around it (the value goes on untrimmed, so the whitespace
/// [`decode_binary`] forgives would reach the wire). One that cannot stays
/// behind and the call goes on without it.
pub fn propagates_value(key: &str, value: &[u8]) -> bool {
    if check_ascii(key, value).is_err() {
        return false;
    }
    !is_binary_key(key)
        || (value.trim_ascii().len() == value.len() && decode_binary(key, value).is_ok())
}

/// The headers a call carries on from the request it serves: each
/// `(name, value)` in `named` (names checked by [`check_propagated`])
/// whose value can go, unless the call's own metadata `own` sets it.
pub fn propagated<'a>(
    own: &'a [(String, String)],
    named: &'a [(String, String)],
) -> impl Iterator<Item = &'a (String, String)> + Clone {
    named.iter().filter(|(key, value)| {
        check_propagated(key).as_deref() == Ok(key.as_str())
            && !own.iter().any(|(k, _)| k == key)
            && propagates_value(key, value.as_bytes())
    })
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The key as given, with bytes that are not printable ASCII as `?`.
    #[error("invalid metadata key '{0}': only letters, digits, '-', '_' and '.'")]
    InvalidKey(String),
    #[error("metadata key '{0}' is reserved for the gRPC protocol")]
    ReservedKey(String),
    #[error("{0} is the HTTP/2, gRPC or proxy's own, not metadata a call can carry")]
    NotPropagated(String),
    #[error("metadata value of '{0}' is not printable ASCII (0x20-0x7E: no NUL, CR, LF or other control character); binary values need a key ending in -bin")]
    InvalidAsciiValue(String),
    #[error("invalid value for metadata key '{0}': not valid base64")]
    InvalidBase64(String),
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataValue {
    Ascii(String),
    Binary(Vec<u8>),
}

/// Request or response metadata in arrival order; keys may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value a user supplied. The key is lower-cased; `-bin` keys take
    /// raw bytes, all other keys printable ASCII.
    pub fn append(&mut self, key: &str, value: MetadataValue) -> Result<(), MetadataError> {
        let key = validate_user_key(key)?;
        match (&value, is_binary_key(&key)) {
            (MetadataValue::Ascii(text), false) => check_ascii(&key, text.as_bytes())?,
            (MetadataValue::Ascii(text), true) => {
                // A string for a -bin key is the raw value, not base64.
                let bytes = text.clone().into_bytes();
                self.entries.push((key, MetadataValue::Binary(bytes)));
                return Ok(());
            }
            (MetadataValue::Binary(_), false) => return Err(MetadataError::InvalidAsciiValue(key)),
            (MetadataValue::Binary(_), true) => {}
        }
        self.entries.push((key, value));
        Ok(())
    }

    /// Adds a header as it came off the wire (no reserved-name check: the
    /// peer's own headers are reported, not refused).
    pub fn append_wire(&mut self, key: &str, value: &[u8]) -> Result<(), MetadataError> {
        let key = key.to_ascii_lowercase();
        let value = if is_binary_key(&key) {
            MetadataValue::Binary(decode_binary(&key, value)?)
        } else {
            check_ascii(&key, value)?;
            MetadataValue::Ascii(String::from_utf8_lossy(value).into_owned())
        };
        self.entries.push((key, value));
        Ok(())
    }

    /// The first value for a key.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as HTTP/2 header pairs, binary values base64-encoded.
    pub fn to_headers(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    MetadataValue::Ascii(text) => text.clone(),
                    MetadataValue::Binary(bytes) => BASE64.encode(bytes),
                };
                (k.clone(), value)
            })
            .collect()
    }
}

pub fn is_binary_key(key: &str) -> bool {
    key.ends_with("-bin")
}

/// Decodes a `-bin` header value, padded or not.
pub fn decode_binary(key: &str, value: &[u8]) -> Result<Vec<u8>, MetadataError> {
    let trimmed = value.trim_ascii();
    BASE64
        .decode(trimmed)
        .map_err(|_| MetadataError::InvalidBase64(key.to_string()))
}

/// Encodes bytes for a `-bin` header.
pub fn encode_binary(value: &[u8]) -> String {
    BASE64.encode(value)
}

/// Whether a byte may stand in a metadata key: lower-case letters, digits,
/// `-`, `_` and `.` (gRPC's rule for custom metadata).
pub fn is_key_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
}

/// Checks one entry as it will be sent, the key lower-cased and a `-bin`
/// value base64 by then: gRPC's rule for custom metadata keys, and values
/// of printable ASCII, so that no value can end a header line (CR, LF) or
/// a NUL-separated entry. The one rule for every caller: the filter's
/// callouts ([`Metadata::append`]), the shim's `Client::start`, and
/// through the shim's error, Lua.
pub fn check_entry(key: &str, value: &[u8]) -> Result<(), MetadataError> {
    check_key(key)?;
    check_ascii(key, value)
}

fn check_key(key: &str) -> Result<(), MetadataError> {
    if key.is_empty() || !key.bytes().all(is_key_byte) {
        let shown = key
            .chars()
            .map(|c| if matches!(c, ' '..='~') { c } else { '?' })
            .collect();
        return Err(MetadataError::InvalidKey(shown));
    }
    Ok(())
}

fn validate_user_key(key: &str) -> Result<String, MetadataError> {
    let lower = key.to_ascii_lowercase();
    check_key(&lower)?;
    if is_reserved(&lower) {
        return Err(MetadataError::ReservedKey(lower));
    }
    Ok(lower)
}

fn check_ascii(key: &str, value: &[u8]) -> Result<(), MetadataError> {
    if value.iter().all(|b| (0x20..=0x7e).contains(b)) {
        Ok(())
    } else {
        Err(MetadataError::InvalidAsciiValue(key.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_and_binary_values() {
        let mut md = Metadata::new();
        md.append("X-User", MetadataValue::Ascii("alice".into()))
            .unwrap();
        md.append("trace-bin", MetadataValue::Binary(vec![0, 1, 2, 0xff]))
            .unwrap();
        assert_eq!(
            md.to_headers(),
            vec![
                ("x-user".to_string(), "alice".to_string()),
                ("trace-bin".to_string(), "AAEC/w".to_string())
            ]
        );
    }

    #[test]
    fn binary_input_accepts_padding_or_not() {
        assert_eq!(
            decode_binary("k-bin", b"AAEC/w==").unwrap(),
            vec![0, 1, 2, 0xff]
        );
        assert_eq!(
            decode_binary("k-bin", b"AAEC/w").unwrap(),
            vec![0, 1, 2, 0xff]
        );
        assert_eq!(
            decode_binary("k-bin", b"***").unwrap_err().to_string(),
            "invalid value for metadata key 'k-bin': not valid base64"
        );
        let mut md = Metadata::new();
        md.append_wire("Trace-Bin", b"aGk").unwrap();
        assert_eq!(
            md.get("trace-bin"),
            Some(&MetadataValue::Binary(b"hi".to_vec()))
        );
    }

    #[test]
    fn reserved_and_invalid_keys_are_refused() {
        let mut md = Metadata::new();
        for key in ["grpc-timeout", "content-type", "te", "Grpc-Status"] {
            let err = md
                .append(key, MetadataValue::Ascii("x".into()))
                .unwrap_err();
            assert!(matches!(err, MetadataError::ReservedKey(_)), "{key}: {err}");
        }
        assert_eq!(
            md.append(":path", MetadataValue::Ascii("/".into()))
                .unwrap_err()
                .to_string(),
            "invalid metadata key ':path': only letters, digits, '-', '_' and '.'"
        );
        assert_eq!(
            md.append("x-a", MetadataValue::Ascii("line\nbreak".into()))
                .unwrap_err(),
            MetadataError::InvalidAsciiValue("x-a".into())
        );
        assert!(md.is_empty());
    }

    #[test]
    fn named_headers_propagate_unless_the_protocols_or_the_call_own_them() {
        assert_eq!(check_propagated("TraceParent"), Ok("traceparent".into()));
        for refused in [
            "grpc-trace-bin",
            "User-Agent",
            "x-envoy-retry-on",
            "accept-encoding",
            "te",
        ] {
            assert_eq!(
                check_propagated(refused).unwrap_err().to_string(),
                format!(
                    "{} is the HTTP/2, gRPC or proxy's own, not metadata a call can carry",
                    refused.to_ascii_lowercase()
                )
            );
        }
        assert!(matches!(
            check_propagated("a b"),
            Err(MetadataError::InvalidKey(_))
        ));
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        let own = [pair("x-request-id", "mine")];
        let named = [
            pair("x-request-id", "theirs"),
            pair("traceparent", "00-ab-01"),
            pair("tracestate", "caf\u{e9}"),
            pair("trace-bin", "AAEC/w=="),
            pair("bad-bin", "***"),
            pair("spaced-bin", "AAEC/w==\t"),
            pair("lined-bin", "\nAAEC"),
            pair("te", "trailers"),
        ];
        let kept: Vec<_> = propagated(&own, &named).map(|(k, _)| k.as_str()).collect();
        assert_eq!(kept, ["traceparent", "trace-bin"]);
    }

    #[test]
    fn one_rule_for_entries_as_sent() {
        assert_eq!(check_entry("x-id", b"7 / ok~"), Ok(()));
        assert_eq!(check_entry("trace-bin", b"AAEC/w"), Ok(()));
        let value = |v: &[u8]| check_entry("a", v).unwrap_err().to_string();
        let refused = "metadata value of 'a' is not printable ASCII (0x20-0x7E: no NUL, CR, LF or other control character); binary values need a key ending in -bin";
        for bad in [
            &b"x\0authorization\0Bearer x"[..],
            b"x\r\nevil: 1",
            b"\x7f",
            "caf\u{e9}".as_bytes(),
        ] {
            assert_eq!(value(bad), refused, "{bad:?}");
        }
        let key = |k: &str| check_entry(k, b"x").unwrap_err().to_string();
        assert_eq!(
            key("a\0authorization"),
            "invalid metadata key 'a?authorization': only letters, digits, '-', '_' and '.'"
        );
        assert_eq!(
            key("X-Id"),
            "invalid metadata key 'X-Id': only letters, digits, '-', '_' and '.'"
        );
        assert_eq!(
            key(""),
            "invalid metadata key '': only letters, digits, '-', '_' and '.'"
        );
    }
}
