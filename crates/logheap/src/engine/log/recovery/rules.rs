//! The recovery rules: which transactions are committed, what may be dropped, and what
//! is damage. See the [module documentation](super) for the rules in words.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::DroppedTransaction;
use super::scan::{Scan, Stop};
use crate::engine::log::chunks::{ChunkGeometry, payload_start};
use crate::engine::log::damage::Damage;
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
        LogKind::Initial => "initial-data",
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
    /// Chunks (positions in [`Scan::chunks`]) the cleaner was taking out of their log
    /// when the pool crashed: valid, but off their log's chain, holding only data moved
    /// elsewhere. Not replayed; the repair erases them.
    pub orphans: Vec<usize>,
    pub problems: Vec<Damage>,
    /// The allocation checkpoint replay starts from, if the pool has one (its records
    /// at or below its version are in it, not replayed).
    pub seed: Option<std::sync::Arc<crate::engine::log::checkpoint::Checkpoint>>,
    /// A salvaging open's cut ([`salvage_cut`]): every transaction of this version or
    /// newer is dropped.
    pub salvage_cut: Option<u64>,
}

impl Verdict {
    /// Whether the chunk at position `ci` of the scan is replayed (is not an orphan).
    pub(crate) fn replays_chunk(&self, ci: usize) -> bool {
        self.orphans.is_empty() || !self.orphans.contains(&ci)
    }
}

/// Applies the rules to what was read. `close` is the clean-close record when the pool
/// was closed cleanly (`None` after a crash); `cleaned` is the superblock's
/// cleaned-through version (0 when the cleaner never reclaimed a chunk).
pub(crate) fn judge(
    scan: &Scan,
    geometry: &ChunkGeometry,
    close: Option<&CloseRecord>,
    cleaned: u64,
) -> Verdict {
    judge_with(scan, geometry, close, cleaned, None)
}

/// [`judge`], salvaging (for `logheap check --repair`) when `cut` is given: every
/// transaction of version `cut` or above is taken as not committed, and each log's
/// tail region, dropped as after a crash, may then hold more than one of them; the
/// rules that only a crash's single interrupted transaction obeys (one per log set,
/// where its blocks point, the clean-close record) are not applied.
pub(crate) fn judge_with(
    scan: &Scan,
    geometry: &ChunkGeometry,
    close: Option<&CloseRecord>,
    cleaned: u64,
    cut: Option<u64>,
) -> Verdict {
    let clean = close.is_some() && cut.is_none();
    let mut v = Verdict::default();
    let block_at = |ci: usize, offset: u32| geometry.offset(scan.chunks[ci].index) + offset as u64;

    // A transaction is committed when each of its blocks points to a valid block of the
    // same transaction: then none is missing (a missing one would leave its predecessor
    // pointing at something else). A transaction at or below the cleaned-through
    // version had finished its commit before the cleaner reclaimed anything that held
    // a block of it, so its peer pointers are not looked at. Blocks are found by place without a map: chunks were
    // read in index order, and each chunk's blocks are in offset order.
    let mut position = vec![u32::MAX; scan.chunks.last().map_or(0, |c| c.index as usize + 1)];
    for (ci, ch) in scan.chunks.iter().enumerate() {
        position[ch.index as usize] = ci as u32;
    }
    let version_at = |at: u64| {
        let chunk = at.checked_sub(geometry.start)? / geometry.size;
        let &ci = position.get(usize::try_from(chunk).ok()?)?;
        let ch = scan.chunks.get(ci as usize)?;
        let offset = at - geometry.offset(ch.index);
        let i = ch
            .blocks
            .binary_search_by_key(&offset, |b| b.offset as u64)
            .ok()?;
        Some(ch.blocks[i].version)
    };
    // The generation of the chunk holding pool offset `at`, if it has a valid header.
    let generation_at = |at: u64| {
        let chunk = at.checked_sub(geometry.start)? / geometry.size;
        let &ci = position.get(usize::try_from(chunk).ok()?)?;
        Some(scan.chunks.get(ci as usize)?.header.generation)
    };
    let mut versions = Vec::new();
    for ch in &scan.chunks {
        for b in &ch.blocks {
            v.blocks += 1;
            v.max_version = v.max_version.max(b.version);
            versions.push(b.version);
            if cut.is_some_and(|cut| b.version >= cut) {
                v.uncommitted.insert(b.version);
                continue;
            }
            if version_at(b.peer) == Some(b.version) {
                continue;
            }
            if b.version > cleaned {
                v.uncommitted.insert(b.version);
            } else if generation_at(b.peer).is_some_and(|g| g <= ch.header.generation) {
                // A block at or below `W` may name a peer the cleaner reclaimed. But the
                // peer's chunk joined its log no later than this block's chunk (its
                // generation is not newer), so it is the chunk the peer was written to,
                // never reclaimed since (a chunk reclaimed and taken again gets a
                // generation newer than every chunk of a transaction that finished
                // before the reclaim), and the cleaner reclaims whole chunks: the peer
                // must be there.
                v.problems.push(Damage::in_log(
                    geometry.offset(ch.index) + b.offset as u64,
                    log_name(ch.header.owner, ch.header.kind),
                    format!(
                        "the block of version {} names its peer at {:#x}, which is missing from a chunk that was never reclaimed",
                        b.version, b.peer
                    ),
                ));
            }
        }
    }
    v.transactions = (distinct(&mut versions) - v.uncommitted.len()) as u64;

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
        if cleaned > 0 && !clean {
            let orphans = off_chain(scan, &chunks, cleaned);
            chunks.retain(|ci| !orphans.contains(ci));
            v.orphans.extend(orphans);
        }
        let first = &scan.chunks[chunks[0]].header;
        let mut log = LogChain {
            owner: first.owner,
            kind: first.kind,
            chunks,
            tail: None,
        };
        let gap = chain_break(scan, geometry, &log, cleaned, &mut v.problems);
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
    // Ordered, so problems and the dropped version come out the same every time.
    let mut versions_of_set: BTreeMap<u32, HashSet<u64>> = BTreeMap::new();
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
        if set.len() > 1 && cut.is_none() {
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
        if let (Some(e), Some(&version)) = (unfinished.get_mut(owner), set.iter().min()) {
            e.0 = Some(version);
        }
    }
    if !clean && cut.is_none() {
        let mut found = check_unfinished_peers(scan, geometry, &v);
        v.problems.append(&mut found);
        let mut found = check_unfinished_extent(scan, geometry, &v, &unfinished);
        v.problems.append(&mut found);
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

    if let Some(close) = close.filter(|_| cut.is_none()) {
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

/// How many distinct values `values` holds (in any order afterwards). Versions are
/// handed out from one counter, so a log's are usually dense: then a bitmap over their
/// span counts them in one pass; sparse ones (or a hostile file's) are sorted.
pub(super) fn distinct(values: &mut [u64]) -> usize {
    let (Some(&min), Some(&max)) = (values.iter().min(), values.iter().max()) else {
        return 0;
    };
    let span = max - min;
    if span / 16 > values.len() as u64 {
        values.sort_unstable();
        return values.len() - values.windows(2).filter(|w| w[0] == w[1]).count();
    }
    // At most 16 bits per value: the span fits in memory as the values do.
    let mut seen = vec![0u64; (span / 64 + 1) as usize];
    let mut count = 0;
    for &x in values.iter() {
        let bit = x - min;
        let word = &mut seen[(bit / 64) as usize];
        let mask = 1 << (bit % 64);
        count += usize::from(*word & mask == 0);
        *word |= mask;
    }
    count
}

/// The version from which a salvaging open drops every transaction, so that what stays
/// is the pool as it was before its first damage: a prefix of its history, which no
/// dropped transaction can have changed. For each problem inside a log: one more than
/// the newest version written to that log before it (the damaged transaction, whose
/// version may be unreadable, came after it), and no more than the oldest version
/// read after it. A damaged chunk header hides its log and its blocks: one more than
/// the newest version of the log that ends earliest. `None` when no problem lies in a
/// log (then salvaging cannot help).
pub(crate) fn salvage_cut(
    scan: &Scan,
    geometry: &ChunkGeometry,
    first: &Verdict,
    problems: &[Damage],
) -> Option<u64> {
    // (log, position in the log, offset in the chunk) of each chunk that is in a log.
    let mut place: HashMap<u32, (usize, usize)> = HashMap::new();
    for (li, log) in first.logs.iter().enumerate() {
        for (pos, &ci) in log.chunks.iter().enumerate() {
            place.insert(scan.chunks[ci].index, (li, pos));
        }
    }
    /// Each block of `log`: ((position in the log, offset in its chunk), version).
    fn blocks_of<'a>(
        scan: &'a Scan,
        log: &'a LogChain,
    ) -> impl Iterator<Item = ((usize, u32), u64)> + 'a {
        log.chunks.iter().enumerate().flat_map(move |(pos, &ci)| {
            scan.chunks[ci]
                .blocks
                .iter()
                .map(move |b| ((pos, b.offset), b.version))
        })
    }
    let mut cut: Option<u64> = None;
    for p in problems {
        let Some(chunk) = p
            .offset
            .checked_sub(geometry.start)
            .map(|o| o / geometry.size)
        else {
            continue;
        };
        let Some(&(li, pos)) = u32::try_from(chunk).ok().and_then(|c| place.get(&c)) else {
            continue;
        };
        let log = &first.logs[li];
        let at = (
            pos,
            (p.offset - geometry.offset(scan.chunks[log.chunks[pos]].index)) as u32,
        );
        let before = blocks_of(scan, log)
            .filter(|&(place, _)| place < at)
            .map(|(_, v)| v)
            .max()
            .unwrap_or(0);
        let after = blocks_of(scan, log)
            .filter(|&(place, _)| place >= at)
            .map(|(_, v)| v)
            .min()
            .unwrap_or(u64::MAX);
        let here = before.saturating_add(1).min(after);
        cut = Some(cut.map_or(here, |c| c.min(here)));
    }
    if !scan.damaged_headers.is_empty() {
        let earliest_end = first
            .logs
            .iter()
            .map(|log| blocks_of(scan, log).map(|(_, v)| v).max().unwrap_or(0))
            .min()
            .unwrap_or(0);
        let here = earliest_end.saturating_add(1);
        cut = Some(cut.map_or(here, |c| c.min(here)));
    }
    cut
}

/// The chunks of one log (positions in `scan.chunks`, in sequence order) that the
/// cleaner was taking out of the log when the pool crashed: a chunk `x` that the chunk
/// after it skips (both name the same previous chunk, or none: the cleaner repointed
/// the next chunk, [`ChunkPool::unlink`](crate::engine::log::chunks::ChunkPool::unlink),
/// and the crash came before `x`'s header was erased), that no chunk names as its
/// previous, and whose blocks are all at or below the cleaned-through version (the
/// cleaner only reclaims such chunks, after moving their live data). A single changed
/// byte cannot make one: a chunk's previous is covered by its header's checksum.
fn off_chain(scan: &Scan, chunks: &[usize], cleaned: u64) -> Vec<usize> {
    let header = |ci: usize| &scan.chunks[ci].header;
    chunks
        .windows(2)
        .filter(|pair| {
            let (x, next) = (pair[0], pair[1]);
            header(next).prev == header(x).prev
                && header(next).seq > header(x).seq
                && !chunks
                    .iter()
                    .any(|&c| header(c).prev == Some(scan.chunks[x].index))
                && scan.chunks[x].blocks.iter().all(|b| b.version <= cleaned)
        })
        .map(|pair| pair[0])
        .collect()
}

/// The position in `log.chunks` of the first chunk that does not follow its
/// predecessor (its predecessor is not the previous chunk, or its sequence number is
/// not the next: while the cleaner never reclaimed a chunk, `cleaned == 0`, the
/// numbers have no gaps; after, they only grow), if any. The chunks of a crashed
/// transaction can have such a gap (a new chunk's header did not reach the media, a
/// later one's did); before committed data it is damage. Two chunks claiming one place
/// in the log are always damage.
fn chain_break(
    scan: &Scan,
    geometry: &ChunkGeometry,
    log: &LogChain,
    cleaned: u64,
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
        let follows = match prev {
            None => cleaned > 0 || h.seq == 0,
            Some(p) => {
                h.seq > p.header.seq && (cleaned > 0 || h.seq == p.header.seq.wrapping_add(1))
            }
        };
        if gap.is_none() && (!follows || h.prev != prev.map(|p| p.index)) {
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
    // The items of a chunk in order: the run, the stop, the blocks after it.
    let mut items: Vec<(u32, bool)> = Vec::new(); // (offset, committed)
    for (pos, &ci) in log.chunks.iter().enumerate() {
        let ch = &scan.chunks[ci];
        let base = geometry.offset(ch.index);
        items.clear();
        if gap == Some(pos) {
            items.push((payload_start(), false));
        }
        for b in &ch.blocks[..ch.run] {
            items.push((b.offset, !uncommitted.contains(&b.version)));
        }
        if ch.run == 0 {
            items.push((payload_start(), false));
        }
        if let Stop::Invalid(at) = ch.stop
            && !end_mark_lost(scan, uncommitted, gap, log, pos)
        {
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
        for &(offset, committed) in &items {
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

/// Whether the invalid bytes after the blocks of the chunk at `pos` of `log` are where
/// an end mark did not reach the media, rather than torn data: a commit that went on
/// into the next chunk wrote its last block here with an end mark after it, in one
/// fence, and a crash can persist the block and not the mark (a later cache line, or
/// the later words of the same line; a reused chunk then shows stale bytes there).
/// That is so when the chunk's last block is of a committed transaction whose blocks
/// go on at the start of the next chunk in the chain: that transaction finished, and
/// nothing is ever written to a chunk after a commit has moved on from it.
fn end_mark_lost(
    scan: &Scan,
    uncommitted: &HashSet<u64>,
    gap: Option<usize>,
    log: &LogChain,
    pos: usize,
) -> bool {
    let ch = &scan.chunks[log.chunks[pos]];
    let (Some(last), Some(&next)) = (
        ch.run.checked_sub(1).map(|k| &ch.blocks[k]),
        log.chunks.get(pos + 1),
    ) else {
        return false;
    };
    let next = &scan.chunks[next];
    gap != Some(pos + 1)
        && !uncommitted.contains(&last.version)
        && next.run > 0
        && next.blocks[0].offset == payload_start()
        && next.blocks[0].version == last.version
}

/// Checks where the blocks of unfinished transactions point. A committer appends a
/// transaction's blocks log by log (update, allocation, deallocation, initial data) and
/// links them in that order into a cycle, so a readable block whose peer is in another log, or back at
/// the start of its own log's part (the cycle's close), names the transaction's first
/// block in that log: which was appended right after that log's last committed block (or
/// at the start of a new chunk). If it is not there, something in between — a committed
/// transaction — is missing: damage, not a torn write.
fn check_unfinished_peers(scan: &Scan, geometry: &ChunkGeometry, v: &Verdict) -> Vec<Damage> {
    let mut problems = Vec::new();
    // Where each chunk of a log is: (log index in v.logs, position in its chain).
    let mut place: HashMap<u32, (usize, usize)> = HashMap::new();
    for (li, log) in v.logs.iter().enumerate() {
        for (pos, &ci) in log.chunks.iter().enumerate() {
            place.insert(scan.chunks[ci].index, (li, pos));
        }
    }
    for (li, log) in v.logs.iter().enumerate() {
        for (pos, &ci) in log.chunks.iter().enumerate() {
            let ch = &scan.chunks[ci];
            for b in ch
                .blocks
                .iter()
                .filter(|b| v.uncommitted.contains(&b.version))
            {
                let p = b.peer;
                if p < geometry.start || p >= geometry.offset(geometry.count) {
                    problems.push(Damage::in_log(
                        geometry.offset(ch.index) + b.offset as u64,
                        log.name(),
                        format!("a block points to offset {p}, outside the log"),
                    ));
                    continue;
                }
                let chunk = geometry.chunk_of(p);
                let offset = (p - geometry.offset(chunk)) as u32;
                let Some(&(pl, ppos)) = place.get(&chunk) else {
                    // A chunk in no log: the transaction was starting it.
                    if offset != payload_start() {
                        problems.push(Damage::in_log(
                            p,
                            log.name(),
                            "an unfinished transaction points into the middle of a chunk in no log"
                                .into(),
                        ));
                    }
                    continue;
                };
                if pl == li && (ppos, offset) > (pos, b.offset) {
                    continue; // the next block in the same log
                }
                let target = &v.logs[pl];
                if target.owner != log.owner {
                    problems.push(Damage::in_log(
                        p,
                        target.name(),
                        format!(
                            "a block of log set {} points into a log of log set {}",
                            log.owner, target.owner
                        ),
                    ));
                    continue;
                }
                // The end of the log's committed part: where its tail region starts, or,
                // when that is the start of a chunk, possibly where the previous chunk's
                // blocks end (the transaction's first block there did not reach the
                // media, or it did not fit).
                let stop_of = |pos: usize| (pos, scan.chunks[target.chunks[pos]].stop.offset());
                let expected = match target.tail {
                    Some((tpos, toff)) => (tpos, toff),
                    None => stop_of(target.chunks.len() - 1),
                };
                let before_new_chunk = match target.tail {
                    Some((tpos, toff)) if toff == payload_start() && tpos > 0 => {
                        Some(stop_of(tpos - 1))
                    }
                    _ => None,
                };
                if (ppos, offset) != expected && Some((ppos, offset)) != before_new_chunk {
                    let at = geometry.offset(scan.chunks[target.chunks[expected.0]].index)
                        + expected.1 as u64;
                    problems.push(Damage::in_log(
                        at,
                        target.name(),
                        format!(
                            "the unfinished transaction {} starts in this log at offset {p}, but the log's committed part ends at offset {at}: data in between is lost",
                            b.version
                        ),
                    ));
                }
            }
        }
    }
    problems
}

/// Checks that the unfinished transaction of each log set accounts for all the torn
/// bytes of its set. Its readable blocks tell which logs it wrote to (the cycle of peer
/// pointers visits them in plan order, so a pointer from one log to a later one skips
/// those in between), and a log it did not write to cannot end in torn bytes. In a chunk
/// whose payload was zeros when it joined the log, nothing follows a transaction's last
/// block in it until the next commit writes there: torn bytes right after a block of the
/// unfinished transaction that is not followed by its own next block were written by a
/// later transaction, so this one had finished and its damage is not a torn write.
fn check_unfinished_extent(
    scan: &Scan,
    geometry: &ChunkGeometry,
    v: &Verdict,
    unfinished: &BTreeMap<u32, (Option<u64>, u64)>,
) -> Vec<Damage> {
    let mut problems = Vec::new();
    // Where each chunk of a log is: (kind, position in its chain).
    let mut place: HashMap<u32, (LogKind, usize)> = HashMap::new();
    for log in &v.logs {
        for (pos, &ci) in log.chunks.iter().enumerate() {
            place.insert(scan.chunks[ci].index, (log.kind, pos));
        }
    }
    let next = |k: LogKind| LogKind::ALL[(k.index() + 1) % LogKind::ALL.len()];
    for (&owner, &(version, _)) in unfinished {
        let Some(version) = version else { continue };
        let mut skipped: HashSet<LogKind> = HashSet::new();
        for log in v.logs.iter().filter(|l| l.owner == owner) {
            for (pos, &ci) in log.chunks.iter().enumerate() {
                let ch = &scan.chunks[ci];
                for b in ch.blocks.iter().filter(|b| b.version == version) {
                    let inside =
                        b.peer >= geometry.start && b.peer < geometry.offset(geometry.count);
                    let Some(&(to, to_pos)) = inside
                        .then(|| place.get(&geometry.chunk_of(b.peer)))
                        .flatten()
                    else {
                        continue;
                    };
                    let to_offset = b.peer - geometry.offset(geometry.chunk_of(b.peer));
                    // Back to an earlier place in the same log: the cycle's close.
                    let backward = to == log.kind && (to_pos, to_offset) <= (pos, b.offset as u64);
                    if to != log.kind || backward {
                        let mut k = next(log.kind);
                        while k != to {
                            skipped.insert(k);
                            k = next(k);
                        }
                    }
                }
            }
        }
        for log in v
            .logs
            .iter()
            .filter(|l| l.owner == owner && skipped.contains(&l.kind))
        {
            if let Some((pos, offset)) = log.tail {
                problems.push(Damage::in_log(
                    geometry.offset(scan.chunks[log.chunks[pos]].index) + offset as u64,
                    log.name(),
                    format!(
                        "the log ends in torn data, but the log set's unfinished transaction {version} did not write to this log"
                    ),
                ));
            }
        }
    }
    for log in &v.logs {
        for &ci in &log.chunks {
            let ch = &scan.chunks[ci];
            let (Stop::Invalid(at), true, Some(last)) = (
                ch.stop,
                ch.header.zeroed,
                ch.run.checked_sub(1).map(|i| &ch.blocks[i]),
            ) else {
                continue;
            };
            let torn_at = geometry.offset(ch.index) + at as u64;
            if v.uncommitted.contains(&last.version) && last.peer != torn_at {
                problems.push(Damage::in_log(
                    torn_at,
                    log.name(),
                    format!(
                        "torn data follows the last block of the unfinished transaction {} in a zeroed chunk: a later transaction wrote it, so that one had finished",
                        last.version
                    ),
                ));
            }
        }
    }
    problems
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_counts_dense_and_sparse_values_alike() {
        let mut dense: Vec<u64> = (0..1000).map(|i| 500 + i % 300).collect();
        assert_eq!(distinct(&mut dense), 300);
        let mut sparse = vec![u64::MAX, 1, u64::MAX, 7, 1 << 40, 7];
        assert_eq!(distinct(&mut sparse), 4);
        assert_eq!(distinct(&mut []), 0);
        assert_eq!(distinct(&mut [u64::MAX]), 1);
    }
    use crate::engine::log::layout::{ChunkHeader, DecodedBlock};
    use crate::engine::log::recovery::scan::{ScannedChunk, Stop};

    const SIZE: u64 = 4096;

    fn chunk(
        index: u32,
        kind: LogKind,
        generation: u64,
        blocks: Vec<DecodedBlock>,
    ) -> ScannedChunk {
        let run = blocks.len();
        let end = blocks.last().map_or(64, |b| b.end);
        ScannedChunk {
            index,
            header: ChunkHeader {
                kind,
                zeroed: false,
                owner: 1,
                generation,
                prev: None,
                seq: 0,
            },
            blocks,
            entries: Vec::new(),
            run,
            stop: Stop::End(end),
        }
    }

    fn block(offset: u32, version: u64, peer: u64) -> DecodedBlock {
        DecodedBlock {
            offset,
            version,
            peer,
            crc: 0,
            entries: 0..0,
            end: offset + 64,
        }
    }

    /// A log of two chunks: an update block of version 2 at chunk 0, and an allocation
    /// block of version 3 at chunk 1 whose peer is at chunk 0 offset 128, where there is
    /// no block; chunk 0 has generation `peer_generation`, chunk 1 generation 6.
    fn missing_peer(peer_generation: u64) -> Scan {
        Scan {
            chunks: vec![
                chunk(0, LogKind::Update, peer_generation, vec![block(64, 2, 64)]),
                chunk(1, LogKind::Alloc, 6, vec![block(64, 3, 128)]),
            ],
            ..Scan::default()
        }
    }

    /// Chunk 0 (sequence 0), chunk 1 (sequence 1, after chunk 0) and chunk 2 (sequence
    /// 2, also after chunk 0: repointed past chunk 1), each with one self-contained
    /// block, of versions 1, 2 and 3.
    fn repointed_log() -> Scan {
        let mut chunks = vec![
            chunk(0, LogKind::Update, 1, vec![block(64, 1, 64)]),
            chunk(1, LogKind::Update, 2, vec![block(64, 2, SIZE + 64)]),
            chunk(2, LogKind::Update, 3, vec![block(64, 3, 2 * SIZE + 64)]),
        ];
        for (k, prev) in [(1, Some(0)), (2, Some(0))] {
            chunks[k].header.prev = prev;
            chunks[k].header.seq = k as u32;
        }
        Scan {
            chunks,
            ..Scan::default()
        }
    }

    #[test]
    fn a_chunk_skipped_by_its_successor_is_an_orphan_only_at_or_below_w_after_a_crash() {
        let geometry = ChunkGeometry {
            start: 0,
            size: SIZE,
            count: 4,
        };
        let scan = repointed_log();
        // Its blocks at or below W: the cleaner was reclaiming it.
        let v = judge(&scan, &geometry, None, 2);
        assert_eq!(v.orphans, vec![1]);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert!(!v.replays_chunk(1) && v.replays_chunk(2));
        assert_eq!(v.logs[0].chunks, vec![0, 2]);
        // A block above W: no reclaim could have been in progress; the chain is broken
        // before committed data.
        let v = judge(&scan, &geometry, None, 1);
        assert!(v.orphans.is_empty());
        assert!(!v.problems.is_empty());
        // Nothing was ever cleaned: the same.
        let v = judge(&scan, &geometry, None, 0);
        assert!(v.orphans.is_empty());
        assert!(!v.problems.is_empty());
    }

    /// Chunk 0 ends in a block of version 5 (peer `peer0`) followed by invalid bytes;
    /// chunk 1 comes after it and starts with a block of `next_version` (peer
    /// `peer1`).
    fn lost_end_mark(next_version: u64, peer0: u64, peer1: u64) -> Scan {
        let mut first = chunk(0, LogKind::Update, 1, vec![block(64, 5, peer0)]);
        first.stop = Stop::Invalid(128);
        let mut second = chunk(1, LogKind::Update, 2, vec![block(64, next_version, peer1)]);
        second.header.prev = Some(0);
        second.header.seq = 1;
        Scan {
            chunks: vec![first, second],
            ..Scan::default()
        }
    }

    #[test]
    fn a_lost_end_mark_before_a_commit_goes_on_in_the_next_chunk_is_not_torn_data() {
        let geometry = ChunkGeometry {
            start: 0,
            size: SIZE,
            count: 4,
        };
        // One transaction across both chunks, committed: the bytes after its block in
        // chunk 0 are where its end mark did not persist.
        let v = judge(&lost_end_mark(5, SIZE + 64, 64), &geometry, None, 0);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert!(v.uncommitted.is_empty());
        assert_eq!(v.logs[0].tail, None);
        // Chunk 1 starts with another transaction: the invalid bytes are torn data
        // before committed data, which is damage.
        let v = judge(&lost_end_mark(6, 64, SIZE + 64), &geometry, None, 0);
        assert!(
            v.problems
                .iter()
                .any(|d| d.reason.contains("is followed by committed transactions")),
            "{:?}",
            v.problems
        );
    }

    fn complains_of_missing_peer(v: &Verdict) -> bool {
        v.problems.iter().any(|d| {
            d.reason
                .contains("which is missing from a chunk that was never reclaimed")
        })
    }

    #[test]
    fn a_missing_peer_at_or_below_w_is_damage_unless_its_chunk_may_have_been_reclaimed() {
        let geometry = ChunkGeometry {
            start: 0,
            size: SIZE,
            count: 4,
        };
        // Above W: the transaction is not committed (a torn write), not damage here.
        let v = judge(&missing_peer(5), &geometry, None, 0);
        assert!(v.uncommitted.contains(&3));
        assert!(!complains_of_missing_peer(&v));
        // At or below W, the peer's chunk older than the block's: never reclaimed, so
        // the missing peer is damage.
        let v = judge(&missing_peer(5), &geometry, None, 10);
        assert!(v.uncommitted.is_empty());
        assert!(complains_of_missing_peer(&v), "{:?}", v.problems);
        // The peer's chunk newer than the block's: it may have been reclaimed and taken
        // again, so the block counts as committed.
        let v = judge(&missing_peer(7), &geometry, None, 10);
        assert!(v.uncommitted.is_empty());
        assert!(!complains_of_missing_peer(&v), "{:?}", v.problems);
    }
}
