//! Recursive doubling all-reduce: `log2 p` rounds in which partners `newrank ^ 2^i` swap
//! and combine their whole buffers — the fewest latency terms, for small buffers.
//!
//! Non-powers of two (`n = p + rem`, `p` the largest power of two below `n`): the first
//! `2 rem` ranks pair up, each even one folds its buffer into its odd neighbour and sits
//! out, and gets the result back at the end (MPICH's scheme). Phases: fold (0), rounds
//! (1..=log2 p), unfold (log2 p + 1).

use crate::algo::{Land, Span, exchange, pow2_floor};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::Reduction;
use crate::run::Run;

/// The fold of a non-power-of-two world onto `p` participants.
pub(crate) struct Fold {
    pub(crate) p: usize,
    pub(crate) rem: usize,
    pub(crate) rounds: usize,
}

impl Fold {
    pub(crate) fn new(n: usize) -> Self {
        let p = pow2_floor(n);
        Fold {
            p,
            rem: n - p,
            rounds: p.trailing_zeros() as usize,
        }
    }

    /// This rank's participant number, or `None` for a rank that folds out.
    pub(crate) fn newrank(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }

    /// The rank of participant `j`.
    pub(crate) fn real(&self, j: usize) -> u32 {
        (if j < self.rem {
            2 * j + 1
        } else {
            j + self.rem
        }) as u32
    }
}

/// All-reduce in place on `mem` (`count > 0`, `world > 1`).
pub(crate) async fn all_reduce<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    count: usize,
    reduction: Reduction,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let es = run.es();
    let op = reduction.combine();
    let fold = Fold::new(n);
    let phases = fold.rounds + 2;
    let ce = run.chunk_elems(count, phases)?;
    let k = count.div_ceil(ce);
    run.plan(phases * k);
    let all = Some(Span::at(0, count, es));
    let Some(nr) = fold.newrank(r) else {
        let partner = (r + 1) as u32;
        exchange(run, mem, partner, 0, k, ce, all, None, Land::Copy, true).await?;
        return exchange(
            run,
            mem,
            partner,
            phases - 1,
            k,
            ce,
            None,
            all,
            Land::Copy,
            true,
        )
        .await;
    };
    if r < 2 * fold.rem {
        let extra = (r - 1) as u32;
        exchange(run, mem, extra, 0, k, ce, None, all, Land::Reduce(op), true).await?;
    }
    for i in 0..fold.rounds {
        let partner = fold.real(nr ^ (1 << i));
        exchange(
            run,
            mem,
            partner,
            1 + i,
            k,
            ce,
            all,
            all,
            Land::Reduce(op),
            true,
        )
        .await?;
    }
    if matches!(reduction, Reduction::Avg) {
        run.divide(mem, 0, count * es, n as u32)?;
    }
    if r < 2 * fold.rem {
        let extra = (r - 1) as u32;
        exchange(
            run,
            mem,
            extra,
            phases - 1,
            k,
            ce,
            all,
            None,
            Land::Copy,
            true,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Fold;

    #[test]
    fn fold_maps_participants_onto_distinct_ranks() {
        for n in 1..40 {
            let f = Fold::new(n);
            let mut seen = vec![false; n];
            for j in 0..f.p {
                let r = f.real(j) as usize;
                assert_eq!(f.newrank(r), Some(j));
                assert!(!seen[r]);
                seen[r] = true;
            }
            assert_eq!(seen.iter().filter(|s| !**s).count(), f.rem);
        }
    }
}
