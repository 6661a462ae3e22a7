//! The proxy-wasm serialized header map: a little-endian u32 count, then a
//! (key length, value length) u32 pair per entry, then each key and value
//! followed by a NUL byte.

use std::ops::Range;

/// Serializes header pairs for the host.
pub fn serialize(pairs: &[(&str, &[u8])]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len() + 2)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
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

/// Where each key and value of a serialized map lies in `bytes`; `None`
/// when the bytes do not follow the layout (the host's own rule is to treat
/// such a map as empty). Lookups can then borrow instead of copying.
pub fn index(bytes: &[u8]) -> Option<Vec<(Range<usize>, Range<usize>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let mut at = 4usize.checked_add(count.checked_mul(8)?)?;
    let lengths = bytes.get(4..at)?;
    let mut entries = Vec::with_capacity(count);
    for pair in lengths.chunks_exact(8) {
        let k = u32::from_le_bytes(pair[0..4].try_into().ok()?) as usize;
        let v = u32::from_le_bytes(pair[4..8].try_into().ok()?) as usize;
        let key = at..at.checked_add(k)?;
        let value = key.end.checked_add(1)?..key.end.checked_add(1)?.checked_add(v)?;
        if bytes.get(key.end) != Some(&0) || bytes.get(value.end) != Some(&0) {
            return None;
        }
        at = value.end + 1;
        entries.push((key, value));
    }
    (at == bytes.len()).then_some(entries)
}

/// Parses a map from the host into owned pairs; `None` as for [`index`].
pub fn deserialize(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    Some(
        index(bytes)?
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(&bytes[k]).into_owned(),
                    bytes[v].to_vec(),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_host() {
        let bytes = serialize(&[("grpc-status", b"0"), ("grpc-message", b"")]);
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
    fn malformed_maps_are_refused() {
        let good = serialize(&[("a", b"b")]);
        assert!(deserialize(&good[..good.len() - 1]).is_none());
        let mut extra = good.clone();
        extra.push(7);
        assert!(deserialize(&extra).is_none());
        assert!(deserialize(&[0xff, 0xff, 0xff, 0xff]).is_none());
        assert_eq!(deserialize(&[]), Some(vec![]));
    }
}
