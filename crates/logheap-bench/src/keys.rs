//! Key streams of the workloads ("Log-structured Non-volatile Main Memory", USENIX ATC 2017, §5): uniform random keys for
//! the insert workloads, and Zipf-distributed keys for the update workloads, skewed so
//! that about 90% of operations hit 15% of the keys.

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Spreads ranks over the key space, so hot keys are not neighbours.
pub fn scramble(rank: u64) -> u64 {
    let mut x = rank.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The Zipf exponent for which the top `hot` fraction of `n` ranks receive `share` of
/// the probability mass (bisection over exact sums, with `n` capped at a million ranks:
/// the shape is what matters).
pub fn zipf_exponent(n: u64, hot: f64, share: f64) -> f64 {
    let n = n.clamp(2, 1_000_000);
    let top = ((n as f64 * hot).round() as u64).max(1);
    let share_of = |s: f64| {
        let (mut all, mut head) = (0.0, 0.0);
        for k in 1..=n {
            let p = (k as f64).powf(-s);
            all += p;
            if k <= top {
                head += p;
            }
        }
        head / all
    };
    let (mut lo, mut hi) = (0.0, 4.0);
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        if share_of(mid) < share {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Zipf-distributed keys over `n` ranks (90% of draws on 15% of the ranks).
#[derive(Debug, Clone)]
pub struct ZipfKeys {
    zipf: Zipf<f64>,
    n: u64,
}

impl ZipfKeys {
    /// Keys over `n` ranks.
    pub fn new(n: u64) -> ZipfKeys {
        let s = zipf_exponent(n, 0.15, 0.90);
        ZipfKeys {
            zipf: Zipf::new(n.max(2) as f64, s).expect("a valid Zipf distribution"),
            n: n.max(2),
        }
    }

    /// The next key.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        let rank = (self.zipf.sample(rng) as u64).clamp(1, self.n) - 1;
        scramble(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ninety_percent_of_draws_hit_fifteen_percent_of_keys() {
        let n = 10_000u64;
        let keys = ZipfKeys::new(n);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let hot: std::collections::HashSet<u64> = (0..n * 15 / 100).map(scramble).collect();
        let draws = 100_000;
        let hits = (0..draws)
            .filter(|_| hot.contains(&keys.next(&mut rng)))
            .count();
        let share = hits as f64 / draws as f64;
        assert!((0.87..0.93).contains(&share), "hot share {share}");
    }
}
