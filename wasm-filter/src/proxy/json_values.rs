//! Where a streamed JSON request body's values end: the messages of a
//! client stream, as a callout reads them chunk by chunk and as a
//! transcoded request's whole body holds them.

use serde::de::IgnoredAny;

/// Where the complete JSON values of a streamed request body end, found by
/// a scan that resumes where the previous chunk left off. serde_json can
/// tell whether a buffer holds a whole value only by parsing it from its
/// start, so a large message arriving in many chunks would be parsed once
/// per chunk (quadratic); this scan reads each byte once, and serde then
/// parses only values known to be whole. It follows just the structure
/// (brackets, strings, escapes, bare scalars); serde still judges the
/// text. A bare scalar (`123`, `true`) is whole only once something
/// follows it, so that `12` + `34` in two chunks stays one number.
#[derive(Debug, Default, Clone)]
pub struct ValueScanner {
    /// Bytes of the pending body already scanned.
    scanned: usize,
    /// Where the last whole value ends.
    complete: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    in_scalar: bool,
}

impl ValueScanner {
    /// Scans the new bytes of `pending` (the whole unsent body); returns
    /// how many leading bytes hold whole values only.
    pub fn scan(&mut self, pending: &[u8]) -> usize {
        for (i, &b) in pending.iter().enumerate().skip(self.scanned) {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    self.close_at(i + 1);
                }
                continue;
            }
            if self.in_scalar {
                if !is_delimiter(b) {
                    continue;
                }
                self.in_scalar = false;
                self.close_at(i);
            }
            match b {
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    self.close_at(i + 1);
                }
                b'"' => self.in_string = true,
                _ if b.is_ascii_whitespace() || b == b',' || b == b':' => {}
                _ => self.in_scalar = self.depth == 0,
            }
        }
        self.scanned = pending.len();
        self.complete
    }

    /// The caller sent and dropped the first `used` bytes of the body.
    pub fn consumed(&mut self, used: usize) {
        self.scanned = self.scanned.saturating_sub(used);
        self.complete = self.complete.saturating_sub(used);
    }

    fn close_at(&mut self, end: usize) {
        if self.depth == 0 {
            self.complete = end;
        }
    }
}

fn is_delimiter(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'{' | b'}' | b'[' | b']' | b'"' | b',' | b':')
}

/// Checks what [`split_messages`] left of a whole body: only whitespace,
/// or the body ends inside a message.
pub fn check_whole(rest: &[u8]) -> Result<(), String> {
    if rest.iter().all(u8::is_ascii_whitespace) {
        Ok(())
    } else {
        Err("invalid JSON: the request body ends inside a message".into())
    }
}

/// Splits the complete JSON values at the start of a streamed request body
/// (newline-delimited or simply concatenated); returns them and how many
/// bytes they used. An incomplete last value waits for more bytes; a
/// malformed one is an error.
pub fn split_messages(buf: &[u8]) -> Result<(Vec<&[u8]>, usize), String> {
    let mut out = Vec::new();
    let used = each_value(buf, |value| {
        out.push(value);
        Ok::<(), String>(())
    })
    .map_err(|e| match e {
        ValueError::Json(message) | ValueError::Each(message) => message,
    })?;
    Ok((out, used))
}

/// Why [`each_value`] stopped.
pub enum ValueError<E> {
    /// The JSON is malformed.
    Json(String),
    /// What `each` answered.
    Each(E),
}

/// [`split_messages`] without gathering: calls `each` with every complete
/// value as it is read (a whole body of tiny values would otherwise be
/// held as a slice each, several times its own size), and returns how
/// many bytes they used.
pub fn each_value<'a, E>(
    buf: &'a [u8],
    mut each: impl FnMut(&'a [u8]) -> Result<(), E>,
) -> Result<usize, ValueError<E>> {
    let mut values = serde_json::Deserializer::from_slice(buf).into_iter::<IgnoredAny>();
    let (mut start, mut count) = (0, 0);
    loop {
        // Whitespace between values is skipped by the deserializer.
        let before = buf[start..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count()
            + start;
        match values.next() {
            None => return Ok(buf.len()),
            Some(Ok(IgnoredAny)) => {
                let end = values.byte_offset();
                each(&buf[before..end]).map_err(ValueError::Each)?;
                count += 1;
                start = end;
            }
            Some(Err(e)) if e.is_eof() => return Ok(start),
            Some(Err(e)) => {
                return Err(ValueError::Json(format!(
                    "invalid JSON in message {}: {e}",
                    count + 1
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` one at a time as the filter does: the values sent
    /// after each chunk, and the body left over at the end.
    fn stream_in(chunks: &[&str]) -> (Vec<Vec<String>>, String) {
        let (mut scanner, mut pending, mut sent) =
            (ValueScanner::default(), Vec::new(), Vec::new());
        for chunk in chunks {
            pending.extend_from_slice(chunk.as_bytes());
            let ready = scanner.scan(&pending);
            let (values, used) = split_messages(&pending[..ready]).unwrap();
            sent.push(
                values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect(),
            );
            pending.drain(..used);
            scanner.consumed(used);
        }
        (sent, String::from_utf8(pending).unwrap())
    }

    #[test]
    fn streamed_values_leave_whole_and_each_byte_is_scanned_once() {
        let (sent, left) = stream_in(&["{\"a\":\"}{\\\"", "\"}{\"b\"", ":[1,{}]}\n{", "}"]);
        assert_eq!(
            sent,
            vec![
                vec![],
                vec![r#"{"a":"}{\""}"#.to_string()],
                vec![r#"{"b":[1,{}]}"#.to_string()],
                vec!["{}".to_string()]
            ]
        );
        assert_eq!(left, "");
        // A bare number split across chunks stays one number; a string
        // concatenated to another stays two.
        let (sent, left) = stream_in(&["12", "34", " \"x\"\"y\""]);
        assert_eq!(
            sent,
            vec![
                vec![],
                vec![],
                vec![
                    "1234".to_string(),
                    r#""x""#.to_string(),
                    r#""y""#.to_string()
                ]
            ]
        );
        assert_eq!(left, "");
        // A large value in many chunks: nothing is parsed until it is whole.
        let big = format!("{{\"s\":\"{}\"}}", "x".repeat(10_000));
        let chunks: Vec<&str> = (0..big.len())
            .step_by(100)
            .map(|i| &big[i..(i + 100).min(big.len())])
            .collect();
        let (sent, _) = stream_in(&chunks);
        assert!(sent[..sent.len() - 1].iter().all(Vec::is_empty));
        assert_eq!(sent.last().unwrap(), &vec![big.clone()]);
    }

    #[test]
    fn streamed_bodies_split_into_messages() {
        let (values, used) = split_messages(b"{\"a\":1}\n{\"b\":[2]} {\"c\"").unwrap();
        assert_eq!(values, vec![&b"{\"a\":1}"[..], b"{\"b\":[2]}"]);
        assert_eq!(used, 17);
        assert_eq!(split_messages(b"  \n").unwrap(), (vec![], 3));
        let (values, used) = split_messages(b"{}{}").unwrap();
        assert_eq!((values.len(), used), (2, 4));
        assert_eq!(
            split_messages(b"{} ]").unwrap_err(),
            "invalid JSON in message 2: expected value at line 1 column 4"
        );
    }
}
