//! What all the calls of this module hold of their responses together:
//! the core's [`grpc_wasm::held`] accounting within the proxies' default
//! budget (`DEFAULT_HELD_BYTES`, 128 MiB), worded for a call's status.

use grpc_wasm::held;
use grpc_wasm::limits::DEFAULT_HELD_BYTES;

/// One call's share of what the module holds, given back when the call is
/// dropped.
#[derive(Debug, Default)]
pub struct Share(held::Share);

impl Share {
    /// Sets this call's share to `now` bytes; refused past the budget of
    /// all calls, with the text its status carries.
    pub fn set(&mut self, now: usize) -> Result<(), String> {
        self.0.set(now, DEFAULT_HELD_BYTES).map_err(|over| {
            format!(
                "the module holds too many responses at once: {} bytes for other calls, \
                 the limit is {}",
                over.others, over.budget
            )
        })
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
