//! Dissemination barrier: in round `i` each rank signals `r + 2^i` and waits for `r - 2^i`;
//! after `ceil(log2 n)` rounds every rank has heard, transitively, from every other.

use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::run::Run;

/// Barrier (`world > 1`). Tag step: the round.
pub(crate) async fn barrier<D, L>(run: &mut Run<'_, D, L>) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let n = run.world as usize;
    let r = run.rank as usize;
    let rounds = (usize::BITS - (n - 1).leading_zeros()) as usize;
    run.plan(rounds);
    for i in 0..rounds {
        let dist = 1 << i;
        let to = ((r + dist) % n) as u32;
        let from = ((r + n - dist) % n) as u32;
        let token = run.empty()?;
        run.send(to, i as u32, 0, token).await?;
        run.recv(from, i as u32, 0, 0).await?;
    }
    Ok(())
}
