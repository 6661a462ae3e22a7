//! gRPC-Web text responses: base64 that arrives in pieces, each piece
//! padded on its own (a server encodes every write separately), so the
//! body is a run of base64 strings, not one.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Decodes base64 as it arrives, four characters at a time.
#[derive(Debug, Default)]
pub(super) struct Base64Stream {
    /// Fewer than four characters waiting for the rest of their quad.
    pending: Vec<u8>,
}

impl Base64Stream {
    /// The bytes that `chunk` completes. Whitespace is skipped.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        let mut chars = std::mem::take(&mut self.pending);
        chars.extend(chunk.iter().copied().filter(|b| !b.is_ascii_whitespace()));
        let whole = chars.len() / 4 * 4;
        self.pending = chars.split_off(whole);
        let mut out = Vec::with_capacity(whole / 4 * 3);
        // Each run ends at a padded quad (or at the end): one base64 string.
        for run in chars.split_inclusive(|&b| b == b'=') {
            if run == b"=" {
                continue; // the second '=' of "==", after its run was cut
            }
            STANDARD
                .decode_vec(pad_run(run), &mut out)
                .map_err(|e| format!("invalid base64 in a grpc-web-text response: {e}"))?;
        }
        Ok(out)
    }

    /// At the end of the body: characters left over are a broken quad.
    pub(super) fn finish(&self) -> Result<(), String> {
        match self.pending.len() {
            0 => Ok(()),
            n => Err(format!(
                "a grpc-web-text response ended inside a base64 quad ({n} characters left)"
            )),
        }
    }
}

/// A run cut after its first '=' of a "==" ends mid-quad: give it back the
/// second '=' so that it decodes on its own.
fn pad_run(run: &[u8]) -> Vec<u8> {
    let mut run = run.to_vec();
    while run.len() % 4 != 0 && run.last() == Some(&b'=') {
        run.push(b'=');
    }
    run
}
