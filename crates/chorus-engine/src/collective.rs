//! Each collective's entry: argument checks, in-place and out-of-place staging, the
//! pre-multiplication of `PreMulSum`, and dispatch to the chosen algorithm in [`crate::algo`].

use chorus_protocol::Collective;

use crate::algo::{bruck, direct, dissemination, doubling, halving, linear, pairwise, ring, tree};
use crate::config::Algorithm;
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::{Buffer, Op};
use crate::run::Run;

/// The size [`crate::config::Thresholds`] compares: the per-rank buffer for all-reduce,
/// broadcast, reduce and point-to-point, the `world`-block buffer for the others.
pub(crate) fn measure<M: ?Sized>(op: &Op<'_, M>, world: u32) -> usize {
    let bytes = op.count().saturating_mul(op.dtype().size());
    match op.collective() {
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => bytes.saturating_mul(world as usize),
        _ => bytes,
    }
}

pub(crate) async fn execute<D, L>(
    run: &mut Run<'_, D, L>,
    algo: Algorithm,
    op: Op<'_, D::Mem>,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let es = run.es();
    let bytes_of = |run: &Run<'_, D, L>, elems: usize, blocks: usize| {
        elems
            .checked_mul(es)
            .and_then(|b| b.checked_mul(blocks))
            .ok_or_else(|| run.invalid("count overflows the address space"))
    };
    match op {
        Op::AllReduce {
            mut buf,
            count,
            reduction,
            ..
        } => {
            let bytes = bytes_of(run, count, 1)?;
            need_buf(run, &mut buf, bytes, bytes)?;
            let ring = !matches!(
                algo,
                Algorithm::RecursiveDoubling | Algorithm::HalvingDoubling
            );
            // Out of place, the ring reads this rank's input where it needs it, chunk by
            // chunk, rather than copying the whole input to the output before its first
            // send (a cold pass over the buffer, on the critical path).
            let buf = match buf {
                Buffer::Separate { send, recv }
                    if ring && n > 1 && count > 0 && reduction.premul().is_none() =>
                {
                    return ring::all_reduce(run, Some(send), recv, count, reduction).await;
                }
                buf => buf,
            };
            let mem = stage(run, buf, 0, 0, bytes)?;
            if let Some(s) = reduction.premul() {
                run.touch();
                run.scale(mem, 0, bytes, s)?;
            }
            if count == 0 || n == 1 {
                return Ok(());
            }
            match algo {
                Algorithm::RecursiveDoubling => {
                    doubling::all_reduce(run, mem, count, reduction).await
                }
                Algorithm::HalvingDoubling => halving::all_reduce(run, mem, count, reduction).await,
                _ => ring::all_reduce(run, None, mem, count, reduction).await,
            }
        }
        Op::Reduce {
            mut buf,
            count,
            reduction,
            root,
            ..
        } => {
            let root = check_rank(run, root.0, "root")?;
            let bytes = bytes_of(run, count, 1)?;
            need_buf(run, &mut buf, bytes, if r == root { bytes } else { 0 })?;
            if n == 1 || count == 0 {
                if r == root {
                    let mem = stage(run, buf, 0, 0, bytes)?;
                    if let Some(s) = reduction.premul() {
                        run.touch();
                        run.scale(mem, 0, bytes, s)?;
                    }
                }
                return Ok(());
            }
            match algo {
                Algorithm::BinomialTree => tree::reduce(run, buf, count, reduction, root).await,
                _ => ring::reduce(run, buf, count, reduction, root).await,
            }
        }
        Op::Broadcast {
            mut buf,
            count,
            root,
            ..
        } => {
            let root = check_rank(run, root.0, "root")?;
            let bytes = bytes_of(run, count, 1)?;
            need_buf(run, &mut buf, if r == root { bytes } else { 0 }, bytes)?;
            let mem = if r == root {
                stage(run, buf, 0, 0, bytes)?
            } else {
                match buf {
                    Buffer::InPlace(b) => b,
                    Buffer::Separate { recv, .. } => recv,
                }
            };
            if n == 1 || count == 0 {
                return Ok(());
            }
            match algo {
                Algorithm::BinomialTree => tree::broadcast(run, mem, count, root).await,
                _ => ring::broadcast(run, mem, count, root).await,
            }
        }
        Op::AllGather { mut buf, count, .. } => {
            let block = bytes_of(run, count, 1)?;
            let total = bytes_of(run, count, n)?;
            if buf.is_in_place() {
                need_buf(run, &mut buf, total, total)?;
            } else {
                need_buf(run, &mut buf, block, total)?;
            }
            let mem = stage(run, buf, 0, r * block, block)?;
            if n == 1 || count == 0 {
                return Ok(());
            }
            match algo {
                Algorithm::Bruck => bruck::all_gather(run, mem, count).await,
                _ => ring::all_gather(run, mem, count).await,
            }
        }
        Op::ReduceScatter {
            mut buf,
            count,
            reduction,
            ..
        } => {
            let block = bytes_of(run, count, 1)?;
            let total = bytes_of(run, count, n)?;
            if buf.is_in_place() {
                need_buf(run, &mut buf, total, total)?;
            } else {
                need_buf(run, &mut buf, total, block)?;
            }
            if count == 0 {
                return Ok(());
            }
            if n == 1 {
                let mem = stage(run, buf, 0, 0, block)?;
                if let Some(s) = reduction.premul() {
                    run.scale(mem, 0, block, s)?;
                }
                return Ok(());
            }
            match algo {
                Algorithm::HalvingDoubling => {
                    halving::reduce_scatter(run, buf, count, reduction).await
                }
                _ => ring::reduce_scatter(run, buf, count, reduction).await,
            }
        }
        Op::AllToAll { mut buf, count, .. } => {
            let total = bytes_of(run, count, n)?;
            need_buf(run, &mut buf, total, total)?;
            if count == 0 {
                return Ok(());
            }
            if n == 1 {
                stage(run, buf, 0, 0, total)?;
                return Ok(());
            }
            pairwise::all_to_all(run, buf, count).await
        }
        Op::Gather {
            mut buf,
            count,
            root,
            ..
        } => {
            let root = check_rank(run, root.0, "root")?;
            let block = bytes_of(run, count, 1)?;
            let total = bytes_of(run, count, n)?;
            match (r == root, buf.is_in_place()) {
                (true, true) => need_buf(run, &mut buf, total, total)?,
                (true, false) => need_buf(run, &mut buf, block, total)?,
                (false, _) => need_buf(run, &mut buf, block, 0)?,
            }
            if count == 0 {
                return Ok(());
            }
            linear::gather(run, buf, count, root).await
        }
        Op::Scatter {
            mut buf,
            count,
            root,
            ..
        } => {
            let root = check_rank(run, root.0, "root")?;
            let block = bytes_of(run, count, 1)?;
            let total = bytes_of(run, count, n)?;
            match (r == root, buf.is_in_place()) {
                (true, true) => need_buf(run, &mut buf, total, total)?,
                (true, false) => need_buf(run, &mut buf, total, block)?,
                (false, _) => need_buf(run, &mut buf, 0, block)?,
            }
            if count == 0 {
                return Ok(());
            }
            linear::scatter(run, buf, count, root).await
        }
        Op::Send {
            buf, count, peer, ..
        } => {
            let peer = check_peer(run, peer.0)?;
            let bytes = bytes_of(run, count, 1)?;
            need(run, run.dev.len(buf), bytes, "send buffer")?;
            direct::send(run, buf, bytes, peer).await
        }
        Op::Recv {
            buf, count, peer, ..
        } => {
            let peer = check_peer(run, peer.0)?;
            let bytes = bytes_of(run, count, 1)?;
            need(run, run.dev.len(buf), bytes, "receive buffer")?;
            direct::recv(run, buf, bytes, peer).await
        }
        Op::Barrier => {
            if n == 1 {
                return Ok(());
            }
            dissemination::barrier(run).await
        }
    }
}

/// Copy `len` bytes of the input at `send_off` to the output at `recv_off` (unless in
/// place) and return the output.
fn stage<'b, D, L>(
    run: &mut Run<'_, D, L>,
    buf: Buffer<'b, D::Mem>,
    send_off: usize,
    recv_off: usize,
    len: usize,
) -> Result<&'b mut D::Mem, OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    match buf {
        Buffer::InPlace(b) => Ok(b),
        Buffer::Separate { send, recv } => {
            run.touch();
            run.copy(recv, recv_off, send, send_off, len)?;
            Ok(recv)
        }
    }
}

/// Check the input holds `send` bytes and the output `recv` bytes (in place: the larger).
fn need_buf<D, L>(
    run: &Run<'_, D, L>,
    buf: &mut Buffer<'_, D::Mem>,
    send: usize,
    recv: usize,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    match buf {
        Buffer::InPlace(b) => need(run, run.dev.len(b), send.max(recv), "buffer"),
        Buffer::Separate { send: s, recv: r } => {
            need(run, run.dev.len(s), send, "send buffer")?;
            need(run, run.dev.len(r), recv, "receive buffer")
        }
    }
}

fn need<D, L>(run: &Run<'_, D, L>, have: usize, want: usize, what: &str) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    if have < want {
        return Err(run.invalid(format!(
            "{what} holds {have} bytes, the operation needs {want}"
        )));
    }
    Ok(())
}

fn check_rank<D, L>(run: &Run<'_, D, L>, r: u32, what: &str) -> Result<usize, OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    if r >= run.world {
        return Err(run.invalid(format!("{what} r{r} outside a world of {}", run.world)));
    }
    Ok(r as usize)
}

fn check_peer<D, L>(run: &Run<'_, D, L>, p: u32) -> Result<u32, OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    check_rank(run, p, "peer")?;
    if p == run.rank {
        return Err(run.invalid("send or receive with this rank itself"));
    }
    Ok(p)
}
