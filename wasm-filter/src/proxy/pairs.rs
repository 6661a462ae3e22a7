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

/// The host calls that an edit of a map takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit<'a> {
    Nothing,
    Set(&'a str, &'a str),
    Remove(&'a str),
    /// More than one change: the whole map, serialized.
    Rewrite(Vec<u8>),
}

/// Applies `set` (replace, or add when absent) and `remove` to `entries`,
/// comparing each entry once. A name that already holds its value costs
/// nothing and one change is one replace or remove; more changes come back
/// as the edited map (order kept, a repeated `set` name left once, new
/// names last), to be written in one host call.
pub fn edit<'a>(
    entries: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    set: &[(&'a str, &'a str)],
    remove: &[&'a str],
) -> Edit<'a> {
    let mut placed = vec![false; set.len()];
    let mut out: Vec<(&[u8], &[u8])> = Vec::with_capacity(16);
    let mut changes = 0;
    let mut last = Edit::Nothing;
    for (name, value) in entries {
        if let Some(r) = remove.iter().find(|r| r.as_bytes() == name) {
            changes += 1;
            last = Edit::Remove(r);
            continue;
        }
        let Some(i) = set.iter().position(|(k, _)| k.as_bytes() == name) else {
            out.push((name, value));
            continue;
        };
        let (k, v) = set[i];
        if placed[i] {
            // A repeated name: a replace would leave one entry.
            changes += 1;
            last = Edit::Rewrite(Vec::new());
            continue;
        }
        placed[i] = true;
        if value != v.as_bytes() {
            changes += 1;
            last = Edit::Set(k, v);
        }
        out.push((name, v.as_bytes()));
    }
    for (&(k, v), done) in set.iter().zip(placed) {
        if !done {
            changes += 1;
            last = Edit::Set(k, v);
            out.push((k.as_bytes(), v.as_bytes()));
        }
    }
    match changes {
        0 => Edit::Nothing,
        1 if last != Edit::Rewrite(Vec::new()) => last,
        _ => Edit::Rewrite(serialize(&out)),
    }
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
        let out = edit(
            entries.into_iter(),
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
        assert_eq!(out, Edit::Rewrite(serialize(&expected)));
    }

    #[test]
    fn an_edit_takes_as_few_host_calls_as_its_changes() {
        let entries: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/p.S/M"),
            (b"content-type", b"application/grpc"),
            (b"content-length", b"3"),
        ];
        let plan = |set: &[(&'static str, &'static str)], remove: &[&'static str]| {
            edit(entries.iter().copied(), set, remove)
        };
        assert_eq!(plan(&[(":path", "/p.S/M")], &["absent"]), Edit::Nothing);
        assert_eq!(
            plan(&[(":path", "/p.S/N")], &[]),
            Edit::Set(":path", "/p.S/N")
        );
        assert_eq!(
            plan(&[("te", "trailers")], &[]),
            Edit::Set("te", "trailers")
        );
        assert_eq!(
            plan(&[], &["content-length"]),
            Edit::Remove("content-length")
        );
        assert!(matches!(
            plan(&[("te", "trailers")], &["content-length"]),
            Edit::Rewrite(_)
        ));
        let repeated: Vec<(&[u8], &[u8])> = vec![(b"te", b"trailers"), (b"te", b"trailers")];
        let once: Vec<(&[u8], &[u8])> = vec![(b"te", b"trailers")];
        assert_eq!(
            edit(repeated.into_iter(), &[("te", "trailers")], &[]),
            Edit::Rewrite(serialize(&once))
        );
    }
}
