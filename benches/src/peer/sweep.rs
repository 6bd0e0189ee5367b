//! The size sweep every system runs: nccl-tests' `-b MIN -e MAX -f FACTOR -w W -i I`.

use std::fmt;
use std::str::FromStr;

use crate::peer::PeerError;

/// The smallest payload an all-reduce of float32 can carry.
const MIN_BYTES: u64 = 4;
/// Past this a single buffer no longer fits the 2-core, 24 GiB machines comfortably at 4 ranks.
const MAX_BYTES: u64 = 1 << 30;

/// A validated sweep: sizes from `min` to `max` (both multiples of 4, `min <= max`), each
/// `factor` times the last, with `warmup` untimed and `iters` timed calls per size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweep {
    min: Bytes,
    max: Bytes,
    factor: u32,
    warmup: u32,
    iters: u32,
}

impl Sweep {
    /// The default run: 8 B to 128 MiB in ×4 steps, nccl-tests' 5 warm-up and 20 timed
    /// calls. (×2 steps take half as long again, most of it at the largest sizes, which
    /// would push three rounds of four systems past 15 minutes on a loaded 2-core machine;
    /// `-f 2` asks for them.)
    pub const FULL: Self = Self {
        min: Bytes(8),
        max: Bytes(128 << 20),
        factor: 4,
        warmup: 5,
        iters: 20,
    };

    /// `--quick`: 8 B to 16 MiB in ×8 steps with fewer calls, so that three interleaved
    /// rounds of every system fit in about three minutes on a 2-core machine.
    pub const QUICK: Self = Self {
        min: Bytes(8),
        max: Bytes(16 << 20),
        factor: 8,
        warmup: 2,
        iters: 5,
    };

    /// Checks and builds a sweep.
    pub fn new(
        min: Bytes,
        max: Bytes,
        factor: u32,
        warmup: u32,
        iters: u32,
    ) -> Result<Self, PeerError> {
        let bad = |why: &str| Err(PeerError::BadSweep(why.to_owned()));
        if min.0 < MIN_BYTES || !min.0.is_multiple_of(4) || !max.0.is_multiple_of(4) {
            return bad("sizes must be multiples of 4 bytes, at least 4");
        }
        if max.0 < min.0 || max.0 > MAX_BYTES {
            return bad("need min <= max <= 1 GiB");
        }
        if factor < 2 {
            return bad("factor must be at least 2");
        }
        if iters == 0 {
            return bad("iters must be at least 1");
        }
        Ok(Self {
            min,
            max,
            factor,
            warmup,
            iters,
        })
    }

    pub fn min(&self) -> Bytes {
        self.min
    }

    pub fn max(&self) -> Bytes {
        self.max
    }

    pub fn factor(&self) -> u32 {
        self.factor
    }

    pub fn warmup(&self) -> u32 {
        self.warmup
    }

    pub fn iters(&self) -> u32 {
        self.iters
    }

    /// The sizes in order, as the peers' programs and `chorus bench` walk them.
    pub fn sizes(&self) -> Vec<Bytes> {
        let mut sizes = Vec::new();
        let mut size = self.min.0;
        while size <= self.max.0 {
            sizes.push(Bytes(size));
            size = match size.checked_mul(u64::from(self.factor)) {
                Some(next) => next,
                None => break,
            };
        }
        sizes
    }
}

/// A byte count, printed and parsed the nccl-tests way (`8`, `64K`, `128M`, `1G`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    /// The argument form the peers' programs and `chorus bench` take: exact, with the
    /// largest binary suffix that divides the count.
    pub fn arg(self) -> String {
        for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return format!("{}{suffix}", self.0 >> shift);
            }
        }
        self.0.to_string()
    }
}

impl fmt::Display for Bytes {
    /// Table form: `8 B`, `64 KiB`, `128 MiB` (exact, as [`Bytes::arg`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, suffix) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{} {suffix}", self.0 >> shift);
            }
        }
        write!(f, "{} B", self.0)
    }
}

impl FromStr for Bytes {
    type Err = PeerError;

    fn from_str(text: &str) -> Result<Self, PeerError> {
        let bad = || PeerError::BadSweep(format!("bad size {text:?} (want e.g. 8, 64K, 128M)"));
        let (digits, shift) = match text.as_bytes().last() {
            Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
            Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
            Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
            _ => (text, 0),
        };
        let value: u64 = digits.parse().map_err(|_| bad())?;
        value.checked_mul(1 << shift).map(Bytes).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_sweep_runs_8_bytes_to_128_mib_in_steps_of_4() {
        let sizes = Sweep::FULL.sizes();
        assert_eq!(sizes.first(), Some(&Bytes(8)));
        assert_eq!(sizes.last(), Some(&Bytes(128 << 20)));
        assert_eq!(sizes.len(), 13);
    }

    #[test]
    fn quick_sweep_spans_latency_to_past_the_last_level_cache() {
        let sizes = Sweep::QUICK.sizes();
        assert_eq!(sizes.first(), Some(&Bytes(8)));
        assert_eq!(sizes.last(), Some(&Bytes(16 << 20)));
        assert_eq!(sizes.len(), 8);
    }

    #[test]
    fn a_max_off_the_ladder_stops_below_it() {
        let sweep = Sweep::new(Bytes(8), Bytes(100), 4, 0, 1).unwrap();
        assert_eq!(sweep.sizes(), vec![Bytes(8), Bytes(32)]);
    }

    #[test]
    fn bad_sweeps_are_refused_with_a_reason() {
        assert!(Sweep::new(Bytes(2), Bytes(8), 2, 1, 1).is_err());
        assert!(Sweep::new(Bytes(6), Bytes(8), 2, 1, 1).is_err());
        assert!(Sweep::new(Bytes(64), Bytes(8), 2, 1, 1).is_err());
        assert!(Sweep::new(Bytes(8), Bytes(2 << 30), 2, 1, 1).is_err());
        assert!(Sweep::new(Bytes(8), Bytes(64), 1, 1, 1).is_err());
        let err = Sweep::new(Bytes(8), Bytes(64), 2, 1, 0).unwrap_err();
        assert!(err.to_string().contains("iters"), "{err}");
    }

    #[test]
    fn sizes_parse_and_print_the_nccl_tests_way() {
        for (text, bytes) in [
            ("8", 8),
            ("64K", 64 << 10),
            ("128M", 128 << 20),
            ("1G", 1 << 30),
            ("3k", 3 << 10),
        ] {
            let parsed: Bytes = text.parse().unwrap();
            assert_eq!(parsed, Bytes(bytes));
        }
        assert_eq!(Bytes(128 << 20).arg(), "128M");
        assert_eq!(Bytes(1536).arg(), "1536");
        assert_eq!(Bytes(8).to_string(), "8 B");
        assert_eq!(Bytes(64 << 10).to_string(), "64 KiB");
        for bad in ["", "M", "12Q", "-1", "99999999999999999999G"] {
            assert!(bad.parse::<Bytes>().is_err(), "{bad:?} parsed");
        }
    }
}
