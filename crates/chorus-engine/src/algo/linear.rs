//! Gather and scatter: the root exchanges with each other rank in turn, chunk by chunk
//! (flow control keeps the ranks that wait their turn from flooding the root). Schedule
//! step: the chunk index; tag offset: the block's place in the root's buffer.

use crate::algo::{cut, place_own, step};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::Buffer;
use crate::run::Run;

/// Gather to `root` (`count > 0`).
pub(crate) async fn gather<D, L>(
    run: &mut Run<'_, D, L>,
    mut buf: Buffer<'_, D::Mem>,
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
    let block = count * es;
    let ce = run.chunk_elems(count, 1)?;
    let k = count.div_ceil(ce);
    if r != root {
        run.plan(k);
        for c in 0..k {
            let (cs, cl) = cut(count, ce, c);
            let tag_off = r * block + cs * es;
            run.send_from(
                root as u32,
                step(0, k, c),
                tag_off,
                buf.send(),
                cs * es,
                cl * es,
            )
            .await?;
        }
        return Ok(());
    }
    run.plan((n - 1) * k);
    place_own(run, &mut buf, root * block, 0, block)?;
    let out = buf.recv();
    for i in (0..n).filter(|&i| i != root) {
        for c in 0..k {
            let (cs, cl) = cut(count, ce, c);
            let off = i * block + cs * es;
            let p = run.recv(i as u32, step(0, k, c), off, cl * es).await?;
            run.touch();
            run.unpack(out, off, &p)?;
        }
    }
    Ok(())
}

/// Scatter from `root` (`count > 0`).
pub(crate) async fn scatter<D, L>(
    run: &mut Run<'_, D, L>,
    mut buf: Buffer<'_, D::Mem>,
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
    let block = count * es;
    let ce = run.chunk_elems(count, 1)?;
    let k = count.div_ceil(ce);
    if r != root {
        run.plan(k);
        let out = buf.recv();
        for c in 0..k {
            let (cs, cl) = cut(count, ce, c);
            let p = run
                .recv(root as u32, step(0, k, c), r * block + cs * es, cl * es)
                .await?;
            run.touch();
            run.unpack(out, cs * es, &p)?;
        }
        return Ok(());
    }
    run.plan((n - 1) * k);
    for i in (0..n).filter(|&i| i != root) {
        for c in 0..k {
            let (cs, cl) = cut(count, ce, c);
            let off = i * block + cs * es;
            run.send_from(i as u32, step(0, k, c), off, buf.send(), off, cl * es)
                .await?;
        }
    }
    place_own(run, &mut buf, 0, root * block, block)?;
    Ok(())
}
