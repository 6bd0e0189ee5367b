//! Pipelined ring algorithms: bandwidth-optimal, `n-1` (or `2(n-1)`) hops.
//!
//! The buffer is cut into `n` segments and each segment into `k` chunks; the loops run chunk
//! by chunk through every step of the ring (as NCCL's do), so each rank alternates one send
//! and one receive and a chunk's next hop overlaps the neighbours' work on other chunks.
//! Schedule step (progress, errors): `t * k + c` for chunk `c` at ring step `t`.

use crate::algo::{cut, part, seed, stage, step};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::{Buffer, Reduction};
use crate::run::Run;

/// All-reduce into `mem` (`count > 0` elements, `world > 1`): ring reduce-scatter then ring
/// all-gather. `Avg` divides each segment once, at its owner, before it circulates. With
/// `input`, this rank's contribution is read from there (out of place; `mem` is written
/// before it is read: each chunk is copied in just before its first reduce, while it is
/// in cache), else from `mem` (in place).
pub(crate) async fn all_reduce<D, L>(
    run: &mut Run<'_, D, L>,
    input: Option<&D::Mem>,
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
    let avg = matches!(reduction, Reduction::Avg);
    let phases = 2 * (n - 1);
    let seg_max = count.div_ceil(n);
    let (_, k) = run.schedule(seg_max, phases)?;
    let (left, right) = neighbours(r, n);
    // Byte region of chunk `c` of segment `s`.
    let chunk = |s: usize, c: usize| {
        let (start, len) = part(count, n, s);
        let (cs, cl) = part(len, k, c);
        ((start + cs) * es, cl * es)
    };
    // Segment sent and received at step `t` (reduce-scatter for t < n-1, then all-gather).
    let send_seg = |t: usize| {
        if t < n - 1 {
            (r + n - t) % n
        } else {
            (r + 1 + n - (t - (n - 1))) % n
        }
    };
    let recv_seg = |t: usize| {
        if t < n - 1 {
            (r + 2 * n - t - 1) % n
        } else {
            (r + n - (t - (n - 1))) % n
        }
    };
    for c in 0..k {
        let (off, len) = chunk(send_seg(0), c);
        if len > 0 {
            let own: &D::Mem = input.unwrap_or(&*mem);
            run.send_from(right, step(0, k, c), off, own, off, len)
                .await?;
        }
        for t in 0..phases {
            // The segment received at step t is the one sent at step t+1.
            let (off, len) = chunk(recv_seg(t), c);
            if len == 0 {
                continue;
            }
            if t < n - 1 {
                // Each chunk of the reduce-scatter is received once: the first time `mem`
                // holds it, so the input's copy goes there now, just before the reduce.
                if let Some(input) = input {
                    run.touch();
                    run.copy(mem, off, input, off, len)?;
                }
                // Reduced straight from the link's buffers where it allows: one copy fewer.
                run.recv_reduce_into(left, step(t, k, c), off, mem, off, len, op, true)
                    .await?;
                if t == n - 2 && avg {
                    run.divide(mem, off, len, n as u32)?;
                }
                if t + 1 < phases {
                    run.send_from(right, step(t + 1, k, c), off, mem, off, len)
                        .await?;
                }
            } else {
                // Straight into the output where the link allows: one copy fewer.
                run.touch();
                let p = run
                    .recv_into(left, step(t, k, c), off, mem, off, len)
                    .await?;
                if t + 1 < phases {
                    forward(run, right, step(t + 1, k, c), off, mem, len, p).await?;
                }
            }
        }
    }
    Ok(())
}

/// Reduce-scatter (`count > 0` elements per rank, `world > 1`): one ring pass in which each
/// rank adds its own contribution to the partial sum passing through, staged in a one-chunk
/// scratch buffer so the input is never written (in place, only block `rank` changes).
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
    let premul = reduction.premul();
    let phases = n - 1;
    let (_, k) = run.schedule(count, phases)?;
    let (left, right) = neighbours(r, n);
    let block = count * es;
    // Where this rank's result goes in the output.
    let out_base = if buf.is_in_place() { r * block } else { 0 };
    // Byte region of chunk `c` of block `b`, within the input.
    let chunk = |b: usize, c: usize| {
        let (cs, cl) = part(count, k, c);
        (b * block + cs * es, cl * es)
    };
    seed(run, &mut buf, out_base, r * block, block, premul)?;
    let (_, max_chunk) = part(count, k, 0);
    let mut scratch = run.alloc(max_chunk * es)?;
    for c in 0..k {
        // Step 0: this rank's own contribution to block r-1 starts its way round.
        let (off, len) = chunk((r + n - 1) % n, c);
        if len > 0 {
            let p = match premul {
                None => run.pack(buf.send(), off, len)?,
                Some(_) => {
                    stage(run, &mut scratch, buf.send(), off, len, premul)?;
                    run.pack(&scratch, 0, len)?
                }
            };
            run.send(right, step(0, k, c), off, p).await?;
        }
        for t in 0..phases {
            let b = (r + 2 * n - t - 2) % n;
            let (off, len) = chunk(b, c);
            if len == 0 {
                continue;
            }
            if t == n - 2 {
                // b == r: the partial sum of every other rank meets ours in the output.
                let out_off = out_base + (off - r * block);
                let out = buf.recv();
                run.recv_reduce_into(left, step(t, k, c), off, out, out_off, len, op, true)
                    .await?;
            } else {
                stage(run, &mut scratch, buf.send(), off, len, premul)?;
                run.recv_reduce_into(left, step(t, k, c), off, &mut scratch, 0, len, op, false)
                    .await?;
                run.send_from(right, step(t + 1, k, c), off, &scratch, 0, len)
                    .await?;
            }
        }
    }
    if matches!(reduction, Reduction::Avg) {
        run.divide(buf.recv(), out_base, block, n as u32)?;
    }
    Ok(())
}

/// All-gather in place on `mem` (`world * count` elements, this rank's block already at
/// `rank * count`; `count > 0`, `world > 1`): each block travels `n-1` hops to the right,
/// forwarded without a copy.
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
    let phases = n - 1;
    let (_, k) = run.schedule(count, phases)?;
    let (left, right) = neighbours(r, n);
    let chunk = |b: usize, c: usize| {
        let (cs, cl) = part(count, k, c);
        ((b * count + cs) * es, cl * es)
    };
    for c in 0..k {
        let (off, len) = chunk(r, c);
        if len > 0 {
            run.send_from(right, step(0, k, c), off, mem, off, len)
                .await?;
        }
        for t in 0..phases {
            let (off, len) = chunk((r + 2 * n - t - 1) % n, c);
            if len == 0 {
                continue;
            }
            run.touch();
            let p = run
                .recv_into(left, step(t, k, c), off, mem, off, len)
                .await?;
            if t + 1 < phases {
                forward(run, right, step(t + 1, k, c), off, mem, len, p).await?;
            }
        }
    }
    Ok(())
}

/// Broadcast along a pipelined chain `root → root+1 → …` (`count > 0`, `world > 1`); each
/// rank forwards a chunk as soon as it has it, without copying it again.
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
    let vr = (r + n - root) % n;
    let (prev, next) = neighbours(r, n);
    let (ce, k) = run.schedule(count, 1)?;
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        let (off, len) = (s * es, l * es);
        if vr == 0 {
            run.send_from(next, step(0, k, c), off, mem, off, len)
                .await?;
        } else {
            run.touch();
            let p = run
                .recv_into(prev, step(0, k, c), off, mem, off, len)
                .await?;
            if vr < n - 1 {
                forward(run, next, step(0, k, c), off, mem, len, p).await?;
            }
        }
    }
    Ok(())
}

/// Reduce along a pipelined chain ending at the root (`… → root+1 → root`; `count > 0`,
/// `world > 1`). Non-roots combine in a one-chunk scratch buffer and never write theirs.
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
    let vr = (r + n - root) % n;
    // Data flows from higher virtual ranks to lower: vr+1 → vr → vr-1.
    let (to, from) = neighbours(r, n);
    let (ce, k) = run.schedule(count, 1)?;
    let bytes = count * es;
    if vr == 0 {
        seed(run, &mut buf, 0, 0, bytes, premul)?;
    }
    let mut scratch = if vr == 0 {
        None
    } else {
        Some(run.alloc(ce.min(count) * es)?)
    };
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        let (off, len) = (s * es, l * es);
        match &mut scratch {
            None => {
                run.recv_reduce_into(from, step(0, k, c), off, buf.recv(), off, len, op, true)
                    .await?;
            }
            Some(scratch) => {
                let first = vr == n - 1;
                if first && premul.is_none() {
                    run.send_from(to, step(0, k, c), off, buf.send(), off, len)
                        .await?;
                } else {
                    stage(run, scratch, buf.send(), off, len, premul)?;
                    if !first {
                        run.recv_reduce_into(from, step(0, k, c), off, scratch, 0, len, op, false)
                            .await?;
                    }
                    run.send_from(to, step(0, k, c), off, scratch, 0, len)
                        .await?;
                }
            }
        }
    }
    if vr == 0 && matches!(reduction, Reduction::Avg) {
        run.divide(buf.recv(), 0, bytes, n as u32)?;
    }
    Ok(())
}

/// The ranks to the left (`r - 1`) and to the right (`r + 1`) of `r` on a ring of `n`.
fn neighbours(r: usize, n: usize) -> (u32, u32) {
    (((r + n - 1) % n) as u32, ((r + 1) % n) as u32)
}

/// Sends on the `len` bytes at `off` that [`Run::recv_into`] just landed: the payload it
/// unpacked them from, if there was one (no copy), or the memory itself.
async fn forward<D, L>(
    run: &mut Run<'_, D, L>,
    to: u32,
    step: u32,
    off: usize,
    mem: &D::Mem,
    len: usize,
    landed: Option<D::Payload>,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    match landed {
        Some(p) => run.send(to, step, off, p).await,
        None => run.send_from(to, step, off, mem, off, len).await,
    }
}
