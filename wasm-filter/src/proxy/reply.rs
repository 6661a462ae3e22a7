//! A response the filter writes itself, in either mode: the messages of a
//! call as JSON, or an error as `google.rpc.Status` JSON with the HTTP
//! status of its code; and the errors both modes answer with.

use crate::code::Code;
use crate::details::status_to_json;
use crate::status::Status;

use super::config::FilterConfig;
use crate::http_body::RawBody;

/// A response the filter writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub http_status: u16,
    /// A JSON document: the response message(s), or a `google.rpc.Status`.
    pub body: String,
    /// The gRPC outcome the reply reports (OK for messages).
    pub code: Code,
    /// An HttpBody answer: these bytes and their type instead of `body`.
    pub raw: Option<RawBody>,
}

impl Reply {
    /// An error as `{code, message, details}` with the HTTP status of its code.
    pub fn error(config: &FilterConfig, status: &Status) -> Reply {
        Reply::error_with_http(config, status, status.code.to_http_status())
    }

    pub(crate) fn error_with_http(
        config: &FilterConfig,
        status: &Status,
        http_status: u16,
    ) -> Reply {
        Reply {
            http_status,
            body: status_to_json(&config.registry, status, &config.json),
            code: status.code,
            raw: None,
        }
    }

    /// An error that needs no descriptors to print (no details): for
    /// answers given before a configuration exists.
    pub fn bare_error(status: &Status) -> Reply {
        let body = serde_json::json!({
            "code": status.code.as_i32(),
            "message": status.message,
            "details": [],
        });
        Reply {
            http_status: status.code.to_http_status(),
            body: body.to_string(),
            code: status.code,
            raw: None,
        }
    }

    pub fn ok(body: String) -> Reply {
        Reply {
            http_status: 200,
            body,
            code: Code::Ok,
            raw: None,
        }
    }

    /// The end of a call whose messages the host took one by one: what is
    /// left to carry is an empty stream of them, not a JSON document.
    pub fn delivered() -> Reply {
        Reply::raw(RawBody {
            content_type: NDJSON.to_string(),
            data: Vec::new(),
        })
    }

    /// An HttpBody answer (see `http_body`).
    pub fn raw(raw: RawBody) -> Reply {
        Reply {
            raw: Some(raw),
            ..Reply::ok(String::new())
        }
    }

    /// The reply's Content-Type and bytes.
    pub fn content(&self) -> (&str, &[u8]) {
        match &self.raw {
            Some(raw) => (&raw.content_type, &raw.data),
            None => ("application/json", self.body.as_bytes()),
        }
    }
}

/// A request the client must change: 400 with INVALID_ARGUMENT.
pub(crate) fn bad_request(config: &FilterConfig, message: String) -> Reply {
    Reply::error_with_http(config, &Status::new(Code::InvalidArgument, message), 400)
}

/// The proxy answered 413 itself: the request body outgrew the host's
/// buffer before the filter saw it whole. Which setting to raise is what
/// the client's operator needs to know.
pub fn host_buffer_full(config: &FilterConfig, setting: &str) -> Reply {
    let status = Status::new(
        Code::ResourceExhausted,
        format!(
            "the request body exceeds the proxy's buffer limit ({setting}); raise it to at least max_request_bytes ({})",
            config.max_request_bytes
        ),
    );
    Reply::error_with_http(config, &status, 413)
}

/// The proxy settings that bound the request body a filter can be given.
pub const ENVOY_REQUEST_BUFFER: &str =
    "in Envoy, per_connection_buffer_limit_bytes, 1 MiB by default";
pub const NGINX_REQUEST_BUFFER: &str = "in nginx, client_body_buffer_size: ngx_wasm_module cannot hand a filter a body that nginx wrote to a file";

/// The host stopped holding the response body before its end (in
/// ngx_wasm_module, its buffers were full), after the headers had left.
pub fn host_response_buffer_full(config: &FilterConfig) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!(
            "the response body exceeds the proxy's buffer limit (in ngx_wasm_module, wasm_response_body_buffers, 4 x 4096 bytes by default); raise it to at least max_response_bytes ({})",
            config.max_response_bytes
        ),
    )
}

pub fn too_large(config: &FilterConfig, what: &str, size: usize, limit: usize) -> Reply {
    Reply::error_with_http(config, &too_large_status(what, size, limit), 413)
}

/// A response refused for its size (`status` says which limit), answered
/// 413 as a request over its limit is.
pub fn response_too_large(config: &FilterConfig, status: &Status) -> Reply {
    Reply::error_with_http(config, status, 413)
}

/// The status of a body over its limit, for a reply whose headers have
/// already left (so that only its body and trailers can say it).
pub fn too_large_status(what: &str, size: usize, limit: usize) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!("{what} body of {size} bytes exceeds the limit of {limit} bytes"),
    )
}

/// A stream refused more memory: what the VM's other streams hold leaves
/// it no room within `max_held_response_bytes`. The stream fails alone;
/// the others go on.
pub fn over_budget_status(others: usize, budget: usize) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!(
            "the proxy holds too many responses at once: {others} bytes for other streams, max_held_response_bytes is {budget}"
        ),
    )
}

pub(crate) const NDJSON: &str = "application/x-ndjson";
