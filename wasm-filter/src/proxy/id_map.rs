//! Maps keyed by the host's context ids and call tokens. They are looked up
//! several times per request, and std's SipHash (a defence against chosen
//! keys) is measurable there for keys the host, not a client, picks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by an id (`ContextId`, `Token`: their `Hash` writes one
/// `u32`).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of one integer: spreads sequential ids over the high
/// bits that the table's probing uses.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = (self.0 ^ u64::from(id)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_differ_in_the_high_bits() {
        let hash = |id: u32| {
            let mut h = IdHasher::default();
            h.write_u32(id);
            h.finish() >> 57
        };
        let tops: std::collections::HashSet<u64> = (1..=64).map(hash).collect();
        assert!(tops.len() > 32, "{} distinct of 64", tops.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map = IdMap::default();
        for id in 0..1000 {
            map.insert(id, id * 2);
        }
        assert_eq!(map.get(&777), Some(&1554));
        assert_eq!(map.remove(&3), Some(6));
        assert_eq!(map.get(&3), None);
        assert_eq!(map.len(), 999);
    }
}
