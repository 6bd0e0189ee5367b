//! The size sweep every system runs: nccl-tests' `-b MIN -e MAX -f FACTOR -w W -i I`.

use std::fmt;
use std::str::FromStr;

use crate::peer::PeerError;

/// The smallest payload an all-reduce of float32 can carry.
const MIN_BYTES: u64 = 4;
/// Past this a single buffer no longer fits the 2-core, 24 GiB machines comfortably at 4 ranks.
const MAX_BYTES: u64 = 1 << 30;

/// Up to this size a scaled sweep makes [`SMALL_CALLS`] times as many calls. 20 calls of
/// 8 B take about 200 µs, so one scheduling hiccup on a 2-core machine moved a size's
/// figure by 2–4× between rounds; 500 calls put it inside a few per cent, and above 1 MiB
/// 20 calls already take milliseconds.
pub const SMALL_UP_TO: Bytes = Bytes(1 << 20);
/// The factor on the calls (warm-up and timed) of the sizes up to [`SMALL_UP_TO`].
pub const SMALL_CALLS: u32 = 25;

/// A validated sweep: sizes from `min` to `max` (both multiples of 4, `min <= max`), each
/// `factor` times the last, with `warmup` untimed and `iters` timed calls per size, and,
/// when `scaled`, [`SMALL_CALLS`] times as many of both up to [`SMALL_UP_TO`] (as the OSU
/// micro-benchmarks make more calls of small messages than of large ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweep {
    min: Bytes,
    max: Bytes,
    factor: u32,
    warmup: u32,
    iters: u32,
    scaled: bool,
}

impl Sweep {
    /// The default run: 8 B to 128 MiB in ×4 steps, nccl-tests' 5 warm-up and 20 timed
    /// calls, scaled up for the small sizes. (×2 steps take half as long again, most of it at the largest sizes, which
    /// would push three rounds of four systems past 15 minutes on a loaded 2-core machine;
    /// `-f 2` asks for them.)
    pub const FULL: Self = Self {
        min: Bytes(8),
        max: Bytes(128 << 20),
        factor: 4,
        warmup: 5,
        iters: 20,
        scaled: true,
    };

    /// `--quick`: 8 B to 16 MiB in ×8 steps with fewer calls, so that three interleaved
    /// rounds of every system fit in about three minutes on a 2-core machine.
    pub const QUICK: Self = Self {
        min: Bytes(8),
        max: Bytes(16 << 20),
        factor: 8,
        warmup: 2,
        iters: 5,
        scaled: false,
    };

    /// Checks and builds a sweep (not scaled: see [`Sweep::scaled`]).
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
            scaled: false,
        })
    }

    /// This sweep with the small sizes' calls scaled up (`true`) or every size making the
    /// same number of calls, nccl-tests' way (`false`).
    pub fn scaled(self, scaled: bool) -> Self {
        Self { scaled, ..self }
    }

    pub fn is_scaled(&self) -> bool {
        self.scaled
    }

    /// The warm-up and timed calls at `size`.
    pub fn calls(&self, size: Bytes) -> (u32, u32) {
        if self.scaled && size <= SMALL_UP_TO {
            (
                self.warmup.saturating_mul(SMALL_CALLS),
                self.iters.saturating_mul(SMALL_CALLS),
            )
        } else {
            (self.warmup, self.iters)
        }
    }

    /// The unscaled sweeps a program runs, in size order, one after the other: the sizes
    /// that make the same number of calls go together, since every peer's program takes
    /// one `-w`/`-i` for its whole sweep. One for an unscaled sweep.
    pub fn legs(&self) -> Vec<Sweep> {
        let mut legs: Vec<Sweep> = Vec::new();
        for size in self.sizes() {
            let (warmup, iters) = self.calls(size);
            match legs.last_mut() {
                Some(leg) if (leg.warmup, leg.iters) == (warmup, iters) => leg.max = size,
                _ => legs.push(Sweep {
                    min: size,
                    max: size,
                    factor: self.factor,
                    warmup,
                    iters,
                    scaled: false,
                }),
            }
        }
        // The last leg ends where the sweep does, as asked (a max off the ladder included).
        if let Some(last) = legs.last_mut() {
            last.max = self.max;
        }
        legs
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
    fn a_scaled_sweep_runs_its_small_sizes_as_a_leg_of_more_calls() {
        let legs = Sweep::FULL.legs();
        assert_eq!(legs.len(), 2, "{legs:?}");
        let (small, large) = (legs[0], legs[1]);
        assert_eq!((small.min(), small.max()), (Bytes(8), Bytes(512 << 10)));
        assert_eq!((small.warmup(), small.iters()), (125, 500));
        assert_eq!(
            (large.min(), large.max()),
            (Bytes(2 << 20), Bytes(128 << 20))
        );
        assert_eq!((large.warmup(), large.iters()), (5, 20));
        // Together the legs walk exactly the sweep's sizes, each with its own calls.
        let walked: Vec<Bytes> = legs.iter().flat_map(Sweep::sizes).collect();
        assert_eq!(walked, Sweep::FULL.sizes());
        assert!(legs.iter().all(|l| !l.is_scaled() && l.legs() == vec![*l]));
        assert_eq!(Sweep::FULL.calls(Bytes(1 << 20)), (125, 500));
        assert_eq!(Sweep::FULL.calls(Bytes(2 << 20)), (5, 20));
        // All small, all large, or unscaled: one leg, the sweep itself.
        let small_only = Sweep::new(Bytes(8), Bytes(64), 2, 1, 2)
            .unwrap()
            .scaled(true);
        assert_eq!(small_only.legs().len(), 1);
        assert_eq!(small_only.legs()[0].iters(), 2 * SMALL_CALLS);
        assert_eq!(Sweep::QUICK.legs(), vec![Sweep::QUICK]);
        let off_ladder = Sweep::new(Bytes(8), Bytes(100), 4, 0, 1)
            .unwrap()
            .scaled(true);
        assert_eq!(off_ladder.legs()[0].max(), Bytes(100));
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
