//! What the module holds of responses, for all the streams of this VM
//! together: the core's [`crate::held`] accounting, with the VM's gauge.
//!
//! Envoy bounds what it buffers itself (its buffer limits, its overload
//! manager), but the bytes the module takes out of the host's buffer (a
//! carried unary message, a streamed response's incomplete frames, held
//! headers) are the module's own: a thousand streams each declaring a
//! 4 MiB message once made it reserve 4 GiB and trap. The budget is
//! `max_held_response_bytes`.

use crate::held::Share;
pub(crate) use crate::held::{total as vm_total, OverBudget};

/// One stream's share of the VM's total, given back when it is dropped
/// (with the stream, or when its buffer goes).
#[derive(Debug, Default)]
pub(crate) struct Held(Share);

impl Held {
    /// Makes this stream's share `bytes`, within `budget`.
    pub(crate) fn set(&mut self, bytes: usize, budget: usize) -> Result<(), OverBudget> {
        let before = vm_total();
        self.0.set(bytes, budget)?;
        if vm_total() != before {
            super::metrics::held_bytes(vm_total());
        }
        Ok(())
    }

    /// Gives the whole share back.
    pub(crate) fn release(&mut self) {
        // Shrinking is never refused.
        let _ = self.set(0, 0);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}
