//! Bruck all-gather: `ceil(log2 n)` rounds for any `n`. In a scratch buffer rotated so that
//! this rank's block comes first, round `i` sends the first `min(2^i, n - 2^i)` blocks to
//! rank `r - 2^i` and appends as many from rank `r + 2^i`; a final rotation puts every block
//! in place. Tag offsets are relative to the blocks sent (both ends agree on them).

use crate::algo::{Land, Span, exchange};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::run::Run;

/// All-gather into `mem` (`world * count` elements, this rank's block already at
/// `rank * count`; `count > 0`, `world > 1`).
pub(crate) async fn all_gather<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    count: usize,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let es = run.es();
    let block = count * es;
    let rounds = (usize::BITS - (n - 1).leading_zeros()) as usize;
    let max = count * n.div_ceil(2);
    let (ce, k) = run.schedule(max, rounds)?;
    let mut work = run.alloc(n * block)?;
    run.copy(&mut work, 0, mem, r * block, block)?;
    for i in 0..rounds {
        let dist = 1 << i;
        let blocks = dist.min(n - dist);
        let to = ((r + n - dist) % n) as u32;
        let from = ((r + dist) % n) as u32;
        let len = blocks * count;
        let out = Span {
            start: 0,
            len,
            tag_base: 0,
        };
        let inn = Span {
            start: dist * count,
            len,
            tag_base: 0,
        };
        if to == from {
            exchange(
                run,
                &mut work,
                to,
                i,
                k,
                ce,
                Some(out),
                Some(inn),
                Land::Copy,
                false,
            )
            .await?;
        } else {
            // Different peers: interleave by chunk across the two links.
            exchange_two(run, &mut work, to, from, i, k, ce, out, inn).await?;
        }
    }
    run.touch();
    // work[i] holds the block of rank r + i: rotate into place.
    let tail = n - r;
    run.copy(mem, r * block, &work, 0, tail * block)?;
    run.copy(mem, 0, &work, tail * block, r * block)?;
    Ok(())
}

/// Send `out` to `to` and receive `inn` from `from`, one chunk each in turn.
#[allow(clippy::too_many_arguments)]
async fn exchange_two<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    to: u32,
    from: u32,
    phase: usize,
    k: usize,
    ce: usize,
    out: Span,
    inn: Span,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    use crate::algo::{cut, step};
    let es = run.es();
    let chunks = out.len.div_ceil(ce);
    for c in 0..chunks {
        let (s, l) = cut(out.len, ce, c);
        run.send_from(
            to,
            step(phase, k, c),
            out.tag_base + s * es,
            mem,
            (out.start + s) * es,
            l * es,
        )
        .await?;
        let q = run
            .recv(from, step(phase, k, c), inn.tag_base + s * es, l * es)
            .await?;
        run.unpack(mem, (inn.start + s) * es, &q)?;
    }
    Ok(())
}
