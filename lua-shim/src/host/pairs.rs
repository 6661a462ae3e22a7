//! The proxy-wasm serialized header map (count, lengths, NUL-ended keys and
//! values), from the host's side.

use super::state::Pairs;

pub fn serialize(pairs: &Pairs) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        4 + pairs
            .iter()
            .map(|(k, v)| 10 + k.len() + v.len())
            .sum::<usize>(),
    );
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Bytes as text: the common valid UTF-8 costs one check and one copy
/// (`from_utf8_lossy` walks it in chunks first).
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `None` for bytes that do not follow the layout.
pub fn deserialize(bytes: &[u8]) -> Option<Pairs> {
    let mut out = Vec::new();
    walk(bytes, |key, value| out.push((text(key), value.to_vec())))?;
    Some(out)
}

/// Checks the layout and calls `f` with each key and value; `None` for
/// bytes that do not follow it. No bytes at all are an empty map.
fn walk<'a>(bytes: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8])) -> Option<()> {
    if bytes.is_empty() {
        return Some(());
    }
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    let mut at = 4usize.checked_add(count.checked_mul(8)?)?;
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

/// A header map in the proxy-wasm layout, kept as bytes: the module reads
/// whole maps and most are handed on whole, so entries are never copied
/// out one by one. Always a valid layout; no bytes at all for no entries,
/// so that an empty block costs no allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock(Vec<u8>);

const EMPTY: [u8; 4] = [0; 4];

impl HeaderBlock {
    /// `None` for bytes that do not follow the layout.
    pub fn parse(bytes: Vec<u8>) -> Option<HeaderBlock> {
        walk(&bytes, |_, _| {})?;
        if bytes.len() <= EMPTY.len() {
            return Some(HeaderBlock::default());
        }
        Some(HeaderBlock(bytes))
    }

    /// A map of the entries `entries()` yields (it is walked three times:
    /// sizes, lengths, bytes), each name given as a prefix and the rest.
    pub fn from_entries<'a, F, I>(entries: F) -> HeaderBlock
    where
        F: Fn() -> I,
        I: Iterator<Item = (&'a [u8], &'a [u8], &'a [u8])>,
    {
        let (mut count, mut size) = (0usize, 4usize);
        for (prefix, name, value) in entries() {
            count += 1;
            size += 10 + prefix.len() + name.len() + value.len();
        }
        if count == 0 {
            return HeaderBlock::default();
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
        HeaderBlock(out)
    }

    pub fn from_pairs(pairs: &[(String, Vec<u8>)]) -> HeaderBlock {
        HeaderBlock::from_entries(|| {
            pairs
                .iter()
                .map(|(k, v)| (&b""[..], k.as_bytes(), v.as_slice()))
        })
    }

    /// The serialized map, as `proxy_get_header_map_pairs` hands it out.
    pub fn bytes(&self) -> &[u8] {
        if self.0.is_empty() {
            &EMPTY
        } else {
            &self.0
        }
    }

    pub fn len(&self) -> usize {
        self.count()
    }

    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    fn count(&self) -> usize {
        match self.0.get(..4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
            None => 0,
        }
    }

    /// The entries as `key\0value\0...`: the map's tail, as it is.
    pub fn flat(&self) -> &[u8] {
        self.0.get(4 + 8 * self.count()..).unwrap_or_default()
    }

    pub fn iter(&self) -> Entries<'_> {
        let count = self.count();
        Entries {
            bytes: &self.0,
            count,
            next: 0,
            at: 4 + 8 * count,
        }
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| *k == name.as_bytes())
            .map(|(_, v)| v)
    }

    /// The first value of `name`, in any letter case (HTTP's rule).
    pub fn get_ignore_case(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Drops every entry named `name` (any case); then adds `add`, if any.
    pub fn replace(&mut self, name: &str, add: Option<&[u8]>) {
        let lower = name.to_ascii_lowercase();
        let edited = HeaderBlock::from_entries(|| {
            self.iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case(name.as_bytes()))
                .map(|(k, v)| (&b""[..], k, v))
                .chain(add.map(|v| (&b""[..], lower.as_bytes(), v)))
        });
        *self = edited;
    }
}

/// The entries of a [`HeaderBlock`], in order.
#[derive(Clone)]
pub struct Entries<'a> {
    bytes: &'a [u8],
    count: usize,
    next: usize,
    at: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next == self.count {
            return None;
        }
        let word = |at: usize| {
            let b = &self.bytes[at..at + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
        };
        let (k, v) = (word(4 + 8 * self.next), word(8 + 8 * self.next));
        // The layout was checked when the block was made.
        let key = &self.bytes[self.at..self.at + k];
        let value = &self.bytes[self.at + k + 1..self.at + k + 1 + v];
        self.at += k + v + 2;
        self.next += 1;
        Some((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let pairs = vec![
            ("a".to_string(), b"1".to_vec()),
            ("bb".to_string(), Vec::new()),
        ];
        let bytes = serialize(&pairs);
        assert_eq!(bytes.len(), 4 + 16 + 4 + 4);
        assert_eq!(deserialize(&bytes), Some(pairs));
        assert_eq!(deserialize(&bytes[..bytes.len() - 1]), None);
        assert_eq!(deserialize(&[9, 0, 0, 0]), None);
        let mut no_nul = bytes.clone();
        no_nul[21] = b'x';
        assert_eq!(deserialize(&no_nul), None);
    }

    #[test]
    fn a_header_block_keeps_the_bytes() {
        let pairs = vec![
            ("grpc-status".to_string(), b"5".to_vec()),
            ("x".to_string(), Vec::new()),
        ];
        let block = HeaderBlock::parse(serialize(&pairs)).unwrap();
        assert_eq!(block.flat(), b"grpc-status\x005\x00x\x00\x00");
        assert_eq!(block.get("grpc-status"), Some(&b"5"[..]));
        assert_eq!(block.get("absent"), None);
        assert_eq!(
            block.iter().collect::<Vec<_>>(),
            vec![(&b"grpc-status"[..], &b"5"[..]), (&b"x"[..], &b""[..])]
        );
        assert_eq!(HeaderBlock::default().flat(), b"");
        assert_eq!(HeaderBlock::default().bytes(), &[0, 0, 0, 0]);
        assert_eq!(
            HeaderBlock::parse(vec![0, 0, 0, 0]),
            Some(HeaderBlock::default())
        );
        assert_eq!(HeaderBlock::parse(Vec::new()), Some(HeaderBlock::default()));
        assert!(HeaderBlock::parse(vec![1, 0, 0, 0]).is_none());
        assert_eq!(block.bytes(), serialize(&pairs).as_slice());
        assert_eq!(HeaderBlock::from_pairs(&pairs), block);
        assert_eq!(block.len(), 2);
    }

    #[test]
    fn header_block_edits_follow_http_case_rules() {
        let mut block = HeaderBlock::from_pairs(&[
            ("Accept".to_string(), b"a".to_vec()),
            ("x".to_string(), b"1".to_vec()),
            ("accept".to_string(), b"b".to_vec()),
        ]);
        assert_eq!(block.get_ignore_case("ACCEPT"), Some(&b"a"[..]));
        assert_eq!(block.get("ACCEPT"), None);
        block.replace("ACCEPT", Some(b"c"));
        assert_eq!(
            block.iter().collect::<Vec<_>>(),
            vec![(&b"x"[..], &b"1"[..]), (&b"accept"[..], &b"c"[..])]
        );
        block.replace("x", None);
        assert_eq!(
            block.iter().collect::<Vec<_>>(),
            vec![(&b"accept"[..], &b"c"[..])]
        );
    }
}
