//! The fold of a non-power-of-two world onto the largest power of two below it, shared by
//! recursive doubling and recursive halving (MPICH's scheme).
//!
//! With `n = p + rem`, the first `2 rem` ranks pair up: in phase 0 each even one hands its
//! data to its odd neighbour and sits out, and in the schedule's last phase it gets its
//! result back. The odd one stands for both in between.

use crate::algo::{Land, Span, exchange, pow2_floor};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
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

    /// Whether participant rank `r` stands for a folded pair (its neighbour `r - 1` folded
    /// out into it).
    pub(crate) fn is_pair(&self, r: usize) -> bool {
        r < 2 * self.rem
    }
}

/// Phase 0 on a rank that folds out: hand `span` of `mem` to its partner `rank + 1`.
pub(crate) async fn fold_out<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    k: usize,
    ce: usize,
    span: Span,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let partner = run.rank + 1;
    exchange(
        run,
        mem,
        partner,
        0,
        k,
        ce,
        Some(span),
        None,
        Land::Copy,
        output,
    )
    .await
}

/// Phase 0 on a participant that stands for a pair: combine its neighbour's `span` into
/// its own with `op`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn fold_in<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    k: usize,
    ce: usize,
    span: Span,
    op: chorus_protocol::ReduceOp,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let extra = run.rank - 1;
    let land = Land::Reduce(op);
    exchange(run, mem, extra, 0, k, ce, None, Some(span), land, output).await
}

/// The last phase, `last`, on a participant that stands for a pair: send `span` of `mem`,
/// its neighbour's result, back to it.
pub(crate) async fn unfold<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    last: usize,
    k: usize,
    ce: usize,
    span: Span,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let extra = run.rank - 1;
    exchange(
        run,
        mem,
        extra,
        last,
        k,
        ce,
        Some(span),
        None,
        Land::Copy,
        output,
    )
    .await
}

/// The last phase, `last`, on a rank that folded out: receive its result from its partner
/// `rank + 1` into `span` of `mem`.
pub(crate) async fn unfolded<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    last: usize,
    k: usize,
    ce: usize,
    span: Span,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let partner = run.rank + 1;
    exchange(
        run,
        mem,
        partner,
        last,
        k,
        ce,
        None,
        Some(span),
        Land::Copy,
        output,
    )
    .await
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
                assert_eq!(f.is_pair(r), j < f.rem);
                assert!(!seen[r]);
                seen[r] = true;
            }
            assert_eq!(seen.iter().filter(|s| !**s).count(), f.rem);
        }
    }
}
