//! What a committing transaction logs, staged in buffers that every commit of a thread
//! reuses (so a commit allocates nothing in steady state):
//!
//! - its writes, resolved into non-overlapping spans (later writes win);
//! - writes into objects it allocates become part of their allocation image (zeros
//!   overlaid with those writes), logged in the *initial-data* log (or, when the logs
//!   are not separate, in the update log; the allocation log holds only the allocation
//!   records, so the cleaner can move and reclaim initial data like any other data);
//!   writes into objects it frees are dropped; no byte is logged twice;
//! - with group update ("Log-structured Non-volatile Main Memory", USENIX ATC 2017,
//!   §3.2), address-contiguous update spans become one entry (and one mapping update);
//! - entries longer than [`MAX_ENTRY_DATA`] are split.
//!
//! Entries refer to their bytes by offset into one staging buffer, so the buffers carry
//! no borrow from one transaction to the next.

use super::layout::{EntryRef, LogKind, MAX_ENTRY_DATA};
use crate::stm::{ResolveScratch, Span, WriteSet};

/// A staged log entry: `len` bytes at `at` in the staging buffer, for `home`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Staged {
    pub home: u64,
    pub tombstone: bool,
    pub at: usize,
    pub len: usize,
}

impl Staged {
    /// The entry, with its bytes.
    pub(crate) fn entry<'a>(&self, staging: &'a [u8]) -> EntryRef<'a> {
        EntryRef {
            home: self.home,
            tombstone: self.tombstone,
            data: &staging[self.at..self.at + self.len],
        }
    }
}

/// A data entry's final place: `len` bytes for `home` at pool offset `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub kind: LogKind,
    pub home: u64,
    pub len: u64,
    pub log: u64,
}

/// A range that cuts write spans: an object the transaction allocates (its image starts
/// at `image` in the staging buffer) or frees (`image` is `None`).
#[derive(Debug, Clone, Copy)]
struct Cutter {
    start: u64,
    end: u64,
    image: Option<usize>,
}

/// The transaction's side of a commit: what it stages and the buffers it reuses.
#[derive(Debug, Default)]
pub(crate) struct CommitBuffers {
    resolve: ResolveScratch,
    spans: Vec<Span>,
    cutters: Vec<Cutter>,
    /// Update runs before splitting: (home, at, len) in `staging`.
    runs: Vec<(u64, usize, usize)>,
    /// Bytes of every staged entry.
    pub staging: Vec<u8>,
    /// Entries of each log (in [`LogKind`] order).
    pub logs: [Vec<Staged>; 4],
    /// Where the logged data went.
    pub placed: Vec<Placed>,
}

/// Pushes entries for `len` bytes at `at` of the staging buffer, for `home`, split into
/// entries of at most [`MAX_ENTRY_DATA`] bytes.
fn push_data(out: &mut Vec<Staged>, home: u64, at: usize, len: usize) {
    let mut done = 0;
    while done < len {
        let part = (len - done).min(MAX_ENTRY_DATA);
        out.push(Staged {
            home: home + done as u64,
            tombstone: false,
            at: at + done,
            len: part,
        });
        done += part;
    }
}

impl CommitBuffers {
    /// Stages the entries of a transaction: `writes`; `allocs`, sorted by home; `frees`;
    /// and objects it allocated and freed again (`dropped`). The images of new objects
    /// go to the initial-data log when `separate_initial` is set, else to the update
    /// log. Returns the payload: the
    /// distinct bytes the transaction changes (resolved writes outside new objects,
    /// plus every new object whole), so write amplification compares media traffic with
    /// the state change made durable.
    pub(crate) fn stage(
        &mut self,
        writes: &WriteSet,
        allocs: &[(u64, u64)],
        frees: &[(u64, u64)],
        dropped: &[(u64, u64)],
        group_update: bool,
        separate_initial: bool,
    ) -> u64 {
        writes.resolve_into(&mut self.resolve, &mut self.spans);
        self.staging.clear();
        self.runs.clear();
        for log in &mut self.logs {
            log.clear();
        }
        // Allocation records and images (zeros, overlaid below).
        self.cutters.clear();
        let [update, alloc, dealloc, initial] = &mut self.logs;
        for &(home, size) in allocs {
            stage_record(&mut self.staging, alloc, home, size);
            let image = self.staging.len();
            self.staging.resize(image + size as usize, 0);
            let log = if separate_initial {
                &mut *initial
            } else {
                &mut *update
            };
            push_data(log, home, image, size as usize);
            self.cutters.push(Cutter {
                start: home,
                end: home + size,
                image: Some(image),
            });
        }
        for &(home, size) in frees {
            stage_record(&mut self.staging, dealloc, home, size);
        }
        self.cutters
            .extend(frees.iter().chain(dropped).map(|&(home, size)| Cutter {
                start: home,
                end: home + size,
                image: None,
            }));
        // Objects never overlap one another, so sorted by start they are sorted by end.
        self.cutters.sort_unstable_by_key(|c| c.start);
        let bytes = writes.bytes();
        let mut payload: u64 = allocs.iter().map(|&(_, size)| size).sum();
        for span in &self.spans {
            let (s, e) = (span.home, span.home + span.len);
            let src = |from: u64, to: u64| {
                let at = span.at + (from - s) as usize;
                at..at + (to - from) as usize
            };
            let mut pos = s;
            let first = self.cutters.partition_point(|c| c.end <= s);
            for c in self.cutters[first..].iter().take_while(|c| c.start < e) {
                if c.start > pos {
                    stage_update(
                        &mut self.staging,
                        &mut self.runs,
                        pos,
                        &bytes[src(pos, c.start)],
                        group_update,
                    );
                    payload += c.start - pos;
                }
                let (from, to) = (pos.max(c.start), e.min(c.end));
                if let Some(image) = c.image {
                    let at = image + (from - c.start) as usize;
                    self.staging[at..at + (to - from) as usize]
                        .copy_from_slice(&bytes[src(from, to)]);
                }
                pos = to;
            }
            if pos < e {
                stage_update(
                    &mut self.staging,
                    &mut self.runs,
                    pos,
                    &bytes[src(pos, e)],
                    group_update,
                );
                payload += e - pos;
            }
        }
        for &(home, at, len) in &self.runs {
            push_data(update, home, at, len);
        }
        payload
    }

    /// Whether nothing is staged (everything written was freed again).
    pub(crate) fn is_empty(&self) -> bool {
        self.logs.iter().all(|l| l.is_empty())
    }

    /// The staged entries of `kind`'s log.
    #[cfg(test)]
    fn log(&self, kind: LogKind) -> &[Staged] {
        &self.logs[kind.index()]
    }
}

/// Stages an allocation or free record (a tombstone entry holding the object's size).
fn stage_record(staging: &mut Vec<u8>, log: &mut Vec<Staged>, home: u64, size: u64) {
    log.push(Staged {
        home,
        tombstone: true,
        at: staging.len(),
        len: 8,
    });
    staging.extend_from_slice(&size.to_le_bytes());
}

/// Copies an update's bytes into the staging buffer as a new run, or (with group
/// update) onto the previous run when it ends where this one starts.
fn stage_update(
    staging: &mut Vec<u8>,
    runs: &mut Vec<(u64, usize, usize)>,
    home: u64,
    bytes: &[u8],
    group_update: bool,
) {
    let at = staging.len();
    staging.extend_from_slice(bytes);
    match runs.last_mut() {
        Some((h, a, l)) if group_update && *h + *l as u64 == home && *a + *l == at => {
            *l += bytes.len()
        }
        _ => runs.push((home, at, bytes.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(b: &CommitBuffers, kind: LogKind) -> Vec<(u64, bool, Vec<u8>)> {
        b.log(kind)
            .iter()
            .map(|s| {
                let e = s.entry(&b.staging);
                (e.home, e.tombstone, e.data.to_vec())
            })
            .collect()
    }

    #[test]
    fn writes_are_cut_around_new_and_freed_objects_and_merged() {
        let mut ws = WriteSet::default();
        ws.push(100, &[1; 10]); // 100..110: into the new object at 104..120
        ws.push(110, &[2; 20]); // 110..130: part new object, part plain update
        ws.push(200, &[3; 8]); // into a freed object: dropped
        ws.push(300, &[4; 4]);
        ws.push(304, &[5; 4]); // contiguous with the previous: merged
        let mut b = CommitBuffers::default();
        let payload = b.stage(&ws, &[(104, 16)], &[(196, 16)], &[], true, false);
        let mut image = vec![1u8; 6];
        image.extend([2u8; 10]);
        let stores = vec![
            (100, false, vec![1; 4]),
            (120, false, vec![2; 10]),
            (300, false, vec![4, 4, 4, 4, 5, 5, 5, 5]),
        ];
        let mut mixed = vec![(104, false, image.clone())];
        mixed.extend(stores.clone());
        assert_eq!(staged(&b, LogKind::Update), mixed);
        assert!(b.log(LogKind::Initial).is_empty());
        assert_eq!(
            staged(&b, LogKind::Alloc),
            vec![(104, true, 16u64.to_le_bytes().to_vec())]
        );
        assert_eq!(
            staged(&b, LogKind::Dealloc),
            vec![(196, true, 16u64.to_le_bytes().to_vec())]
        );
        assert_eq!(payload, 16 + 4 + 10 + 8);
        // Without group update, the contiguous writes stay two entries.
        b.stage(&ws, &[(104, 16)], &[(196, 16)], &[], false, false);
        assert_eq!(b.log(LogKind::Update).len(), 5);
        // Separate logs: the image goes to the initial-data log, the stores stay.
        let again = b.stage(&ws, &[(104, 16)], &[(196, 16)], &[], true, true);
        assert_eq!(again, payload);
        assert_eq!(staged(&b, LogKind::Update), stores);
        assert_eq!(staged(&b, LogKind::Initial), vec![(104, false, image)]);
    }

    #[test]
    fn long_runs_are_split_into_entries() {
        let mut ws = WriteSet::default();
        ws.push(0, &vec![7; MAX_ENTRY_DATA + 5]);
        let mut b = CommitBuffers::default();
        b.stage(&ws, &[], &[], &[], true, true);
        let lens: Vec<usize> = b.log(LogKind::Update).iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![MAX_ENTRY_DATA, 5]);
        assert!(!b.is_empty());
        b.stage(&WriteSet::default(), &[], &[], &[], true, true);
        assert!(b.is_empty());
    }
}
