//! The proxy-wasm serialized header map (count, lengths, NUL-ended keys and
//! values), from the host's side. The layout's rules (reading, checking,
//! writing) are the core's, `grpc_wasm::contract::pairs`: the module and the
//! host read the same bytes with the same code.

pub use grpc_wasm::contract::pairs::deserialize;
use grpc_wasm::contract::pairs::{serialize_entries, visit};

/// Bytes as text: the common valid UTF-8 costs one check and one copy
/// (`from_utf8_lossy` walks it in chunks first).
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// One entry for [`HeaderBlock::from_entries`]: name prefix, rest of the
/// name, value.
pub type Entry<'a> = (&'a [u8], &'a [u8], &'a [u8]);

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
        visit(&bytes, |_, _| {})?;
        Some(HeaderBlock::normal(bytes))
    }

    /// A map of the entries `entries()` yields (see the core's
    /// `serialize_entries`).
    pub fn from_entries<'a, F, I>(entries: F) -> HeaderBlock
    where
        F: Fn() -> I,
        I: Iterator<Item = Entry<'a>>,
    {
        HeaderBlock::normal(serialize_entries(entries))
    }

    pub fn from_pairs(pairs: &[(String, Vec<u8>)]) -> HeaderBlock {
        HeaderBlock::from_entries(|| {
            pairs
                .iter()
                .map(|(k, v)| (&b""[..], k.as_bytes(), v.as_slice()))
        })
    }

    /// No entries are kept as no bytes.
    fn normal(bytes: Vec<u8>) -> HeaderBlock {
        if bytes.len() <= EMPTY.len() {
            HeaderBlock::default()
        } else {
            HeaderBlock(bytes)
        }
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

    /// The entries, in order.
    pub fn entries(&self) -> Vec<(&[u8], &[u8])> {
        let mut entries = Vec::with_capacity(self.count());
        // Checked when the block was made: the visit cannot fail here.
        let _ = visit(&self.0, |k, v| entries.push((k, v)));
        entries
    }

    /// The first value whose name `matches`, without collecting entries.
    fn find(&self, matches: impl Fn(&[u8]) -> bool) -> Option<&[u8]> {
        let mut found = None;
        let _ = visit(&self.0, |k, v| {
            if found.is_none() && matches(k) {
                found = Some(v);
            }
        });
        found
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.find(|k| k == name.as_bytes())
    }

    /// The first value of `name`, in any letter case (HTTP's rule).
    pub fn get_ignore_case(&self, name: &str) -> Option<&[u8]> {
        self.find(|k| k.eq_ignore_ascii_case(name.as_bytes()))
    }

    /// Drops every entry named `name` (any case); then adds `add`, if any.
    pub fn replace(&mut self, name: &str, add: Option<&[u8]>) {
        let lower = name.to_ascii_lowercase();
        let kept = self.entries();
        let edited = HeaderBlock::from_entries(|| {
            kept.iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case(name.as_bytes()))
                .map(|&(k, v)| (&b""[..], k, v))
                .chain(add.map(|v| (&b""[..], lower.as_bytes(), v)))
        });
        *self = edited;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grpc_wasm::contract::pairs::serialize;

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
            block.entries(),
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
            block.entries(),
            vec![(&b"x"[..], &b"1"[..]), (&b"accept"[..], &b"c"[..])]
        );
        block.replace("x", None);
        assert_eq!(block.entries(), vec![(&b"accept"[..], &b"c"[..])]);
    }
}
