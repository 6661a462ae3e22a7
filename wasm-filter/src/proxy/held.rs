//! What the module holds of responses, for all the streams of this VM
//! together.
//!
//! Each stream's share is a [`Held`]; the VM's total is the sum of the
//! shares, kept in one counter (a proxy-wasm VM runs on one thread). Envoy
//! bounds what it buffers itself (its buffer limits, its overload manager),
//! but the bytes the module takes out of the host's buffer (a carried
//! unary message, a streamed response's incomplete frames) are the
//! module's own: a thousand streams each declaring a 4 MiB message once
//! made it reserve 4 GiB and trap. A share grows only within
//! the budget (`max_held_response_bytes`); a stream refused more fails
//! alone, with RESOURCE_EXHAUSTED, and the others go on.

use std::cell::Cell;

thread_local! {
    static VM_TOTAL: Cell<usize> = const { Cell::new(0) };
}

/// One stream's share of the VM's total, given back when it is dropped
/// (with the stream, or when its buffer goes).
#[derive(Debug, Default)]
pub(crate) struct Held {
    bytes: usize,
}

/// A share refused: what the other streams hold, and the budget.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OverBudget {
    pub(crate) others: usize,
    pub(crate) budget: usize,
}

impl Held {
    /// Makes this stream's share `bytes`. A share that grows past what the
    /// budget leaves beside the other streams' is refused and stays as it
    /// was; a share that shrinks always is.
    pub(crate) fn set(&mut self, bytes: usize, budget: usize) -> Result<(), OverBudget> {
        let others = vm_total().saturating_sub(self.bytes);
        if bytes > self.bytes && others.saturating_add(bytes) > budget {
            return Err(OverBudget { others, budget });
        }
        VM_TOTAL.with(|t| t.set(others + bytes));
        if bytes != self.bytes {
            super::metrics::held_bytes(others + bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// Gives the whole share back.
    pub(crate) fn release(&mut self) {
        let _ = self.set(0, 0);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

/// What all the streams of this VM hold now.
pub(crate) fn vm_total() -> usize {
    VM_TOTAL.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_a_share_past_the_budget_is_refused() {
        let base = vm_total();
        let mut a = Held::default();
        let mut b = Held::default();
        a.set(60, base + 100).unwrap();
        assert_eq!(
            b.set(50, base + 100),
            Err(OverBudget {
                others: base + 60,
                budget: base + 100
            })
        );
        b.set(40, base + 100).unwrap();
        assert_eq!(vm_total(), base + 100);
        // Shrinking is always allowed, even past a smaller budget.
        a.set(10, 0).unwrap();
        assert_eq!(vm_total(), base + 50);
        drop(b);
        assert_eq!(vm_total(), base + 10);
        a.release();
        assert_eq!(vm_total(), base);
    }
}
