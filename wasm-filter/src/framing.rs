//! gRPC message framing: a one-byte compressed flag, a four-byte big-endian
//! length, then the message.
//!
//! Written here rather than taken from tonic because tonic's codec is bound to
//! its own body and runtime types, which the wasm module cannot use; this one
//! works on plain byte chunks as proxies hand them over.

use std::io::Read;

use flate2::{read::GzDecoder, write::GzEncoder};

use crate::limits::DEFAULT_MAX_MESSAGE_BYTES;

pub(crate) const HEADER_LEN: usize = 5;

/// The `grpc-accept-encoding` every client of the core sends: what
/// [`Compression`] inflates besides identity, which gRPC implies.
pub const ACCEPT_ENCODING: &str = "gzip";

/// A message encoding named by `grpc-encoding` / `grpc-accept-encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    Identity,
    Gzip,
}

impl Compression {
    /// The encoding for a `grpc-encoding` value; `None` when unsupported.
    pub fn from_header(value: &str) -> Option<Compression> {
        match value.trim() {
            "" | "identity" => Some(Compression::Identity),
            "gzip" => Some(Compression::Gzip),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::Identity => "identity",
            Compression::Gzip => "gzip",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("grpc: received message larger than max ({size} vs. {limit})")]
    MessageTooLarge { size: usize, limit: usize },
    #[error("grpc: invalid frame flags {0:#04x}")]
    InvalidFlag(u8),
    #[error("grpc: compressed message received but grpc-encoding is identity or absent")]
    CompressedWithoutEncoding,
    #[error("grpc: unsupported grpc-encoding '{0}'")]
    UnsupportedEncoding(String),
    #[error("grpc: failed to decompress message: {0}")]
    Decompress(String),
    #[error("grpc: failed to compress message: {0}")]
    Compress(String),
    #[error("grpc: stream ended inside a message ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
    /// The messages together, after decompression, passed the decoder's
    /// total budget (see [`FrameDecoder::limit_total`]).
    #[error("grpc: received messages larger than max in total (limit {limit} bytes)")]
    TotalTooLarge { limit: usize },
}

impl FrameError {
    /// The status a receiver answers with: too much data is the peer's
    /// excess (RESOURCE_EXHAUSTED, as gRPC's own clients say), anything
    /// else a broken stream.
    pub fn code(&self) -> crate::Code {
        match self {
            FrameError::MessageTooLarge { .. } | FrameError::TotalTooLarge { .. } => {
                crate::Code::ResourceExhausted
            }
            _ => crate::Code::Internal,
        }
    }
}

/// Frames one message. With `Gzip` the message is compressed and flagged.
pub fn encode_frame(message: &[u8], compression: Compression) -> Result<Vec<u8>, FrameError> {
    match compression {
        Compression::Identity => frame(0, message),
        Compression::Gzip => frame(1, &gzip(message)?),
    }
}

/// Appends one uncompressed frame to `out`, avoiding a copy of the message
/// into an intermediate buffer.
pub fn encode_frame_into(message: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
    let len = frame_len(message)?;
    out.reserve(HEADER_LEN + message.len());
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Ok(())
}

fn frame(flag: u8, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let len = frame_len(payload)?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(flag);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

fn frame_len(payload: &[u8]) -> Result<u32, FrameError> {
    u32::try_from(payload.len()).map_err(|_| FrameError::MessageTooLarge {
        size: payload.len(),
        limit: u32::MAX as usize,
    })
}

fn gzip(message: &[u8]) -> Result<Vec<u8>, FrameError> {
    use std::io::Write;
    let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(message)
        .and_then(|_| encoder.finish())
        .map_err(|e| FrameError::Compress(e.to_string()))
}

/// The flag bit of a compressed message, in every protocol's envelope.
const COMPRESSED: u8 = 0x01;

/// One length-prefixed envelope: its flags (compression already undone and
/// cleared) and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Vec<u8>,
}

/// Reassembles messages from body chunks of any size: a byte at a time or
/// many frames at once.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    // Bytes before `start` are consumed; compacting lazily keeps decoding of
    // many small frames in one chunk linear.
    start: usize,
    max_message_size: usize,
    encoding: Compression,
    /// What the messages still to come may add up to, after decompression;
    /// a gzip frame may inflate a thousandfold, so the count of frames alone
    /// bounds nothing.
    remaining: usize,
    /// The budget `remaining` was set to, for the error.
    total: usize,
    /// The envelopes returned so far.
    returned: u64,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_MESSAGE_BYTES, Compression::Identity)
    }
}

impl FrameDecoder {
    /// A decoder for a stream whose `grpc-encoding` is `encoding`.
    pub fn new(max_message_size: usize, encoding: Compression) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            max_message_size,
            encoding,
            remaining: usize::MAX,
            total: usize::MAX,
            returned: 0,
        }
    }

    /// Caps the bytes of the messages returned from now on, together and
    /// after decompression; inflating stops at the cap. Called again, it
    /// sets a fresh budget.
    pub fn limit_total(&mut self, total: usize) {
        self.remaining = total;
        self.total = total;
    }

    /// Adds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 4096 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete message, if one is buffered. Limits are checked on
    /// the length prefix, before anything is allocated for the message.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        Ok(self.next_envelope(0)?.map(|envelope| envelope.payload))
    }

    /// The next complete envelope, for the protocols that frame more than
    /// messages in the same five bytes: gRPC-Web's trailers (flag `0x80`)
    /// and Connect's end of stream (`0x02`). `extra_flags` are the flag bits
    /// the protocol allows besides compression (`0x01`, which is inflated
    /// here and cleared from the flags returned); any other bit is an error.
    pub fn next_envelope(&mut self, extra_flags: u8) -> Result<Option<Envelope>, FrameError> {
        let pending = &self.buf[self.start..];
        if pending.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = pending[0];
        let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
        if flags & !(COMPRESSED | extra_flags) != 0 {
            return Err(FrameError::InvalidFlag(flags));
        }
        if len > self.max_message_size {
            return Err(FrameError::MessageTooLarge {
                size: len,
                limit: self.max_message_size,
            });
        }
        // The length is the peer's: compared with what is buffered, never
        // added to the header's, so that it cannot wrap a 32-bit usize.
        let body = &pending[HEADER_LEN..];
        if body.len() < len {
            return Ok(None);
        }
        let compressed = flags & COMPRESSED != 0;
        if !compressed && len > self.remaining {
            return Err(self.over_total());
        }
        let payload = &body[..len];
        let payload = if compressed {
            self.decompress(payload)?
        } else {
            payload.to_vec()
        };
        self.remaining -= payload.len();
        self.start += HEADER_LEN + len;
        self.returned += 1;
        Ok(Some(Envelope {
            flags: flags & !COMPRESSED,
            payload,
        }))
    }

    /// The bytes the decoder's buffer has allocated: what it costs in
    /// memory, whatever of it is still to be returned.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// How many envelopes (messages) it returned.
    pub fn returned(&self) -> u64 {
        self.returned
    }

    /// Bytes received but not yet returned as a message.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Call at the end of the body: a partial frame is an error.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buffered() {
            0 => Ok(()),
            buffered => Err(FrameError::Truncated { buffered }),
        }
    }

    fn decompress(&self, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        match self.encoding {
            Compression::Identity => Err(FrameError::CompressedWithoutEncoding),
            Compression::Gzip if self.remaining < self.max_message_size => {
                gunzip(payload, self.remaining).map_err(|e| match e {
                    FrameError::MessageTooLarge { .. } => self.over_total(),
                    other => other,
                })
            }
            Compression::Gzip => gunzip(payload, self.max_message_size),
        }
    }

    fn over_total(&self) -> FrameError {
        FrameError::TotalTooLarge { limit: self.total }
    }
}

/// Inflates at most `limit` bytes, so that a small compressed frame cannot
/// expand past the message size limit.
fn gunzip(payload: &[u8], limit: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    let mut reader = GzDecoder::new(payload).take(limit as u64 + 1);
    reader
        .read_to_end(&mut out)
        .map_err(|e| FrameError::Decompress(e.to_string()))?;
    if out.len() > limit {
        return Err(FrameError::MessageTooLarge {
            size: out.len(),
            limit,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(decoder: &mut FrameDecoder) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut out = Vec::new();
        while let Some(m) = decoder.next_message()? {
            out.push(m);
        }
        Ok(out)
    }

    #[test]
    fn the_largest_declared_length_waits_for_its_bytes_without_wrapping() {
        // With no limit to stop it, 0xffffffff plus the header wrapped a
        // 32-bit usize (wasm32) and the slice past it trapped.
        let mut decoder = FrameDecoder::new(usize::MAX, Compression::Identity);
        decoder.push(b"\0\xff\xff\xff\xffpartial");
        assert_eq!(decoder.next_message(), Ok(None));
        assert_eq!(decoder.buffered(), 12);
    }

    #[test]
    fn encodes_the_five_byte_header() {
        assert_eq!(
            encode_frame(b"abc", Compression::Identity).unwrap(),
            b"\0\0\0\0\x03abc"
        );
        assert_eq!(
            encode_frame(b"", Compression::Identity).unwrap(),
            b"\0\0\0\0\0"
        );
        let mut out = Vec::new();
        encode_frame_into(b"xy", &mut out).unwrap();
        assert_eq!(out, b"\0\0\0\0\x02xy");
    }

    #[test]
    fn decodes_byte_by_byte_and_many_per_chunk() {
        let mut wire = Vec::new();
        for m in [&b"one"[..], b"", b"three"] {
            wire.extend(encode_frame(m, Compression::Identity).unwrap());
        }
        let mut d = FrameDecoder::default();
        let mut got = Vec::new();
        for b in &wire {
            d.push(std::slice::from_ref(b));
            got.extend(decode_all(&mut d).unwrap());
        }
        assert_eq!(got, vec![b"one".to_vec(), vec![], b"three".to_vec()]);
        d.finish().unwrap();

        let mut d = FrameDecoder::default();
        d.push(&wire);
        assert_eq!(decode_all(&mut d).unwrap().len(), 3);
    }

    #[test]
    fn rejects_oversize_from_the_prefix_alone() {
        let mut d = FrameDecoder::new(10, Compression::Identity);
        d.push(&[0, 0, 0, 0, 11]);
        assert_eq!(
            d.next_message(),
            Err(FrameError::MessageTooLarge {
                size: 11,
                limit: 10
            })
        );
        let mut d = FrameDecoder::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            d.next_message().unwrap_err().to_string(),
            "grpc: received message larger than max (4294967295 vs. 4194304)"
        );
    }

    #[test]
    fn gzip_round_trip_and_flag_checks() {
        let message = b"hello hello hello hello".repeat(10);
        let wire = encode_frame(&message, Compression::Gzip).unwrap();
        assert_eq!(wire[0], 1);
        let mut d = FrameDecoder::new(DEFAULT_MAX_MESSAGE_BYTES, Compression::Gzip);
        d.push(&wire);
        assert_eq!(d.next_message().unwrap(), Some(message.clone()));

        let mut d = FrameDecoder::default();
        d.push(&wire);
        assert_eq!(d.next_message(), Err(FrameError::CompressedWithoutEncoding));

        let mut d = FrameDecoder::default();
        d.push(&[2, 0, 0, 0, 0]);
        assert_eq!(d.next_message(), Err(FrameError::InvalidFlag(2)));
    }

    #[test]
    fn gzip_bomb_stops_at_the_limit() {
        let message = vec![0u8; 100_000];
        let wire = encode_frame(&message, Compression::Gzip).unwrap();
        let mut d = FrameDecoder::new(1000, Compression::Gzip);
        d.push(&wire);
        assert_eq!(
            d.next_message(),
            Err(FrameError::MessageTooLarge {
                size: 1001,
                limit: 1000
            })
        );
    }

    #[test]
    fn a_thousand_gzip_frames_stop_at_the_total_budget() {
        let frame = encode_frame(&vec![0u8; 100_000], Compression::Gzip).unwrap();
        let mut d = FrameDecoder::new(100_000, Compression::Gzip);
        d.limit_total(250_000);
        for _ in 0..1000 {
            d.push(&frame);
        }
        assert_eq!(d.next_message().unwrap().map(|m| m.len()), Some(100_000));
        assert_eq!(d.next_message().unwrap().map(|m| m.len()), Some(100_000));
        // The third would pass the budget: inflating stops at what is left.
        assert_eq!(
            d.next_message(),
            Err(FrameError::TotalTooLarge { limit: 250_000 })
        );
        assert_eq!(
            FrameError::TotalTooLarge { limit: 250_000 }.to_string(),
            "grpc: received messages larger than max in total (limit 250000 bytes)"
        );
        // Plain frames count too.
        let mut plain = FrameDecoder::new(100_000, Compression::Identity);
        plain.limit_total(150_000);
        plain.push(&encode_frame(&[7; 100_000], Compression::Identity).unwrap());
        plain.push(&encode_frame(&[7; 100_000], Compression::Identity).unwrap());
        assert!(plain.next_message().unwrap().is_some());
        assert_eq!(
            plain.next_message(),
            Err(FrameError::TotalTooLarge { limit: 150_000 })
        );
        assert_eq!(
            plain.next_message().unwrap_err().code(),
            crate::Code::ResourceExhausted
        );
    }

    #[test]
    fn truncated_stream_is_reported() {
        let mut d = FrameDecoder::default();
        d.push(&[0, 0, 0, 0, 5, b'a']);
        assert_eq!(d.next_message(), Ok(None));
        assert_eq!(d.finish(), Err(FrameError::Truncated { buffered: 6 }));
    }

    #[test]
    fn encoding_names() {
        assert_eq!(Compression::from_header("gzip"), Some(Compression::Gzip));
        assert_eq!(
            Compression::from_header("identity"),
            Some(Compression::Identity)
        );
        assert_eq!(Compression::from_header("br"), None);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn split_points(len: usize, cuts: &[usize]) -> Vec<usize> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
        points.push(0);
        points.push(len);
        points.sort_unstable();
        points.dedup();
        points
    }

    proptest! {
        #[test]
        fn round_trip_under_any_chunking(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..20),
            gzip in any::<bool>(),
        ) {
            let compression = if gzip { Compression::Gzip } else { Compression::Identity };
            let mut wire = Vec::new();
            for m in &messages {
                wire.extend(encode_frame(m, compression).unwrap());
            }
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_BYTES, compression);
            let mut got = Vec::new();
            let points = split_points(wire.len(), &cuts);
            for pair in points.windows(2) {
                decoder.push(&wire[pair[0]..pair[1]]);
                while let Some(m) = decoder.next_message().unwrap() {
                    got.push(m);
                }
            }
            prop_assert_eq!(got, messages);
            prop_assert_eq!(decoder.finish(), Ok(()));
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..2000),
            gzip in any::<bool>(),
        ) {
            let compression = if gzip { Compression::Gzip } else { Compression::Identity };
            let mut decoder = FrameDecoder::new(1024, compression);
            decoder.push(&bytes);
            while let Ok(Some(_)) = decoder.next_message() {}
            let _ = decoder.finish();
        }
    }
}
