//! Binomial trees for broadcast and reduce: `ceil(log2 n)` rounds, chunk-pipelined so a
//! large buffer streams down (or up) the tree.
//!
//! Ranks are renumbered relative to the root (`vr = (rank - root) mod n`); the parent of
//! `vr` is `vr` without its lowest set bit, its children `vr + 2^j` for `2^j` below that
//! bit. Schedule step: the chunk index.

use crate::algo::{cut, seed, stage, step};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::{Buffer, Reduction};
use crate::run::Run;

/// `(parent, children)` of virtual rank `vr` in a binomial tree of `n`, children nearest
/// first, as virtual ranks.
fn family(vr: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let low = if vr == 0 {
        n.next_power_of_two()
    } else {
        1 << vr.trailing_zeros()
    };
    let parent = (vr != 0).then(|| vr - low);
    let mut children = Vec::new();
    let mut mask = 1;
    while mask < low {
        if vr + mask < n {
            children.push(vr + mask);
        }
        mask <<= 1;
    }
    (parent, children)
}

/// Broadcast on `mem` (`count > 0`, `world > 1`).
pub(crate) async fn broadcast<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    count: usize,
    root: usize,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let es = run.es();
    let real = |v: usize| ((v + root) % n) as u32;
    let (parent, children) = family((r + n - root) % n, n);
    let (ce, k) = run.schedule(count, 1)?;
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        let (off, len) = (s * es, l * es);
        let mut received = match parent {
            Some(p) => {
                let payload = run.recv(real(p), step(0, k, c), off, len).await?;
                run.touch();
                run.unpack(mem, off, &payload)?;
                Some(payload)
            }
            None => None,
        };
        // Farthest child first: it heads the largest subtree. The nearest child, last,
        // gets the received payload itself instead of a copy.
        for (i, &child) in children.iter().enumerate().rev() {
            let payload = match (i, received.take()) {
                (0, Some(p)) => p,
                (_, keep) => {
                    received = keep;
                    run.pack(mem, off, len)?
                }
            };
            run.send(real(child), step(0, k, c), off, payload).await?;
        }
    }
    Ok(())
}

/// Reduce to the root (`count > 0`, `world > 1`). Non-roots combine in a one-chunk scratch
/// buffer and never write theirs.
pub(crate) async fn reduce<D, L>(
    run: &mut Run<'_, D, L>,
    mut buf: Buffer<'_, D::Mem>,
    count: usize,
    reduction: Reduction,
    root: usize,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let es = run.es();
    let op = reduction.combine();
    let premul = reduction.premul();
    let real = |v: usize| ((v + root) % n) as u32;
    let (parent, children) = family((r + n - root) % n, n);
    let (ce, k) = run.schedule(count, 1)?;
    let bytes = count * es;
    let mut scratch = match parent {
        None => {
            seed(run, &mut buf, 0, 0, bytes, premul)?;
            None
        }
        Some(_) => Some(run.alloc(ce.min(count) * es)?),
    };
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        let (off, len) = (s * es, l * es);
        match (&mut scratch, parent) {
            (Some(scratch), Some(p)) => {
                let payload = if children.is_empty() && premul.is_none() {
                    run.pack(buf.send(), off, len)?
                } else {
                    stage(run, scratch, buf.send(), off, len, premul)?;
                    for &child in &children {
                        let q = run.recv(real(child), step(0, k, c), off, len).await?;
                        run.unpack_reduce(scratch, 0, &q, op)?;
                    }
                    run.pack(scratch, 0, len)?
                };
                run.send(real(p), step(0, k, c), off, payload).await?;
            }
            _ => {
                for &child in &children {
                    let q = run.recv(real(child), step(0, k, c), off, len).await?;
                    run.touch();
                    run.unpack_reduce(buf.recv(), off, &q, op)?;
                }
            }
        }
    }
    if parent.is_none() && matches!(reduction, Reduction::Avg) {
        run.divide(buf.recv(), 0, bytes, n as u32)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::family;

    #[test]
    fn every_rank_has_one_parent_that_lists_it() {
        for n in 1..40 {
            for v in 1..n {
                let (p, _) = family(v, n);
                let p = p.unwrap();
                assert!(family(p, n).1.contains(&v), "n={n} v={v}");
            }
            let total: usize = (0..n).map(|v| family(v, n).1.len()).sum();
            assert_eq!(total, n - 1);
        }
    }
}
