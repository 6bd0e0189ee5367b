//! Recursive halving (reduce-scatter) and doubling (all-gather): Rabenseifner's all-reduce,
//! and recursive-halving reduce-scatter. `log2 p` rounds each way, each moving half the data
//! of the previous one, so the volume matches the ring's with logarithmic latency.
//!
//! Non-powers of two fold onto `p` participants ([`crate::algo::fold`]). Participant `j` owns
//! element range `ranges[j]`; the ranges are contiguous in participant order, so the half of
//! a window of participants is one span. Phases: fold (0), halving rounds (1..=log2 p),
//! doubling rounds, unfold (last).

use crate::algo::fold::{Fold, fold_in, fold_out, unfold, unfolded};
use crate::algo::{Land, Span, exchange, part};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::{Buffer, Reduction};
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
    let phases = 2 * fold.rounds + 2;
    let (ce, k) = run.schedule(count, phases)?;
    let all = Span::at(0, count, es);
    let Some(nr) = fold.newrank(r) else {
        fold_out(run, mem, k, ce, all, true).await?;
        return unfolded(run, mem, phases - 1, k, ce, all, true).await;
    };
    if fold.is_pair(r) {
        fold_in(run, mem, k, ce, all, op, true).await?;
    }
    let ranges: Vec<(usize, usize)> = (0..fold.p).map(|j| part(count, fold.p, j)).collect();
    halve(run, mem, &fold, nr, &ranges, k, ce, op, true).await?;
    if matches!(reduction, Reduction::Avg) {
        let (s, l) = ranges[nr];
        run.divide(mem, s * es, l * es, n as u32)?;
    }
    // Doubling: swap what each half of a growing window holds.
    for i in 0..fold.rounds {
        let d = 1 << i;
        let mine = nr & !(d - 1);
        let theirs = mine ^ d;
        let partner = fold.real(nr ^ d);
        let out = Some(span(&ranges, mine, mine + d, es));
        let inn = Some(span(&ranges, theirs, theirs + d, es));
        let phase = 1 + fold.rounds + i;
        exchange(run, mem, partner, phase, k, ce, out, inn, Land::Copy, true).await?;
    }
    if fold.is_pair(r) {
        unfold(run, mem, phases - 1, k, ce, all, true).await?;
    }
    Ok(())
}

/// Reduce-scatter by recursive halving (`count > 0` per rank, `world > 1`), for small
/// buffers: the input is copied into a scratch buffer (pre-multiplied there), halved down to
/// each participant's blocks, and this rank's block copied out. A participant that stands
/// for a folded pair owns both blocks and returns the even one.
pub(crate) async fn reduce_scatter<D, L>(
    run: &mut Run<'_, D, L>,
    mut buf: Buffer<'_, D::Mem>,
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
    let total = count * n;
    let (ce, k) = run.schedule(total, phases)?;
    let block = count * es;
    let out_base = if buf.is_in_place() { r * block } else { 0 };
    let avg = matches!(reduction, Reduction::Avg);
    let mut work = run.alloc(total * es)?;
    run.copy(&mut work, 0, buf.send(), 0, total * es)?;
    if let Some(s) = reduction.premul() {
        run.scale(&mut work, 0, total * es, s)?;
    }
    let all = Span::at(0, total, es);
    let Some(nr) = fold.newrank(r) else {
        fold_out(run, &mut work, k, ce, all, false).await?;
        // The unfold brings back this rank's block, reduced, straight into the output: the
        // same chunking and tags as the partner's span of the scratch layout, landing at
        // `out_base`.
        let own = Span {
            start: out_base / es,
            len: count,
            tag_base: r * block,
        };
        run.touch();
        return unfolded(run, buf.recv(), phases - 1, k, ce, own, true).await;
    };
    if fold.is_pair(r) {
        fold_in(run, &mut work, k, ce, all, op, false).await?;
    }
    let ranges: Vec<(usize, usize)> = (0..fold.p)
        .map(|j| {
            if j < fold.rem {
                (2 * j * count, 2 * count)
            } else {
                ((j + fold.rem) * count, count)
            }
        })
        .collect();
    halve(run, &mut work, &fold, nr, &ranges, k, ce, op, false).await?;
    if fold.is_pair(r) {
        let even = r - 1;
        if avg {
            run.divide(&mut work, even * block, block, n as u32)?;
        }
        let give = Span::at(even * count, count, es);
        unfold(run, &mut work, phases - 1, k, ce, give, false).await?;
    }
    if avg {
        run.divide(&mut work, r * block, block, n as u32)?;
    }
    run.touch();
    run.copy(buf.recv(), out_base, &work, r * block, block)
}

/// The halving rounds: in each, the window of participants holding the same partial sums
/// splits in two, and each side keeps (and reduces) its half's span.
#[allow(clippy::too_many_arguments)]
async fn halve<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    fold: &Fold,
    nr: usize,
    ranges: &[(usize, usize)],
    k: usize,
    ce: usize,
    op: chorus_protocol::ReduceOp,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let es = run.es();
    for i in 0..fold.rounds {
        let d = fold.p >> (i + 1);
        let base = nr & !(2 * d - 1);
        let (keep, give, partner) = if nr < base + d {
            (base, base + d, nr + d)
        } else {
            (base + d, base, nr - d)
        };
        let out = Some(span(ranges, give, give + d, es));
        let inn = Some(span(ranges, keep, keep + d, es));
        let partner = fold.real(partner);
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
            output,
        )
        .await?;
    }
    Ok(())
}

/// The span covering participants `a..b`.
fn span(ranges: &[(usize, usize)], a: usize, b: usize, es: usize) -> Span {
    let start = ranges[a].0;
    let (last, len) = ranges[b - 1];
    Span::at(start, last + len - start, es)
}
