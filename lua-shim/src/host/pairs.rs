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

/// `None` for bytes that do not follow the layout.
pub fn deserialize(bytes: &[u8]) -> Option<Pairs> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    let mut at = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(count.min(256));
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
        out.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
    }
    (at == bytes.len()).then_some(out)
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
}
