//! The status that ends every call: `grpc-status`, `grpc-message` and
//! `grpc-status-details-bin`.

use std::fmt;

use crate::code::Code;
use crate::metadata::decode_binary;

/// The outcome of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
    /// The raw `google.rpc.Status` bytes of `grpc-status-details-bin`, if any.
    pub details: Option<Vec<u8>>,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
            details: None,
        }
    }

    pub fn ok() -> Self {
        Status::new(Code::Ok, "")
    }

    pub fn is_ok(&self) -> bool {
        self.code == Code::Ok
    }

    /// The status carried by a header block (trailers, or the headers of a
    /// trailers-only response). `None` when `grpc-status` is absent. A
    /// malformed `grpc-status` is itself reported as UNKNOWN, and undecodable
    /// details are dropped rather than hiding the status they came with.
    pub fn from_header_values(
        grpc_status: Option<&[u8]>,
        grpc_message: Option<&[u8]>,
        details_bin: Option<&[u8]>,
    ) -> Option<Status> {
        let raw = grpc_status?;
        let message = grpc_message.map(percent_decode).unwrap_or_default();
        let status = match Code::from_header(raw) {
            Some(code) => Status::new(code, message),
            None => Status::new(
                Code::Unknown,
                format!("invalid grpc-status '{}'", String::from_utf8_lossy(raw)),
            ),
        };
        let details = details_bin.and_then(|v| decode_binary("grpc-status-details-bin", v).ok());
        Some(Status { details, ..status })
    }

    /// A response that ended without `grpc-status` where the protocol puts
    /// one (`place`: its trailers, its trailers frame, its end): the peer
    /// broke the protocol, which gRPC reports as INTERNAL on every host.
    pub fn missing_grpc_status(place: &str) -> Status {
        Status::new(Code::Internal, format!("no grpc-status in {place}"))
    }

    /// A call that outlived its deadline, as every host and transport
    /// reports it.
    pub fn deadline_exceeded(deadline_ms: u64) -> Status {
        Status::new(
            Code::DeadlineExceeded,
            format!("deadline of {deadline_ms} ms exceeded"),
        )
    }

    /// A stream the server reset with HTTP/2 error code `reason`, on every
    /// transport: the code [`Code::from_h2_reset`] maps it to, and its
    /// name as RFC 9113 (section 7) writes it.
    pub fn from_h2_reset(reason: u32) -> Status {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        let name = match usize::try_from(reason).ok().and_then(|i| NAMES.get(i)) {
            Some(name) => (*name).to_string(),
            None => format!("error code {reason:#x}"),
        };
        Status::new(
            Code::from_h2_reset(reason),
            format!("the server reset the stream with {name}"),
        )
    }

    /// The status of an HTTP response that is not gRPC at all.
    pub fn from_http_status(status: u16) -> Status {
        Status::new(
            Code::from_http_status(status),
            format!("HTTP status {status} from a non-gRPC response"),
        )
    }

    /// The `grpc-message` header value for this status.
    pub fn encoded_message(&self) -> String {
        percent_encode(&self.message)
    }
}

/// A receiver's answer to a stream it cannot read: the frame error's code.
impl From<crate::framing::FrameError> for Status {
    fn from(e: crate::framing::FrameError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.name(),
            self.code.as_i32(),
            self.message
        )
    }
}

/// Percent-encodes a status message for `grpc-message`: every byte outside
/// printable ASCII, and '%' itself, becomes `%XX`.
pub fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `grpc-message`. Malformed escapes are kept as they are, and bytes
/// that are not UTF-8 are replaced, as the spec asks of receivers.
pub fn percent_decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%' && i + 2 < value.len() {
            if let (Some(h), Some(l)) = (hex(value[i + 1]), hex(value[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_percent_encoding_both_ways() {
        assert_eq!(percent_encode("plain text"), "plain text");
        assert_eq!(percent_encode("100%\nnext"), "100%25%0Anext");
        assert_eq!(percent_encode("café"), "caf%C3%A9");
        assert_eq!(percent_decode(b"caf%C3%A9"), "café");
        assert_eq!(percent_decode(b"100%25%0Anext"), "100%\nnext");
        // Malformed escapes pass through untouched.
        assert_eq!(percent_decode(b"50% off %zz %4"), "50% off %zz %4");
        assert_eq!(percent_decode(b"%"), "%");
        assert_eq!(percent_decode(b"%FF"), "\u{FFFD}");
    }

    #[test]
    fn status_from_headers() {
        let s = Status::from_header_values(Some(b"5"), Some(b"no%20such"), None).unwrap();
        assert_eq!(s, Status::new(Code::NotFound, "no such"));
        assert_eq!(s.to_string(), "NOT_FOUND (5): no such");
        assert_eq!(Status::from_header_values(None, Some(b"x"), None), None);
        let bad = Status::from_header_values(Some(b"x1"), None, None).unwrap();
        assert_eq!(bad.code, Code::Unknown);
        assert_eq!(bad.message, "invalid grpc-status 'x1'");
        let with_details = Status::from_header_values(Some(b"3"), None, Some(b"CAM")).unwrap();
        assert_eq!(with_details.details, Some(vec![0x08, 0x03]));
    }

    #[test]
    fn non_grpc_http_status() {
        let s = Status::from_http_status(503);
        assert_eq!(s.code, Code::Unavailable);
        assert_eq!(s.message, "HTTP status 503 from a non-gRPC response");
    }
}
