//! The recovery rules: which transactions are committed, what may be dropped, and what
//! is damage. See the [module documentation](super) for the rules in words.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::scan::{Scan, Stop};
use super::{Damage, DroppedTransaction};
use crate::engine::log::chunks::{ChunkGeometry, payload_start};
use crate::engine::log::layout::LogKind;
use crate::engine::log::superblock::CloseRecord;

/// One log: its chunks in sequence order.
#[derive(Debug)]
pub(crate) struct LogChain {
    pub owner: u32,
    pub kind: LogKind,
    /// Indices into [`Scan::chunks`], by sequence number.
    pub chunks: Vec<usize>,
    /// Where the log's tail region (what follows its last committed block) starts, as
    /// (position in `chunks`, offset in that chunk), when it holds anything.
    pub tail: Option<(usize, u32)>,
}

impl LogChain {
    /// How the log is named in messages.
    pub(crate) fn name(&self) -> String {
        log_name(self.owner, self.kind)
    }
}

/// How a log is named in messages.
pub(crate) fn log_name(owner: u32, kind: LogKind) -> String {
    format!("{} log of log set {owner}", log_kind_name(kind))
}

/// The name of a kind of log.
pub(crate) fn log_kind_name(kind: LogKind) -> &'static str {
    match kind {
        LogKind::Update => "update",
        LogKind::Alloc => "allocation",
        LogKind::Dealloc => "deallocation",
    }
}

/// What the rules decided.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Versions of transactions with a block missing or torn: not committed.
    pub uncommitted: HashSet<u64>,
    pub logs: Vec<LogChain>,
    /// Transactions recovery drops (at most one per log set; only after a crash).
    pub dropped: Vec<DroppedTransaction>,
    /// Committed transactions.
    pub transactions: u64,
    /// Valid blocks.
    pub blocks: u64,
    /// Largest version of any valid block.
    pub max_version: u64,
    pub problems: Vec<Damage>,
}

/// Applies the rules to what was read. `close` is the clean-close record when the pool
/// was closed cleanly (`None` after a crash).
pub(crate) fn judge(scan: &Scan, geometry: &ChunkGeometry, close: Option<&CloseRecord>) -> Verdict {
    let clean = close.is_some();
    let mut v = Verdict::default();
    let block_at = |ci: usize, offset: u32| geometry.offset(scan.chunks[ci].index) + offset as u64;

    // A transaction is committed when each of its blocks points to a valid block of the
    // same transaction: then none is missing (a missing one would leave its predecessor
    // pointing at something else).
    let mut version_at: HashMap<u64, u64> = HashMap::new();
    for (ci, ch) in scan.chunks.iter().enumerate() {
        for b in &ch.blocks {
            version_at.insert(block_at(ci, b.offset), b.version);
            v.blocks += 1;
            v.max_version = v.max_version.max(b.version);
        }
    }
    let mut versions = HashSet::new();
    for ch in &scan.chunks {
        for b in &ch.blocks {
            versions.insert(b.version);
            if version_at.get(&b.peer) != Some(&b.version) {
                v.uncommitted.insert(b.version);
            }
        }
    }
    v.transactions = (versions.len() - v.uncommitted.len()) as u64;

    // The logs, each a chain of chunks with consecutive sequence numbers from 0, each
    // chunk naming its predecessor.
    let mut by_log: BTreeMap<(u32, u8), Vec<usize>> = BTreeMap::new();
    for (ci, ch) in scan.chunks.iter().enumerate() {
        by_log
            .entry((ch.header.owner, ch.header.kind as u8))
            .or_default()
            .push(ci);
    }
    for (_, mut chunks) in by_log {
        chunks.sort_by_key(|&ci| scan.chunks[ci].header.seq);
        let first = &scan.chunks[chunks[0]].header;
        let mut log = LogChain {
            owner: first.owner,
            kind: first.kind,
            chunks,
            tail: None,
        };
        let gap = chain_break(scan, geometry, &log, &mut v.problems);
        walk(
            scan,
            geometry,
            &v.uncommitted,
            gap,
            &mut log,
            &mut v.problems,
        );
        v.logs.push(log);
    }

    // At most one unfinished transaction per log set: the one its committer was writing.
    let mut unfinished: BTreeMap<u32, (Option<u64>, u64)> = BTreeMap::new();
    let mut versions_of_set: HashMap<u32, HashSet<u64>> = HashMap::new();
    for log in &v.logs {
        let Some((pos, offset)) = log.tail else {
            continue;
        };
        let at = block_at(log.chunks[pos], offset);
        if clean {
            v.problems.push(Damage::in_log(
                at,
                log.name(),
                "the log ends in a torn or unfinished transaction after a clean close".into(),
            ));
            continue;
        }
        let found: HashSet<u64> = tail_versions(scan, &v.uncommitted, log);
        let set = versions_of_set.entry(log.owner).or_default();
        set.extend(found);
        let entry = unfinished.entry(log.owner).or_insert((None, at));
        entry.1 = entry.1.min(at);
    }
    for (owner, set) in &versions_of_set {
        if set.len() > 1 {
            let mut list: Vec<u64> = set.iter().copied().collect();
            list.sort_unstable();
            let at = unfinished.get(owner).map_or(geometry.start, |e| e.1);
            v.problems.push(Damage::at(
                at,
                format!(
                    "log set {owner} holds {} unfinished transactions (versions {list:?}); only the last one written can be torn",
                    list.len()
                ),
            ));
        }
        if let (Some(e), Some(&version)) = (unfinished.get_mut(owner), set.iter().next()) {
            e.0 = Some(version);
        }
    }
    v.dropped = unfinished
        .iter()
        .map(|(&log_set, &(version, offset))| DroppedTransaction {
            log_set: Some(log_set),
            version,
            offset,
        })
        .collect();
    // A torn chunk header is the start of a transaction's write in a new chunk: the same
    // transaction as its log set's other torn data, if any.
    for t in &scan.torn_headers {
        let at = geometry.offset(t.index);
        if clean {
            v.problems.push(Damage::at(
                at,
                format!("chunk {} has a torn header after a clean close", t.index),
            ));
        } else if t
            .owner
            .is_none_or(|o| !v.dropped.iter().any(|d| d.log_set == Some(o)))
        {
            v.dropped.push(DroppedTransaction {
                log_set: t.owner,
                version: None,
                offset: at,
            });
        }
    }

    if let Some(close) = close {
        let found = CloseRecord {
            max_version: v.max_version,
            transactions: v.transactions,
            blocks: v.blocks,
            chunks_in_use: scan.chunks.len() as u64,
        };
        if found != *close {
            v.problems.push(Damage::at(
                geometry.start,
                format!(
                    "the log does not hold what the clean close recorded (recorded {close:?}, found {found:?}): log data is missing or extra"
                ),
            ));
        }
    }
    v
}

/// The position in `log.chunks` of the first chunk that does not follow its
/// predecessor (its sequence number or its predecessor is not the previous chunk's), if
/// any. The chunks of a crashed transaction can have such a gap (a new chunk's header
/// did not reach the media, a later one's did); before committed data it is damage.
/// Two chunks claiming one place in the log are always damage.
fn chain_break(
    scan: &Scan,
    geometry: &ChunkGeometry,
    log: &LogChain,
    problems: &mut Vec<Damage>,
) -> Option<usize> {
    let mut gap = None;
    for (pos, &ci) in log.chunks.iter().enumerate() {
        let h = &scan.chunks[ci].header;
        let prev = pos.checked_sub(1).map(|p| &scan.chunks[log.chunks[p]]);
        if prev.is_some_and(|p| p.header.seq == h.seq) {
            problems.push(Damage::in_log(
                geometry.offset(scan.chunks[ci].index),
                log.name(),
                format!(
                    "chunks {} and {} both claim to be number {} of the log",
                    prev.map_or(0, |p| p.index),
                    scan.chunks[ci].index,
                    h.seq
                ),
            ));
        }
        if gap.is_none() && (h.seq as usize != pos || h.prev != prev.map(|p| p.index)) {
            gap = Some(pos);
        }
    }
    gap
}

/// Walks a log in order and finds where its tail region starts: the first of a block of
/// an uncommitted transaction, torn bytes, a block after the end of its chunk's run, a
/// chunk with no block, or a gap in the chain of chunks (`gap`). Committed blocks after
/// that point are damage.
fn walk(
    scan: &Scan,
    geometry: &ChunkGeometry,
    uncommitted: &HashSet<u64>,
    gap: Option<usize>,
    log: &mut LogChain,
    problems: &mut Vec<Damage>,
) {
    let mut reported = false;
    for (pos, &ci) in log.chunks.iter().enumerate() {
        let ch = &scan.chunks[ci];
        let base = geometry.offset(ch.index);
        // The items of the chunk in order: the run, the stop, the blocks after it.
        let mut items: Vec<(u32, bool)> = Vec::new(); // (offset, committed)
        if gap == Some(pos) {
            items.push((payload_start(), false));
        }
        for b in &ch.blocks[..ch.run] {
            items.push((b.offset, !uncommitted.contains(&b.version)));
        }
        if ch.run == 0 {
            items.push((payload_start(), false));
        }
        if let Stop::Invalid(at) = ch.stop {
            items.push((at, false));
        }
        for b in &ch.blocks[ch.run..] {
            if !uncommitted.contains(&b.version) && !reported {
                problems.push(Damage::in_log(
                    base + b.offset as u64,
                    log.name(),
                    format!(
                        "a committed transaction (version {}) lies after the end of its chunk's blocks at offset {}",
                        b.version,
                        base + ch.stop.offset() as u64
                    ),
                ));
                reported = true;
            }
            // The region after the stop belongs to the tail from the stop on.
            items.push((ch.stop.offset(), false));
        }
        for (offset, committed) in items {
            match (committed, log.tail) {
                (false, None) => log.tail = Some((pos, offset)),
                (true, Some((tp, to))) if !reported => {
                    let tail_at = geometry.offset(scan.chunks[log.chunks[tp]].index) + to as u64;
                    problems.push(Damage::in_log(
                        tail_at,
                        log.name(),
                        format!(
                            "torn or unfinished data at offset {tail_at} is followed by committed transactions (at offset {}): the log is damaged, not torn",
                            base + offset as u64
                        ),
                    ));
                    reported = true;
                }
                _ => {}
            }
        }
    }
}

/// Versions of the uncommitted blocks in a log's tail region.
fn tail_versions(scan: &Scan, uncommitted: &HashSet<u64>, log: &LogChain) -> HashSet<u64> {
    let mut out = HashSet::new();
    let Some((pos, offset)) = log.tail else {
        return out;
    };
    for (p, &ci) in log.chunks.iter().enumerate().skip(pos) {
        for b in &scan.chunks[ci].blocks {
            if (p > pos || b.offset >= offset) && uncommitted.contains(&b.version) {
                out.insert(b.version);
            }
        }
    }
    out
}
