//! The one error type of the core. Every message names what the user must fix:
//! a file and position, a JSON path, or a method or type name.

use crate::framing::FrameError;
use crate::metadata::MetadataError;
use crate::timeout::TimeoutError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A `.proto` file failed to parse or check: `file:line:column: message`.
    #[error("{0}")]
    Proto(String),
    #[error("invalid file descriptor set: {0}")]
    DescriptorSet(String),
    #[error("invalid method path '{0}': expected /package.Service/Method")]
    InvalidMethodPath(String),
    #[error("unknown service '{0}'")]
    UnknownService(String),
    #[error("unknown method '{0}'")]
    UnknownMethod(String),
    #[error("unknown message type '{0}'")]
    UnknownMessage(String),
    /// JSON that does not fit the message: the path of the bad field and why.
    #[error("{}", json_message(.path, .message))]
    Json { path: String, message: String },
    /// Bytes that are not a valid encoding of the message type.
    #[error("invalid {message_type} message: {reason}")]
    Decode {
        message_type: String,
        reason: String,
    },
    /// A message that cannot be written as JSON (e.g. an Any of an unknown type).
    #[error("cannot write {message_type} as JSON: {reason}")]
    Encode {
        message_type: String,
        reason: String,
    },
    /// A message whose JSON would cost far more than its size (see
    /// `json::cost`): refused, RESOURCE_EXHAUSTED.
    #[error("cannot transcode {message_type}: {reason}")]
    TooCostly {
        message_type: String,
        reason: String,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Timeout(#[from] TimeoutError),
    #[error(transparent)]
    Request(#[from] crate::web::RequestError),
}

impl Error {
    /// The gRPC code a proxy answers with when a response cannot be
    /// transcoded for this reason.
    pub fn response_code(&self) -> crate::Code {
        match self {
            Error::TooCostly { .. } => crate::Code::ResourceExhausted,
            _ => crate::Code::Internal,
        }
    }
}

fn json_message(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_string()
    } else {
        format!("{path}: {message}")
    }
}
