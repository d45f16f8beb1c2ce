//! [`MediaView`]: an open pool's media as the pool's users see it.

use std::fmt;
use std::sync::Arc;

use super::{
    CrashSimulator, Durability, Emulation, FlushInstruction, MapMode, Media, MediaCounters, Medium,
};

/// An open pool's media, read-only: counters, the durability mode and medium, reads and
/// the crash simulator. It has no stores: a store into a pool's mapping outside a
/// transaction would race the pool's transactions and bypass their logging, so only
/// the engines store, through the [`Media`] they own. Cloning it is cheap (it shares
/// the media), and it keeps the media (the simulator's images) after the pool is gone.
#[derive(Clone)]
#[repr(transparent)]
pub struct MediaView {
    media: Arc<Media>,
}

impl MediaView {
    /// `media` seen as a view (the owner keeps its `Arc<Media>` for its stores).
    pub(crate) fn of(media: &Arc<Media>) -> &MediaView {
        // SAFETY: `MediaView` is `repr(transparent)` over `Arc<Media>`, so the two have
        // the same layout, and the reference keeps `media`'s lifetime.
        unsafe { &*(media as *const Arc<Media> as *const MediaView) }
    }

    /// The traffic and transaction counters, summed over threads.
    pub fn counters(&self) -> MediaCounters {
        self.media.counters()
    }

    /// The durability mode in force (what [`Durability::Auto`] chose, or the mode asked
    /// for).
    pub fn durability(&self) -> Durability {
        self.media.durability()
    }

    /// What the pool's file lies on.
    pub fn medium(&self) -> Medium {
        self.media.medium()
    }

    /// What a committed transaction survives, in a few words.
    pub fn survives(&self) -> &'static str {
        self.media.survives()
    }

    /// How the file is mapped.
    pub fn map_mode(&self) -> MapMode {
        self.media.map_mode()
    }

    /// The flush instruction in use.
    pub fn flush_instruction(&self) -> FlushInstruction {
        self.media.flush_instruction()
    }

    /// The NVM emulation, when on.
    pub fn emulation(&self) -> Option<Emulation> {
        self.media.emulation()
    }

    /// `msync` calls that failed (msync mode); a non-zero value means durability was
    /// lost.
    pub fn msync_errors(&self) -> u64 {
        self.media.msync_errors()
    }

    /// The crash simulator, on simulation media.
    pub fn crash_simulator(&self) -> Option<&CrashSimulator> {
        self.media.crash_simulator()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.media.len()
    }

    /// Whether the media is empty.
    pub fn is_empty(&self) -> bool {
        self.media.is_empty()
    }

    /// Copies the bytes at `offset` into `buf` (outside any transaction: what is there
    /// now, possibly in the middle of a commit).
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.media.read(offset, buf)
    }

    /// Reads `len` bytes at `offset` into a new vector (as [`read`](Self::read)).
    pub fn read_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        self.media.read_vec(offset, len)
    }

    /// A persist barrier: this thread's earlier flushes are durable when it returns (it
    /// stores nothing; the pool's own operations fence for themselves).
    pub fn fence(&self) {
        self.media.fence()
    }

    /// Loads the 8-byte word at `offset` (aligned) atomically.
    pub fn read_u64(&self, offset: usize) -> u64 {
        self.media.read_u64(offset)
    }
}

impl fmt::Debug for MediaView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.media.fmt(f)
    }
}
