//! The proxy-wasm serialized header map: a little-endian u32 count, then a
//! (key length, value length) u32 pair per entry, then each key and value
//! followed by a NUL byte.

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

/// Parses a map from the host; `None` when the bytes do not follow the
/// layout (the host's own rule is to treat such a map as empty).
pub fn deserialize(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let count = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let mut lengths = Vec::with_capacity(count.min(1024));
    let mut at = 4;
    for _ in 0..count {
        let k = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        let v = u32::from_le_bytes(bytes.get(at + 4..at + 8)?.try_into().ok()?) as usize;
        lengths.push((k, v));
        at += 8;
    }
    let mut pairs = Vec::with_capacity(count.min(1024));
    for (k, v) in lengths {
        let key = bytes.get(at..at.checked_add(k)?)?;
        at += k;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        let value = bytes.get(at..at.checked_add(v)?)?;
        at += v;
        if bytes.get(at) != Some(&0) {
            return None;
        }
        at += 1;
        pairs.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
    }
    (at == bytes.len()).then_some(pairs)
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
