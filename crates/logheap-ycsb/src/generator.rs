//! YCSB's number generators and key and record formats, ported from the YCSB core
//! (`site.ycsb.generator`, `CoreWorkload`, `Utils`): the same algorithms and constants,
//! so the key popularity here is YCSB's.

use rand::Rng;

/// YCSB's Zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// The item count YCSB's scrambled Zipfian draws from before hashing.
const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// ζ(10¹⁰, 0.99), precomputed by YCSB (`ScrambledZipfianGenerator.ZETAN`).
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `value`, low byte first, made
/// non-negative as Java's `Math.abs` does.
pub fn fnvhash64(mut value: u64) -> u64 {
    let mut hash: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        hash ^= value & 0xff;
        hash = hash.wrapping_mul(1_099_511_628_211);
        value >>= 8;
    }
    (hash as i64).wrapping_abs() as u64
}

/// The key of record `n` in YCSB's hashed insert order: `"user"` and the record
/// number's hash in decimal.
pub fn key_of(n: u64) -> Vec<u8> {
    format!("user{}", fnvhash64(n)).into_bytes()
}

/// ζ(n, θ) summed over `from..n` items, added to `base`.
fn zeta(from: u64, n: u64, theta: f64, base: f64) -> f64 {
    (from..n).fold(base, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
/// databases"): item `i` of `items` with probability ∝ 1/(i+1)^θ; item 0 is the most
/// popular. Its item count may grow (the skewed-latest generator grows it), with ζ
/// extended incrementally as YCSB does.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// Over `items` items with constant `theta`.
    pub fn new(items: u64, theta: f64) -> Zipfian {
        Zipfian::with_zetan(items, theta, zeta(0, items, theta, 0.0))
    }

    fn with_zetan(items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2,
            zetan,
            eta: 0.0,
        };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// Grows the item count to `items` (never shrinks it).
    pub fn grow(&mut self, items: u64) {
        if items > self.items {
            self.zetan = zeta(self.items, items, self.theta, self.zetan);
            self.items = items;
            self.eta = self.eta_for(items);
        }
    }

    /// The next item, in `0..items`.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let x = self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha);
        (x as u64).min(self.items - 1)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: Zipfian popularity over 10¹⁰ items, hashed onto
/// `min..min + items`, so the popular keys are spread over the key space.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: u64,
    items: u64,
    zipfian: Zipfian,
}

impl ScrambledZipfian {
    /// Over `min..max` (YCSB's bounds; `max` excluded).
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            items: (max - min).max(1),
            zipfian: Zipfian::with_zetan(SCRAMBLED_ITEMS, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// The next item.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        self.min + fnvhash64(self.zipfian.next(rng)) % self.items
    }
}

/// YCSB's `SkewedLatestGenerator`: the most recently inserted records most popular,
/// with Zipfian decay behind them.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// Over the `items` records inserted so far.
    pub fn new(items: u64) -> SkewedLatest {
        SkewedLatest {
            zipfian: Zipfian::new(items.max(1), ZIPFIAN_CONSTANT),
        }
    }

    /// The next record, given that `latest + 1` records exist.
    pub fn next(&mut self, latest: u64, rng: &mut impl Rng) -> u64 {
        let items = latest + 1;
        self.zipfian.grow(items);
        // Draw over the current count (the grown ζ covers at least it).
        let back = self.zipfian.next(rng) % items;
        latest - back
    }
}

/// The record size: YCSB's 10 fields of 100 bytes by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RecordShape {
    /// Fields per record.
    pub fields: usize,
    /// Bytes per field.
    pub field_len: usize,
}

impl RecordShape {
    /// Bytes of a record's value (its fields one after the other).
    pub fn value_len(&self) -> usize {
        self.fields * self.field_len
    }

    /// A fresh record value: random printable bytes, as YCSB's fields are.
    pub fn fill(&self, rng: &mut impl Rng, out: &mut Vec<u8>) {
        out.clear();
        out.resize(self.value_len(), 0);
        fill_printable(rng, out);
    }
}

/// Fills `out` with random printable ASCII (`' '..='~'`), as YCSB's field values are.
pub fn fill_printable(rng: &mut impl Rng, out: &mut [u8]) {
    rng.fill_bytes(out);
    for b in out.iter_mut() {
        *b = b' ' + *b % 95;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn fnvhash_matches_ycsb() {
        // Worked independently (a few lines of Python following the Java: 64-bit
        // wrap-around, then the absolute value of the signed result).
        assert_eq!(fnvhash64(0), 0x5738_07cd_d7e5_c63b);
        assert_eq!(fnvhash64(1), 0x7632_ced6_e2d5_105c);
        assert_eq!(key_of(12345), b"user1792800413050876852");
    }

    #[test]
    fn the_precomputed_zeta_is_zeta_of_ten_billion() {
        // Growing ζ in two steps is summing it at once.
        let z = zeta(0, 1000, ZIPFIAN_CONSTANT, 0.0);
        let grown = zeta(
            500,
            1000,
            ZIPFIAN_CONSTANT,
            zeta(0, 500, ZIPFIAN_CONSTANT, 0.0),
        );
        assert!((z - grown).abs() < 1e-9);
        // ζ(10¹⁰, 0.99): the first 10⁶ terms summed, the rest by Euler-Maclaurin (the
        // integral of x^-θ plus the end-point correction; what is left is far below the
        // bound from 10⁶ on).
        let (m, n, theta) = (1e6f64, SCRAMBLED_ITEMS as f64, ZIPFIAN_CONSTANT);
        let head = zeta(0, m as u64, theta, 0.0);
        let tail = (n.powf(1.0 - theta) - m.powf(1.0 - theta)) / (1.0 - theta)
            + (n.powf(-theta) - m.powf(-theta)) / 2.0;
        assert!(
            (head + tail - SCRAMBLED_ZETAN).abs() < 1e-6,
            "{}",
            head + tail
        );
    }

    #[test]
    fn zipfian_favours_the_first_items() {
        let z = Zipfian::new(1000, ZIPFIAN_CONSTANT);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.next(&mut rng) as usize] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        // Item 0 takes about 1/ζ(1000) ≈ 13% of draws.
        assert!((10_000..17_000).contains(&counts[0]), "{}", counts[0]);
    }

    #[test]
    fn scrambled_zipfian_stays_in_bounds_and_is_skewed() {
        let z = ScrambledZipfian::new(100, 1100);
        let mut rng = SmallRng::seed_from_u64(2);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            let x = z.next(&mut rng);
            assert!((100..1100).contains(&x));
            counts[(x - 100) as usize] += 1;
        }
        counts.sort_unstable();
        // The hottest key is far above the uniform share (100).
        assert!(counts[999] > 1000, "{}", counts[999]);
    }

    #[test]
    fn skewed_latest_prefers_the_newest_records() {
        let mut z = SkewedLatest::new(1000);
        let mut rng = SmallRng::seed_from_u64(3);
        let (mut newest, mut oldest_half) = (0, 0);
        for _ in 0..10_000 {
            let x = z.next(999, &mut rng);
            assert!(x <= 999);
            newest += (x == 999) as u32;
            oldest_half += (x < 500) as u32;
        }
        assert!(newest > oldest_half / 2, "{newest} {oldest_half}");
        // It follows the insert count as it grows.
        assert!(z.next(5000, &mut rng) <= 5000);
    }
}
