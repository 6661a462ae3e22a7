//! Locks that outlive a panic.

use std::sync::{Mutex, MutexGuard};

/// The guard, even of a mutex a panicking thread left poisoned: a panic
/// elsewhere must not make every later call fail.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
