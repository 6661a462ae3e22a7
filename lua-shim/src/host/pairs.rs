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

/// A header map kept as the module serialized it: most replies are handed
/// on whole, so their entries are never copied out one by one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock(Vec<u8>);

impl HeaderBlock {
    /// `None` for bytes that do not follow the layout.
    pub fn parse(bytes: Vec<u8>) -> Option<HeaderBlock> {
        walk(&bytes, |_, _| {})?;
        Some(HeaderBlock(bytes))
    }

    /// The entries as `key\0value\0...`: the map's tail, as it is.
    pub fn flat(&self) -> &[u8] {
        match self.0.get(..4) {
            Some(count) => {
                let count = u32::from_le_bytes([count[0], count[1], count[2], count[3]]);
                &self.0[4 + 8 * count as usize..]
            }
            None => &[],
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut entries = Vec::new();
        // Checked when parsed: the walk cannot fail here.
        let _ = walk(&self.0, |k, v| entries.push((k, v)));
        entries.into_iter()
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| *k == name.as_bytes())
            .map(|(_, v)| v)
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
        assert!(HeaderBlock::parse(vec![1, 0, 0, 0]).is_none());
    }
}
