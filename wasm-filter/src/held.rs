//! What one module instance holds of responses, for all its calls (or a
//! proxy VM's streams) together.
//!
//! Each call's reader is bounded on its own, but a thousand calls each
//! holding most of a large message would still fill the module's memory
//! (4 GiB at most on wasm32, then a trap for every call). So every call
//! takes a [`Share`] of one total, and a share grows only within the
//! budget the host sets: the call refused more fails alone, with
//! RESOURCE_EXHAUSTED, and the others go on. The hosts word the status;
//! the accounting is this one.

use std::cell::Cell;

thread_local! {
    // A module instance runs on one thread (a proxy-wasm VM, a
    // wasm-bindgen module without threads); natively, each test thread
    // counts for itself.
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

/// One call's share of the total, given back when it is dropped.
#[derive(Debug, Default)]
pub struct Share {
    bytes: usize,
}

/// A share refused: what the other calls hold, and the budget.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget {
    pub others: usize,
    pub budget: usize,
}

impl Share {
    /// Makes this call's share `bytes`. A share that grows past what the
    /// budget leaves beside the other calls' is refused and stays as it
    /// was; a share that shrinks always is.
    pub fn set(&mut self, bytes: usize, budget: usize) -> Result<(), OverBudget> {
        let others = total().saturating_sub(self.bytes);
        if bytes > self.bytes && others.saturating_add(bytes) > budget {
            return Err(OverBudget { others, budget });
        }
        TOTAL.with(|t| t.set(others + bytes));
        self.bytes = bytes;
        Ok(())
    }

    /// Gives the whole share back.
    pub fn release(&mut self) {
        // Shrinking is never refused.
        let _ = self.set(0, 0);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.release();
    }
}

/// What all the calls of this instance hold now.
pub fn total() -> usize {
    TOTAL.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_a_share_past_the_budget_is_refused() {
        let base = total();
        let mut a = Share::default();
        let mut b = Share::default();
        a.set(60, base + 100).unwrap();
        assert_eq!(
            b.set(50, base + 100),
            Err(OverBudget {
                others: base + 60,
                budget: base + 100
            })
        );
        b.set(40, base + 100).unwrap();
        assert_eq!(total(), base + 100);
        // Shrinking is always allowed, even past a smaller budget.
        a.set(10, 0).unwrap();
        assert_eq!(total(), base + 50);
        drop(b);
        assert_eq!(total(), base + 10);
        a.release();
        assert_eq!(total(), base);
    }
}
