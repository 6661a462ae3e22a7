//! The 17 gRPC status codes.

use std::fmt;

/// A gRPC status code, as carried in `grpc-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

const ALL: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

impl Code {
    /// The code for a number. The gRPC spec says a client must treat codes it
    /// does not know as UNKNOWN, so this never fails.
    pub fn from_i32(value: i32) -> Code {
        usize::try_from(value)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .unwrap_or(Code::Unknown)
    }

    /// Parses a `grpc-status` header value; `None` when it is not a number.
    pub fn from_header(value: &[u8]) -> Option<Code> {
        let text = std::str::from_utf8(value).ok()?;
        let number: i32 = text.trim().parse().ok()?;
        Some(Code::from_i32(number))
    }

    pub fn as_i32(self) -> i32 {
        self as i32
    }

    /// The canonical upper-case name, e.g. `DEADLINE_EXCEEDED`.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Cancelled => "CANCELLED",
            Code::Unknown => "UNKNOWN",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Aborted => "ABORTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The code for a canonical name (as written by [`Code::name`]).
    pub fn from_name(name: &str) -> Option<Code> {
        ALL.iter().copied().find(|c| c.name() == name)
    }

    /// The HTTP status that a JSON/REST front end answers with for this code;
    /// the same table as grpc-gateway and Envoy's transcoder.
    pub fn to_http_status(self) -> u16 {
        match self {
            Code::Ok => 200,
            Code::Cancelled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        }
    }

    /// The code for an HTTP response that carried no `grpc-status`, as the
    /// gRPC spec ("HTTP to gRPC Status Code Mapping") prescribes.
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    /// The code for a stream the server reset with HTTP/2 error code
    /// `reason` (RFC 9113, section 7), as gRPC's HTTP/2 protocol spec
    /// ("Errors") maps them: a refused stream never reached the server and
    /// may be retried, a cancel is a cancel, and every protocol failure is
    /// INTERNAL.
    pub fn from_h2_reset(reason: u32) -> Code {
        match reason {
            0x7 => Code::Unavailable,       // REFUSED_STREAM
            0x8 => Code::Cancelled,         // CANCEL
            0xb => Code::ResourceExhausted, // ENHANCE_YOUR_CALM
            0xc => Code::PermissionDenied,  // INADEQUATE_SECURITY
            _ => Code::Internal,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_round_trip() {
        for (i, code) in ALL.iter().enumerate() {
            assert_eq!(code.as_i32(), i as i32);
            assert_eq!(Code::from_i32(i as i32), *code);
            assert_eq!(Code::from_name(code.name()), Some(*code));
        }
        assert_eq!(Code::DeadlineExceeded.name(), "DEADLINE_EXCEEDED");
        assert_eq!(Code::Unauthenticated.as_i32(), 16);
    }

    #[test]
    fn unknown_numbers_are_unknown() {
        assert_eq!(Code::from_i32(17), Code::Unknown);
        assert_eq!(Code::from_i32(-1), Code::Unknown);
        assert_eq!(Code::from_header(b"99"), Some(Code::Unknown));
        assert_eq!(Code::from_header(b"abc"), None);
        assert_eq!(Code::from_header(b"14"), Some(Code::Unavailable));
    }

    #[test]
    fn h2_resets_map_as_the_grpc_spec_says() {
        let codes: Vec<Code> = (0..=0xd).map(Code::from_h2_reset).collect();
        use Code::*;
        assert_eq!(
            codes,
            [
                Internal,          // NO_ERROR
                Internal,          // PROTOCOL_ERROR
                Internal,          // INTERNAL_ERROR
                Internal,          // FLOW_CONTROL_ERROR
                Internal,          // SETTINGS_TIMEOUT
                Internal,          // STREAM_CLOSED
                Internal,          // FRAME_SIZE_ERROR
                Unavailable,       // REFUSED_STREAM
                Cancelled,         // CANCEL
                Internal,          // COMPRESSION_ERROR
                Internal,          // CONNECT_ERROR
                ResourceExhausted, // ENHANCE_YOUR_CALM
                PermissionDenied,  // INADEQUATE_SECURITY
                Internal,          // HTTP_1_1_REQUIRED
            ]
        );
        assert_eq!(Code::from_h2_reset(0xffff), Internal);
    }

    #[test]
    fn http_mapping_follows_the_grpc_spec() {
        assert_eq!(Code::from_http_status(400), Code::Internal);
        assert_eq!(Code::from_http_status(401), Code::Unauthenticated);
        assert_eq!(Code::from_http_status(403), Code::PermissionDenied);
        assert_eq!(Code::from_http_status(404), Code::Unimplemented);
        for s in [429, 502, 503, 504] {
            assert_eq!(Code::from_http_status(s), Code::Unavailable);
        }
        assert_eq!(Code::from_http_status(500), Code::Unknown);
        assert_eq!(Code::from_http_status(200), Code::Unknown);
        assert_eq!(Code::NotFound.to_http_status(), 404);
        assert_eq!(Code::DeadlineExceeded.to_http_status(), 504);
    }
}
