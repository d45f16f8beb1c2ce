//! Locking helpers shared by the parts of the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning (a thread that panicked while holding it).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
