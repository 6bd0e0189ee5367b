//! Point-to-point send and receive, chunked. Tags carry the per-peer send/receive sequence
//! as the operation; the schedule step is the chunk index.

use crate::algo::cut;
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::run::Run;

/// Send the first `bytes` of `buf` to `peer`.
pub(crate) async fn send<D, L>(
    run: &mut Run<'_, D, L>,
    buf: &D::Mem,
    bytes: usize,
    peer: u32,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let es = run.es();
    let count = bytes / es;
    let (ce, k) = run.schedule(count, 1)?;
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        run.send_from(peer, c as u32, s * es, buf, s * es, l * es)
            .await?;
    }
    Ok(())
}

/// Receive `bytes` from `peer` into the start of `buf`.
pub(crate) async fn recv<D, L>(
    run: &mut Run<'_, D, L>,
    buf: &mut D::Mem,
    bytes: usize,
    peer: u32,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let es = run.es();
    let count = bytes / es;
    let (ce, k) = run.schedule(count, 1)?;
    for c in 0..k {
        let (s, l) = cut(count, ce, c);
        let p = run.recv(peer, c as u32, s * es, l * es).await?;
        run.touch();
        run.unpack(buf, s * es, &p)?;
    }
    Ok(())
}
