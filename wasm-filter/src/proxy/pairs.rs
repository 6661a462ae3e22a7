//! The proxy-wasm serialized header map: a little-endian u32 count, then a
//! (key length, value length) u32 pair per entry, then each key and value
//! followed by a NUL byte.

use std::ops::Range;

/// Serializes header pairs for the host.
pub fn serialize<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 8 + k.as_ref().len() + v.as_ref().len() + 2)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
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

/// `entries` in their order with `set` applied in place (a repeated name
/// keeps one entry, as a replace does) and `remove` left out; names new to
/// the map go last.
pub fn edited<'a>(
    entries: &[(&'a [u8], &'a [u8])],
    set: &[(&'a str, &'a str)],
    remove: &[&str],
) -> Vec<(&'a [u8], &'a [u8])> {
    let mut placed = vec![false; set.len()];
    let mut out = Vec::with_capacity(entries.len() + set.len());
    for &(name, value) in entries {
        if remove.iter().any(|r| r.as_bytes() == name) {
            continue;
        }
        match set.iter().position(|(s, _)| s.as_bytes() == name) {
            Some(i) if placed[i] => {}
            Some(i) => {
                placed[i] = true;
                out.push((name, set[i].1.as_bytes()));
            }
            None => out.push((name, value)),
        }
    }
    for (&(k, v), done) in set.iter().zip(placed) {
        if !done {
            out.push((k.as_bytes(), v.as_bytes()));
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
    fn an_edit_keeps_order_replaces_in_place_and_appends_new_names() {
        let entries: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/v1/greet"),
            (b"content-type", b"application/json"),
            (b"content-length", b"16"),
            (b"x-a", b"1"),
            (b"content-type", b"text/plain"),
        ];
        let out = edited(
            &entries,
            &[
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                (":path", "/p.S/M"),
            ],
            &["content-length", "absent"],
        );
        let expected: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/p.S/M"),
            (b"content-type", b"application/grpc"),
            (b"x-a", b"1"),
            (b"te", b"trailers"),
        ];
        assert_eq!(out, expected);
    }
}
