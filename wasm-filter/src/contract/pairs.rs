//! The proxy-wasm serialized header map: a little-endian u32 count, then a
//! (key length, value length) u32 pair per entry, then each key and value
//! followed by a NUL byte.

use std::ops::Range;

/// Serializes header pairs for the host.
pub fn serialize<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    serialize_entries(|| {
        pairs
            .iter()
            .map(|(k, v)| (&b""[..], k.as_ref(), v.as_ref()))
    })
}

/// Serializes the entries `entries()` yields, each name given as a prefix
/// and the rest (so that a prefixed name needs no string of its own), in one
/// allocation of the exact size: `entries()` is walked three times (sizes,
/// lengths, bytes).
pub fn serialize_entries<'a, F, I>(entries: F) -> Vec<u8>
where
    F: Fn() -> I,
    I: Iterator<Item = (&'a [u8], &'a [u8], &'a [u8])>,
{
    let (mut count, mut size) = (0usize, 4usize);
    for (prefix, name, value) in entries() {
        count += 1;
        size += 10 + prefix.len() + name.len() + value.len();
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(count as u32).to_le_bytes());
    for (prefix, name, value) in entries() {
        out.extend_from_slice(&((prefix.len() + name.len()) as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (prefix, name, value) in entries() {
        out.extend_from_slice(prefix);
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

/// Builds a serialized map entry by entry, for a caller that cannot walk
/// its entries again (see [`serialize_entries`] for one that can).
#[derive(Debug, Default)]
pub struct Builder {
    count: u32,
    lengths: Vec<u8>,
    data: Vec<u8>,
}

impl Builder {
    /// Room for `entries` entries of `bytes` bytes of names and values
    /// (a guess: more only costs a reallocation).
    pub fn with_capacity(entries: usize, bytes: usize) -> Builder {
        Builder {
            count: 0,
            lengths: Vec::with_capacity(8 * entries),
            data: Vec::with_capacity(bytes + 2 * entries),
        }
    }

    pub fn push(&mut self, prefix: &[u8], name: &[u8], value: &[u8]) {
        self.count += 1;
        let key_len = (prefix.len() + name.len()) as u32;
        self.lengths.extend_from_slice(&key_len.to_le_bytes());
        self.lengths
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.data.extend_from_slice(prefix);
        self.data.extend_from_slice(name);
        self.data.push(0);
        self.data.extend_from_slice(value);
        self.data.push(0);
    }

    pub fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.lengths.len() + self.data.len());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.lengths);
        out.extend_from_slice(&self.data);
        out
    }
}

/// Checks the layout and calls `f` with each key and value in order;
/// `None` when the bytes do not follow it (the host's own rule is to treat
/// such a map as empty). No bytes at all are an empty map.
pub fn visit<'a>(bytes: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8])) -> Option<()> {
    if bytes.is_empty() {
        return Some(());
    }
    let word = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let count = word(0)?;
    let mut at = 4usize.checked_add(count.checked_mul(8)?)?;
    bytes.get(..at)?;
    for i in 0..count {
        let (k, v) = (word(4 + i * 8)?, word(8 + i * 8)?);
        let key = bytes.get(at..at.checked_add(k)?)?;
        at += k;
        (bytes.get(at) == Some(&0)).then_some(())?;
        at += 1;
        let value = bytes.get(at..at.checked_add(v)?)?;
        at += v;
        (bytes.get(at) == Some(&0)).then_some(())?;
        at += 1;
        f(key, value);
    }
    (at == bytes.len()).then_some(())
}

/// Where each key and value of a serialized map lies in `bytes`; `None` as
/// for [`visit`]. Lookups can then borrow instead of copying.
pub fn index(bytes: &[u8]) -> Option<Vec<(Range<usize>, Range<usize>)>> {
    let base = bytes.as_ptr() as usize;
    let span = |part: &[u8]| {
        let start = part.as_ptr() as usize - base;
        start..start + part.len()
    };
    let mut entries = Vec::new();
    visit(bytes, |k, v| entries.push((span(k), span(v))))?;
    Some(entries)
}

/// Parses a map from the host into owned pairs; `None` as for [`visit`].
pub fn deserialize(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    visit(bytes, |k, v| {
        out.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()))
    })?;
    Some(out)
}

/// One change to a header map: each is a host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    Set(&'a str, &'a str),
    Remove(&'a str),
}

/// The changes that make `entries` hold `set` (replace, or add when
/// absent) and lack `remove`, comparing each entry once, names without
/// regard to case (HTTP/1 hosts such as ngx_wasm_module keep the client's
/// spelling, `Content-Length`): a name that already
/// holds its value needs no call. (One call per change, not one
/// `proxy_set_header_map_pairs` for all: Envoy rebuilds the whole map for
/// that, which measured dearer than several single changes.)
pub fn changes<'a>(
    entries: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    set: &[(&'a str, &'a str)],
    remove: &[&'a str],
) -> Vec<Change<'a>> {
    let mut seen = vec![false; set.len()];
    let mut out = Vec::new();
    for (name, value) in entries {
        if let Some(r) = remove
            .iter()
            .find(|r| r.as_bytes().eq_ignore_ascii_case(name))
        {
            if !out.contains(&Change::Remove(r)) {
                out.push(Change::Remove(r));
            }
        } else if let Some(i) = set
            .iter()
            .position(|(k, _)| k.as_bytes().eq_ignore_ascii_case(name))
        {
            let (k, v) = set[i];
            // A repeated name: a replace leaves one entry with the value.
            if (seen[i] || value != v.as_bytes()) && !out.contains(&Change::Set(k, v)) {
                out.push(Change::Set(k, v));
            }
            seen[i] = true;
        }
    }
    for (&(k, v), seen) in set.iter().zip(seen) {
        if !seen {
            out.push(Change::Set(k, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_host() {
        let bytes = serialize(&[("grpc-status", &b"0"[..]), ("grpc-message", &b""[..])]);
        let mut expected = vec![2, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0];
        expected.extend_from_slice(b"grpc-status\x000\x00grpc-message\x00\x00");
        assert_eq!(bytes, expected);
        assert_eq!(
            deserialize(&bytes).unwrap(),
            vec![
                ("grpc-status".to_string(), b"0".to_vec()),
                ("grpc-message".to_string(), vec![])
            ]
        );
    }

    #[test]
    fn the_builder_writes_what_serialize_writes() {
        let mut builder = Builder::default();
        builder.push(b"", b"grpc-status", b"0");
        builder.push(b"grpc-metadata-", b"user", b"ann");
        assert_eq!(
            builder.finish(),
            serialize(&[("grpc-status", &b"0"[..]), ("grpc-metadata-user", b"ann")])
        );
        assert_eq!(Builder::default().finish(), vec![0, 0, 0, 0]);
    }

    #[test]
    fn malformed_maps_are_refused() {
        let good = serialize(&[("a", b"b")]);
        assert!(deserialize(&good[..good.len() - 1]).is_none());
        let mut extra = good.clone();
        extra.push(7);
        assert!(deserialize(&extra).is_none());
        assert!(deserialize(&[0xff, 0xff, 0xff, 0xff]).is_none());
        assert_eq!(deserialize(&[]), Some(vec![]));
    }

    #[test]
    fn an_edit_makes_only_the_changes_that_differ() {
        let entries: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/p.S/M"),
            (b"content-type", b"application/json"),
            (b"content-length", b"3"),
            (b"te", b"trailers"),
            (b"te", b"trailers"),
        ];
        let changes = |set: &[(&'static str, &'static str)], remove: &[&'static str]| {
            changes(entries.iter().copied(), set, remove)
        };
        assert_eq!(changes(&[(":path", "/p.S/M")], &["absent"]), vec![]);
        assert_eq!(
            changes(
                &[
                    (":path", "/p.S/N"),
                    ("content-type", "application/grpc"),
                    ("x-new", "1")
                ],
                &["content-length"]
            ),
            vec![
                Change::Set(":path", "/p.S/N"),
                Change::Set("content-type", "application/grpc"),
                Change::Remove("content-length"),
                Change::Set("x-new", "1"),
            ]
        );
        // Names match whatever their case, as HTTP/1 hosts keep the client's.
        let spelled: Vec<(&[u8], &[u8])> = vec![
            (b"Content-Length", b"3"),
            (b"Content-Type", b"application/grpc"),
        ];
        assert_eq!(
            super::changes(
                spelled.iter().copied(),
                &[("content-type", "application/grpc")],
                &["content-length"]
            ),
            vec![Change::Remove("content-length")]
        );
        // A repeated name is made single by a replace.
        assert_eq!(
            changes(&[("te", "trailers")], &[]),
            vec![Change::Set("te", "trailers")]
        );
    }
}
