//! All-to-all by pairwise exchange: at step `s` (1..n) each rank sends its block for
//! `r + s` and receives from `r - s`, chunk by chunk. Schedule step `(s-1) * k + c`; tag
//! offset: the block's place in the sender's buffer.

use crate::algo::{cut, step};
use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::Buffer;
use crate::run::Run;

/// All-to-all (`count > 0` per pair, `world > 1`). In place, the input is first copied to
/// a scratch buffer, since blocks arrive where blocks still to be sent live.
pub(crate) async fn all_to_all<D, L>(
    run: &mut Run<'_, D, L>,
    buf: Buffer<'_, D::Mem>,
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
    let (ce, k) = run.schedule(count, n - 1)?;
    let scratch;
    let (input, out): (&D::Mem, &mut D::Mem) = match buf {
        Buffer::InPlace(b) => {
            let mut copy = run.alloc(n * block)?;
            run.copy(&mut copy, 0, b, 0, n * block)?;
            scratch = copy;
            (&*scratch, b)
        }
        Buffer::Separate { send, recv } => {
            run.touch();
            run.copy(recv, r * block, send, r * block, block)?;
            (send, recv)
        }
    };
    for s in 1..n {
        let to = (r + s) % n;
        let from = (r + n - s) % n;
        for c in 0..k {
            let (cs, cl) = cut(count, ce, c);
            let off = to * block + cs * es;
            run.send_from(to as u32, step(s - 1, k, c), off, input, off, cl * es)
                .await?;
            let tag_off = r * block + cs * es;
            let q = run
                .recv(from as u32, step(s - 1, k, c), tag_off, cl * es)
                .await?;
            run.touch();
            run.unpack(out, from * block + cs * es, &q)?;
        }
    }
    Ok(())
}
