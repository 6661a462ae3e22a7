//! A response, read as it arrives: headers, body chunks, and (gRPC over
//! HTTP/2 only) trailers, into messages and one final status.

use super::connect;
use super::text::Base64Stream;
use super::{is_protocol_header, Protocol, Wire};
use crate::code::Code;
use crate::framing::{Compression, FrameDecoder, FrameError};
use crate::limits::{MAX_CONNECT_ERROR_BYTES, MAX_TRAILER_BYTES, MAX_TRAILER_ENTRIES};
use crate::status::Status;

/// gRPC-Web's flag for the frame that carries the trailers.
const WEB_TRAILERS: u8 = 0x80;
/// Connect's flag for the end-of-stream message.
const CONNECT_END: u8 = 0x02;

/// What a response yields, in order: messages (protobuf, or JSON text for
/// Connect's JSON codec), then one `End`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Message(Vec<u8>),
    End(Outcome),
}

/// How a call ended: its status, and the application's metadata from the
/// response headers and from the trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub headers: Vec<(String, String)>,
    pub trailers: Vec<(String, String)>,
}

/// Reads one response. Every method returns events rather than failing:
/// a response that breaks the protocol ends the call with a status that
/// says how.
#[derive(Debug)]
pub struct ResponseReader {
    wire: Wire,
    max_message: usize,
    frames: FrameDecoder,
    text: Option<Base64Stream>,
    /// A Connect unary body (the message, or the error's JSON).
    body: Vec<u8>,
    /// A Connect unary answer that is an error: its HTTP status.
    error_status: Option<u16>,
    headers: Vec<(String, String)>,
    ended: bool,
    /// Complete envelopes may be waiting: the last drain stopped at its
    /// budget ([`ResponseReader::pull`] goes on).
    more: bool,
}

impl ResponseReader {
    /// A reader for a call on `wire`; no message may exceed `max_message`
    /// bytes, a Connect unary body neither, and a single-message response's
    /// messages not together (gzip inflates a thousandfold). Each call that
    /// yields events yields at most about `max_message` bytes of messages:
    /// a chunk holding more leaves them for [`ResponseReader::pull`].
    pub fn new(wire: Wire, max_message: usize) -> ResponseReader {
        ResponseReader {
            wire,
            max_message,
            frames: frame_decoder(wire, max_message, Compression::Identity),
            text: (wire.protocol == Protocol::GrpcWebText).then(Base64Stream::default),
            body: Vec::new(),
            error_status: None,
            headers: Vec::new(),
            ended: false,
            more: false,
        }
    }

    /// The response's status line and headers (names lower-case). A
    /// response that ends here (gRPC's trailers-only form, a non-gRPC
    /// answer) yields its `End`.
    pub fn headers(&mut self, http_status: u16, headers: &[(String, String)]) -> Vec<Event> {
        self.headers = application_metadata(headers);
        match self.check_headers(http_status, headers) {
            Ok(None) => Vec::new(),
            // A trailers-only answer's one header block is its trailers.
            Ok(Some(status)) => {
                let trailers = std::mem::take(&mut self.headers);
                self.end(status, trailers)
            }
            Err(status) => self.end(status, Vec::new()),
        }
    }

    /// The next piece of the body.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        if !self.wire.enveloped {
            return self.push_unary_body(chunk);
        }
        let decoded;
        let bytes = match &mut self.text {
            Some(text) => match text.push(chunk) {
                Ok(bytes) => {
                    decoded = bytes;
                    &decoded[..]
                }
                Err(e) => return self.end(Status::new(Code::Internal, e), Vec::new()),
            },
            None => chunk,
        };
        self.frames.push(bytes);
        self.drain_frames()
    }

    /// The next messages of what was pushed, when the last events said
    /// [`ResponseReader::has_more`].
    pub fn pull(&mut self) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        self.drain_frames()
    }

    /// Whether complete messages may still wait for [`ResponseReader::pull`].
    pub fn has_more(&self) -> bool {
        self.more && !self.ended
    }

    /// The end of the body, with the HTTP/2 trailers when the transport has
    /// them. Yields the `End` if nothing did before.
    pub fn finish(&mut self, trailers: Option<&[(String, String)]>) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        if self.more {
            // The caller should have pulled first; ending here would call
            // the messages still buffered a truncated frame.
            return self.drain_frames();
        }
        if let Some(Err(e)) = self.text.as_ref().map(Base64Stream::finish) {
            return self.end(Status::new(Code::Internal, e), Vec::new());
        }
        if let Err(e) = self.frames.finish() {
            return self.end(frame_status(e), Vec::new());
        }
        match (self.wire.protocol, self.wire.enveloped) {
            (Protocol::Connect, false) => self.finish_unary(),
            (Protocol::Grpc, _) => {
                let trailers = trailers.unwrap_or_default();
                let status = status_from_headers(trailers)
                    .unwrap_or_else(|| Status::missing_grpc_status("the response's trailers"));
                let (status, trailers) = bounded(status, application_metadata(trailers));
                self.end(status, trailers)
            }
            (Protocol::GrpcWeb | Protocol::GrpcWebText, _) => self.end(
                Status::new(
                    Code::Internal,
                    "the gRPC-Web response ended without its trailers frame",
                ),
                Vec::new(),
            ),
            (Protocol::Connect, true) => self.end(
                Status::new(
                    Code::Internal,
                    "the Connect stream ended without its end-of-stream message",
                ),
                Vec::new(),
            ),
        }
    }

    /// The bytes this reader holds of the response (its buffers' capacity),
    /// for a host that bounds all its calls together.
    pub fn held(&self) -> usize {
        self.frames.capacity() + self.body.capacity()
    }

    /// Whether the `End` has been yielded.
    pub fn ended(&self) -> bool {
        self.ended
    }

    fn check_headers(
        &mut self,
        http_status: u16,
        headers: &[(String, String)],
    ) -> Result<Option<Status>, Status> {
        let content_type = header(headers, "content-type").unwrap_or("");
        if self.wire.protocol == Protocol::Connect {
            return self.check_connect_headers(http_status, content_type, headers);
        }
        // Trailers-only: the whole answer is in the headers.
        if let Some(status) = status_from_headers(headers) {
            return Ok(Some(status));
        }
        if http_status != 200 {
            return Err(Status::from_http_status(http_status));
        }
        expect_content_type(content_type, self.wire.content_type())?;
        let encoding = header(headers, "grpc-encoding").unwrap_or("");
        self.set_encoding(encoding)?;
        Ok(None)
    }

    fn check_connect_headers(
        &mut self,
        http_status: u16,
        content_type: &str,
        headers: &[(String, String)],
    ) -> Result<Option<Status>, Status> {
        if !self.wire.enveloped && http_status != 200 {
            // The body is the error's JSON, read at the end.
            self.error_status = Some(http_status);
            return Ok(None);
        }
        if http_status != 200 {
            return Err(Status::from_http_status(http_status));
        }
        expect_content_type(content_type, self.wire.content_type())?;
        if self.wire.enveloped {
            let encoding = header(headers, "connect-content-encoding").unwrap_or("");
            self.set_encoding(encoding)?;
        }
        Ok(None)
    }

    fn set_encoding(&mut self, encoding: &str) -> Result<(), Status> {
        let compression = Compression::from_header(encoding).ok_or_else(|| {
            Status::new(
                Code::Internal,
                format!("the response's message encoding '{encoding}' is not supported"),
            )
        })?;
        self.frames = frame_decoder(self.wire, self.max_message, compression);
        Ok(())
    }

    fn push_unary_body(&mut self, chunk: &[u8]) -> Vec<Event> {
        if self.error_status.is_some() {
            // Only the JSON error is read; past it, a page is for people.
            let room = MAX_CONNECT_ERROR_BYTES.saturating_sub(self.body.len());
            self.body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            return Vec::new();
        }
        if self.body.len() + chunk.len() > self.max_message {
            // The whole size is not known yet: the limit alone is said, the
            // same however the body was cut.
            let message = format!(
                "the response message is larger than the limit of {} bytes",
                self.max_message
            );
            return self.end(Status::new(Code::ResourceExhausted, message), Vec::new());
        }
        self.body.extend_from_slice(chunk);
        Vec::new()
    }

    fn finish_unary(&mut self) -> Vec<Event> {
        let trailers = connect::unary_trailers(&self.headers_raw_trailers());
        match self.error_status {
            Some(http_status) => {
                let status = connect::error_from_body(http_status, &self.body);
                self.end(status, trailers)
            }
            None => {
                let message = std::mem::take(&mut self.body);
                let mut events = vec![Event::Message(message)];
                events.extend(self.end(Status::ok(), trailers));
                events
            }
        }
    }

    /// Connect's unary trailers ride as `trailer-` headers, kept aside
    /// from the application's headers.
    fn headers_raw_trailers(&mut self) -> Vec<(String, String)> {
        let (trailers, headers) = std::mem::take(&mut self.headers)
            .into_iter()
            .partition(|(name, _)| name.starts_with(connect::TRAILER_PREFIX));
        self.headers = headers;
        trailers
    }

    /// Envelopes into events, until about `max_message` bytes of messages:
    /// a chunk of many compressed frames is inflated a batch at a time.
    fn drain_frames(&mut self) -> Vec<Event> {
        let extra = match self.wire.protocol {
            Protocol::Grpc => 0,
            Protocol::GrpcWeb | Protocol::GrpcWebText => WEB_TRAILERS,
            Protocol::Connect => CONNECT_END,
        };
        let mut events = Vec::new();
        let mut budget = self.max_message;
        self.more = false;
        loop {
            if budget == 0 {
                self.more = true;
                return events;
            }
            match self.frames.next_envelope(extra) {
                Ok(None) => return events,
                Ok(Some(envelope)) if envelope.flags == 0 => {
                    budget = budget.saturating_sub(envelope.payload.len().max(1));
                    events.push(Event::Message(envelope.payload));
                }
                Ok(Some(envelope)) => {
                    let (status, trailers) = match self.wire.protocol {
                        Protocol::Connect => connect_end(&envelope.payload),
                        _ => web_trailers(&envelope.payload),
                    };
                    let (status, trailers) = bounded(status, trailers);
                    events.extend(self.end(status, trailers));
                    return events;
                }
                Err(e) => {
                    events.extend(self.end(frame_status(e), Vec::new()));
                    return events;
                }
            }
        }
    }

    /// Ends the call with `status`: for a message its caller could not use.
    pub fn fail(&mut self, status: Status) -> Outcome {
        self.close(status, Vec::new())
    }

    fn end(&mut self, status: Status, trailers: Vec<(String, String)>) -> Vec<Event> {
        vec![Event::End(self.close(status, trailers))]
    }

    fn close(&mut self, status: Status, trailers: Vec<(String, String)>) -> Outcome {
        self.ended = true;
        self.body = Vec::new();
        self.frames = FrameDecoder::default();
        Outcome {
            status,
            headers: self.headers.clone(),
            trailers,
        }
    }
}

/// The decoder of a call's frames: for a single-message response, the
/// messages are bounded together too.
fn frame_decoder(wire: Wire, max_message: usize, compression: Compression) -> FrameDecoder {
    let mut frames = FrameDecoder::new(max_message, compression);
    if wire.single_response {
        frames.limit_total(max_message);
    }
    frames
}

/// The status and metadata of gRPC-Web's trailers frame: header lines,
/// `name: value`, separated by CRLF (a bare LF is taken too). A frame
/// larger than a peer's header block may be is not read at all.
fn web_trailers(block: &[u8]) -> (Status, Vec<(String, String)>) {
    if block.len() > MAX_TRAILER_BYTES {
        return (
            too_much_metadata(format!("{} bytes", block.len())),
            Vec::new(),
        );
    }
    let text = String::from_utf8_lossy(block);
    let lines: Vec<(String, String)> = text
        .split('\n')
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let status = status_from_headers(&lines)
        .unwrap_or_else(|| Status::missing_grpc_status("the gRPC-Web trailers frame"));
    (status, application_metadata(&lines))
}

/// Connect's end-of-stream message: an error and metadata, each bounded
/// (64 KiB of error as a unary error body is kept, 64 KiB of metadata); a
/// larger one is not parsed at all, as a message-sized JSON document of
/// small values took one synchronous call hundreds of milliseconds.
fn connect_end(json: &[u8]) -> (Status, Vec<(String, String)>) {
    const MOST: usize = MAX_CONNECT_ERROR_BYTES + MAX_TRAILER_BYTES;
    if json.len() > MOST {
        let status = Status::new(
            Code::ResourceExhausted,
            format!(
                "the peer's end-of-stream message is {} bytes, more than {MOST} may be",
                json.len()
            ),
        );
        return (status, Vec::new());
    }
    connect::end_of_stream(json)
}

/// The end of a call as the peer said it, unless its metadata is more than
/// a peer's header block may hold: then the call fails, naming the bound,
/// and none of it is kept.
fn bounded(status: Status, trailers: Vec<(String, String)>) -> (Status, Vec<(String, String)>) {
    if trailers.len() > MAX_TRAILER_ENTRIES {
        return (
            too_much_metadata(format!("{} entries", trailers.len())),
            Vec::new(),
        );
    }
    let bytes: usize = trailers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_TRAILER_BYTES {
        return (too_much_metadata(format!("{bytes} bytes")), Vec::new());
    }
    (status, trailers)
}

fn too_much_metadata(amount: String) -> Status {
    Status::new(
        Code::ResourceExhausted,
        format!("the peer ended the call with {amount} of metadata, more than {MAX_TRAILER_ENTRIES} entries or {MAX_TRAILER_BYTES} bytes may be"),
    )
}

fn status_from_headers(headers: &[(String, String)]) -> Option<Status> {
    let get = |name| header(headers, name).map(str::as_bytes);
    Status::from_header_values(
        get("grpc-status"),
        get("grpc-message"),
        get("grpc-status-details-bin"),
    )
}

fn expect_content_type(got: &str, want: &str) -> Result<(), Status> {
    let essence = got
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // "+proto" is the default codec: with or without it, the same type
    // (Envoy answers grpc-web-text with "application/grpc-web-text+proto").
    let bare = |t: &str| t.strip_suffix("+proto").unwrap_or(t).to_string();
    if bare(&essence) == bare(want) {
        return Ok(());
    }
    Err(Status::new(
        Code::Unknown,
        format!("the response's content-type is '{got}', expected '{want}'"),
    ))
}

fn frame_status(error: FrameError) -> Status {
    Status::new(error.code(), error.to_string())
}

pub(super) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The headers that are the application's metadata.
fn application_metadata(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !is_protocol_header(name))
        .cloned()
        .collect()
}
