//! Recursive doubling all-reduce: `log2 p` rounds in which partners `newrank ^ 2^i` swap
//! and combine their whole buffers — the fewest latency terms, for small buffers.
//!
//! Non-powers of two fold onto `p` participants ([`crate::algo::fold`]). Phases: fold (0),
//! rounds (1..=log2 p), unfold (log2 p + 1).

use crate::algo::fold::{Fold, fold_in, fold_out, unfold, unfolded};
use crate::algo::{Land, Span, exchange, step};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::Reduction;
use crate::run::Run;

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
    let (ce, k) = run.schedule(count, phases)?;
    let all = Span::at(0, count, es);
    let Some(nr) = fold.newrank(r) else {
        fold_out(run, mem, k, ce, all, true).await?;
        return unfolded(run, mem, phases - 1, k, ce, all, true).await;
    };
    if fold.is_pair(r) {
        fold_in(run, mem, k, ce, all, op, true).await?;
    }
    for i in 0..fold.rounds {
        let partner = fold.real(nr ^ (1 << i));
        if k == 1 {
            // One chunk each way (every small all-reduce): `exchange`'s loop unrolled, the
            // same send, then the same receive, under the same tags and steps, without a
            // future of its own in between (a few hundred instructions of a call whose
            // whole cost is a few thousand).
            let (at, len) = (step(1 + i, k, 0), count * es);
            run.send_from(partner, at, 0, mem, 0, len).await?;
            run.recv_reduce_into(partner, at, 0, mem, 0, len, op, true)
                .await?;
            continue;
        }
        let (out, inn) = (Some(all), Some(all));
        exchange(
            run,
            mem,
            partner,
            1 + i,
            k,
            ce,
            out,
            inn,
            Land::Reduce(op),
            true,
        )
        .await?;
    }
    if matches!(reduction, Reduction::Avg) {
        run.divide(mem, 0, count * es, n as u32)?;
    }
    if fold.is_pair(r) {
        unfold(run, mem, phases - 1, k, ce, all, true).await?;
    }
    Ok(())
}
