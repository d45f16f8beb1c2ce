//! The YCSB core workloads A–F (`workloads/workloada` … `workloadf` of the YCSB
//! distribution): operation mixes and request distributions.

use std::fmt;
use std::str::FromStr;

/// One of the six core workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Workload {
    /// Update heavy: 50% reads, 50% updates, Zipfian.
    A,
    /// Read mostly: 95% reads, 5% updates, Zipfian.
    B,
    /// Read only: 100% reads, Zipfian.
    C,
    /// Read latest: 95% reads, 5% inserts, the newest records most popular.
    D,
    /// Short ranges: 95% scans (uniform length 1–100), 5% inserts, Zipfian start keys.
    E,
    /// Read-modify-write: 50% reads, 50% read-modify-writes, Zipfian.
    F,
}

/// Every workload, in order.
pub const ALL: [Workload; 6] = [
    Workload::A,
    Workload::B,
    Workload::C,
    Workload::D,
    Workload::E,
    Workload::F,
];

/// How a workload picks the records it touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestDistribution {
    /// YCSB's scrambled Zipfian (constant 0.99).
    Zipfian,
    /// The newest records most popular (YCSB's skewed latest).
    Latest,
}

/// An operation of the run phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Operation {
    /// Read a whole record.
    Read,
    /// Replace one field of a record.
    Update,
    /// Add a new record.
    Insert,
    /// Read up to `max_scan_len` records in key order from a start key.
    Scan,
    /// Read a record, then replace one of its fields.
    ReadModifyWrite,
}

impl Operation {
    /// YCSB's name of it.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "READ",
            Operation::Update => "UPDATE",
            Operation::Insert => "INSERT",
            Operation::Scan => "SCAN",
            Operation::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

impl Workload {
    /// The operation mix: each operation with its proportion.
    pub fn mix(self) -> &'static [(Operation, f64)] {
        use Operation::*;
        match self {
            Workload::A => &[(Read, 0.5), (Update, 0.5)],
            Workload::B => &[(Read, 0.95), (Update, 0.05)],
            Workload::C => &[(Read, 1.0)],
            Workload::D => &[(Read, 0.95), (Insert, 0.05)],
            Workload::E => &[(Scan, 0.95), (Insert, 0.05)],
            Workload::F => &[(Read, 0.5), (ReadModifyWrite, 0.5)],
        }
    }

    /// How records are picked.
    pub fn distribution(self) -> RequestDistribution {
        match self {
            Workload::D => RequestDistribution::Latest,
            _ => RequestDistribution::Zipfian,
        }
    }

    /// The share of operations that insert.
    pub fn insert_proportion(self) -> f64 {
        self.mix()
            .iter()
            .filter(|(op, _)| *op == Operation::Insert)
            .map(|(_, p)| p)
            .sum()
    }

    /// Picks an operation for a uniform draw `u` in `[0, 1)`.
    pub fn pick(self, u: f64) -> Operation {
        let mut acc = 0.0;
        for &(op, p) in self.mix() {
            acc += p;
            if u < acc {
                return op;
            }
        }
        self.mix()[self.mix().len() - 1].0
    }

    /// What YCSB calls it.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::A => "update heavy (50/50 read/update)",
            Workload::B => "read mostly (95/5 read/update)",
            Workload::C => "read only",
            Workload::D => "read latest (95/5 read/insert)",
            Workload::E => "short ranges (95/5 scan/insert)",
            Workload::F => "read-modify-write (50/50 read/rmw)",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        let letter = s.trim_start_matches("workload").to_ascii_uppercase();
        ALL.into_iter()
            .find(|w| w.to_string() == letter)
            .ok_or_else(|| format!("unknown YCSB workload {s:?}: one of A, B, C, D, E, F"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_sum_to_one_and_pick_follows_them() {
        for w in ALL {
            let sum: f64 = w.mix().iter().map(|(_, p)| p).sum();
            assert!((sum - 1.0).abs() < 1e-9, "{w}");
        }
        assert_eq!(Workload::A.pick(0.49), Operation::Read);
        assert_eq!(Workload::A.pick(0.51), Operation::Update);
        assert_eq!(Workload::E.pick(0.96), Operation::Insert);
        assert_eq!(Workload::E.insert_proportion(), 0.05);
        assert_eq!("workloadf".parse::<Workload>(), Ok(Workload::F));
        assert_eq!("c".parse::<Workload>(), Ok(Workload::C));
        assert!("g".parse::<Workload>().is_err());
    }
}
