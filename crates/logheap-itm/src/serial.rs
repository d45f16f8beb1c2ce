//! The serial lock: every outermost transaction holds it shared; a transaction that
//! must not abort (serial irrevocable mode, [`_ITM_changeTransactionMode`]) and closing
//! the pool hold it exclusively, so that no other transaction runs meanwhile.
//!
//! A reader-writer lock whose holders are not Rust scopes: a transaction takes it in
//! `_ITM_beginTransaction` and gives it back in `_ITM_commitTransaction` (or a
//! rollback), calls apart, with C frames between. Written by hand for that reason
//! (std's and parking_lot's guards are scopes); writers go first once waiting, so a
//! serial transaction is not starved by a stream of new ones.
//!
//! [`_ITM_changeTransactionMode`]: crate::abi::_ITM_changeTransactionMode

use std::sync::atomic::{AtomicU64, Ordering};

/// The lock word: readers in the low bits, [`WRITER`] when held exclusively,
/// [`WAITING`] while a writer waits (no new reader enters then).
pub(crate) struct SerialLock {
    word: AtomicU64,
}

const WRITER: u64 = 1 << 63;
const WAITING: u64 = 1 << 62;
const READERS: u64 = WAITING - 1;

/// The process's serial lock (there is one TM pool per process).
pub(crate) static SERIAL: SerialLock = SerialLock {
    word: AtomicU64::new(0),
};

/// Spins, then yields, while waiting.
fn pause(round: &mut u32) {
    if *round < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *round = round.saturating_add(1);
}

impl SerialLock {
    /// Takes the lock shared (waits while a writer holds it or waits for it).
    pub(crate) fn lock_shared(&self) {
        let mut round = 0;
        loop {
            let w = self.word.load(Ordering::Relaxed);
            if w & (WRITER | WAITING) == 0
                && self
                    .word
                    .compare_exchange_weak(w, w + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            pause(&mut round);
        }
    }

    /// Gives back a shared hold.
    pub(crate) fn unlock_shared(&self) {
        let before = self.word.fetch_sub(1, Ordering::Release);
        debug_assert!(before & READERS > 0, "a shared unlock without a hold");
    }

    /// Takes the lock exclusively (announces itself, then waits for the readers to
    /// leave).
    pub(crate) fn lock_exclusive(&self) {
        let mut round = 0;
        // One writer at a time announces itself.
        loop {
            let w = self.word.load(Ordering::Relaxed);
            if w & (WRITER | WAITING) == 0
                && self
                    .word
                    .compare_exchange_weak(w, w | WAITING, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            pause(&mut round);
        }
        while self
            .word
            .compare_exchange_weak(WAITING, WRITER, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            pause(&mut round);
        }
    }

    /// Gives back an exclusive hold.
    pub(crate) fn unlock_exclusive(&self) {
        let before = self.word.swap(0, Ordering::Release);
        debug_assert_eq!(before, WRITER, "an exclusive unlock without the hold");
    }
}

/// A hold of [`SERIAL`] for the length of a Rust scope (given back when dropped, a
/// panic included), for the runtime's own calls outside transactions.
pub(crate) struct Held {
    exclusive: bool,
}

impl Held {
    /// Holds the lock exclusively.
    pub(crate) fn exclusive() -> Held {
        SERIAL.lock_exclusive();
        Held { exclusive: true }
    }

    /// Holds the lock shared.
    pub(crate) fn shared() -> Held {
        SERIAL.lock_shared();
        Held { exclusive: false }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.exclusive {
            SERIAL.unlock_exclusive();
        } else {
            SERIAL.unlock_shared();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_excludes_readers_and_other_writers() {
        let lock = SerialLock {
            word: AtomicU64::new(0),
        };
        let counter = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (lock, counter) = (&lock, &counter);
                s.spawn(move || {
                    for _ in 0..2000 {
                        if t < 2 {
                            // Two writers increment by a load and a store: without
                            // exclusion between them, increments get lost.
                            lock.lock_exclusive();
                            let v = counter.load(Ordering::Relaxed);
                            for _ in 0..16 {
                                std::hint::spin_loop();
                            }
                            counter.store(v + 1, Ordering::Relaxed);
                            lock.unlock_exclusive();
                        } else {
                            lock.lock_shared();
                            let v = counter.load(Ordering::Relaxed);
                            std::hint::spin_loop();
                            assert_eq!(v, counter.load(Ordering::Relaxed), "a writer ran");
                            lock.unlock_shared();
                        }
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::Relaxed), 4000);
        assert_eq!(lock.word.load(Ordering::Relaxed), 0);
    }
}
