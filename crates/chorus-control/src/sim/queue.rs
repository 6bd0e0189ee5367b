//! The simulator's event queue: a timing wheel of 100 µs buckets over a 6.5 s horizon, with
//! a heap for the current bucket and another for events beyond the horizon.
//!
//! It pops in exactly the order of one global heap keyed by (time, insertion sequence), so
//! runs stay deterministic, but it keeps the hot heap small: at 100 000 ranks a single heap
//! of a million pending events spends most of its time in cache misses.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Instant;

const BUCKET_MICROS: u64 = 100;
const BUCKETS: usize = 1 << 16;

type Entry = Reverse<(Instant, u64, u32)>;

pub(crate) struct Queue {
    /// Index of the bucket being drained.
    bucket: u64,
    current: BinaryHeap<Entry>,
    wheel: Vec<Vec<(Instant, u64, u32)>>,
    overflow: BinaryHeap<Entry>,
    len: usize,
    in_wheel: usize,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        Queue {
            bucket: 0,
            current: BinaryHeap::new(),
            wheel: (0..BUCKETS).map(|_| Vec::new()).collect(),
            overflow: BinaryHeap::new(),
            len: 0,
            in_wheel: 0,
        }
    }

    /// Queues `item` at `at` with tie-breaking sequence `seq` (callers pass increasing
    /// sequences).
    pub(crate) fn push(&mut self, at: Instant, seq: u64, item: u32) {
        self.len += 1;
        let b = at.as_micros() / BUCKET_MICROS;
        if b <= self.bucket {
            self.current.push(Reverse((at, seq, item)));
        } else if b < self.bucket + BUCKETS as u64 {
            self.in_wheel += 1;
            self.wheel[(b % BUCKETS as u64) as usize].push((at, seq, item));
        } else {
            self.overflow.push(Reverse((at, seq, item)));
        }
    }

    /// The earliest item, with its time.
    pub(crate) fn pop(&mut self) -> Option<(Instant, u32)> {
        loop {
            if let Some(Reverse((at, _, item))) = self.current.pop() {
                self.len -= 1;
                return Some((at, item));
            }
            if self.len == 0 {
                return None;
            }
            self.bucket += 1;
            let slot = &mut self.wheel[(self.bucket % BUCKETS as u64) as usize];
            if !slot.is_empty() {
                let items = std::mem::take(slot);
                self.in_wheel -= items.len();
                self.current = items.into_iter().map(Reverse).collect();
            }
            while let Some(Reverse((at, _, _))) = self.overflow.peek() {
                if at.as_micros() / BUCKET_MICROS > self.bucket {
                    break;
                }
                if let Some(e) = self.overflow.pop() {
                    self.current.push(e);
                }
            }
            if self.current.is_empty()
                && self.in_wheel == 0
                && let Some(Reverse((at, _, _))) = self.overflow.peek()
            {
                // Nothing within the horizon: jump to the next far event's bucket.
                self.bucket = at.as_micros() / BUCKET_MICROS - 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::rng::Rng;

    #[test]
    fn pops_in_global_time_then_sequence_order() {
        let mut q = Queue::new();
        let mut reference = BinaryHeap::new();
        let mut rng = Rng::new(3);
        let mut seq = 0;
        let mut now = 0u64;
        for round in 0..20_000u32 {
            // Mix near, same-bucket, far-beyond-horizon and same-instant pushes.
            for _ in 0..rng.range(0, 3) {
                let delta = match rng.below(4) {
                    0 => rng.below(BUCKET_MICROS),
                    1 => rng.below(5_000_000),
                    2 => rng.below(20_000_000),
                    _ => 0,
                };
                seq += 1;
                q.push(Instant::from_micros(now + delta), seq, round);
                reference.push(Reverse((Instant::from_micros(now + delta), seq, round)));
            }
            if rng.chance(0.6)
                && let Some(Reverse((at, _, item))) = reference.pop()
            {
                assert_eq!(q.pop(), Some((at, item)));
                now = at.as_micros();
            }
        }
        while let Some(Reverse((at, _, item))) = reference.pop() {
            assert_eq!(q.pop(), Some((at, item)));
        }
        assert_eq!(q.pop(), None);
    }
}
