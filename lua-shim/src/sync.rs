//! How the shim takes its locks.
//!
//! A lock is taken even when a panic left it poisoned, because one place
//! deals with panics: every entry point (the C ABI, the lua-resty-ffi
//! loop, the runtime's tasks) catches them and hands them to
//! `Client::after_panic`, which rebuilds everything a panic could have
//! left half-written (the module instance, the calls, the connections)
//! and clears the client's locks of their poison. The few locks outside
//! the client (the C ABI's current events, the notifier's) guard single
//! map or queue operations, which a panic cannot leave half done.

use std::sync::{Mutex, MutexGuard};

/// The guard, even of a mutex a panicking thread left poisoned (see the
/// module's documentation for why that is safe here).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
