//! What all the calls of this module hold of their responses together.
//! Each call's reader is bounded on its own; a thousand calls to a server
//! that sends each one most of a large message and then stalls would still
//! fill the module's memory (4 GiB at most on wasm32, and then a trap for
//! every call), so the calls share one budget, the proxies' default
//! (`DEFAULT_HELD_BYTES`, 128 MiB).

use std::sync::atomic::{AtomicUsize, Ordering};

use grpc_wasm::limits::DEFAULT_HELD_BYTES;

/// The bytes all live calls hold. wasm32 without threads runs one call's
/// method at a time; the atomic only makes the static safe to share.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// One call's share of [`HELD`], given back when the call is dropped.
#[derive(Debug, Default)]
pub struct Share {
    held: usize,
}

impl Share {
    /// Sets this call's share to `now` bytes. Growing past the budget of
    /// all calls is refused, with the text its status carries, and the
    /// share stays as it was; shrinking always succeeds.
    pub fn set(&mut self, now: usize) -> Result<(), String> {
        let others = HELD.load(Ordering::Relaxed).saturating_sub(self.held);
        if now > self.held && others.saturating_add(now) > DEFAULT_HELD_BYTES {
            return Err(format!(
                "the module holds too many responses at once: {others} bytes for other calls, \
                 the limit is {DEFAULT_HELD_BYTES}"
            ));
        }
        HELD.store(others + now, Ordering::Relaxed);
        self.held = now;
        Ok(())
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        // A failed set leaves nothing to undo: the share is what was stored.
        let _ = self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_share_one_budget_and_give_it_back() {
        let mut a = Share::default();
        let mut b = Share::default();
        a.set(DEFAULT_HELD_BYTES - 10).unwrap();
        assert_eq!(
            b.set(11).unwrap_err(),
            format!(
                "the module holds too many responses at once: {} bytes for other calls, \
                 the limit is {DEFAULT_HELD_BYTES}",
                DEFAULT_HELD_BYTES - 10
            )
        );
        b.set(10).unwrap();
        drop(a);
        b.set(DEFAULT_HELD_BYTES).unwrap();
        b.set(0).unwrap();
    }
}
