//! When a root context tries its own load again (a fetched configuration,
//! descriptors through reflection): after 1 s, then twice as long each
//! time, up to 30 s; from 1 s again after a load succeeds.

use crate::limits::{FIRST_FETCH_BACKOFF_MS, MAX_FETCH_BACKOFF_MS};

#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next_ms: FIRST_FETCH_BACKOFF_MS,
        }
    }
}

impl Backoff {
    /// The delay before the next try, in ms; the one after it doubles.
    pub fn next_ms(&mut self) -> u64 {
        let ms = self.next_ms;
        self.next_ms = (ms * 2).min(MAX_FETCH_BACKOFF_MS);
        ms
    }

    /// A load succeeded: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        *self = Backoff::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_one_second_to_thirty_and_starts_again_after_a_success() {
        let mut backoff = Backoff::default();
        let delays: Vec<u64> = (0..7).map(|_| backoff.next_ms()).collect();
        assert_eq!(delays, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
        backoff.reset();
        assert_eq!(backoff.next_ms(), 1_000);
    }
}
