//! The algorithms, one file per family. Each runs on a [`crate::run::Run`], which races
//! every wait against the operation's context, and interleaves its sends and receives chunk
//! by chunk (see the flow-control note in `run.rs`).
//!
//! Offsets and lengths handed to the device and to tags are in bytes; schedules are computed
//! in elements.

pub(crate) mod bruck;
pub(crate) mod direct;
pub(crate) mod dissemination;
pub(crate) mod doubling;
pub(crate) mod fold;
pub(crate) mod halving;
pub(crate) mod linear;
pub(crate) mod pairwise;
pub(crate) mod ring;
pub(crate) mod tree;

use crate::device::Device;
use crate::error::OpError;
use crate::link::Link;
use crate::op::Buffer;
use crate::run::Run;

/// A span of elements in a buffer, with the tag offset (bytes) its first element travels
/// under. Both ends of a transfer compute the same tag offsets from the schedule.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) tag_base: usize,
}

impl Span {
    /// A span whose tag offset is its own byte offset.
    pub(crate) fn at(start: usize, len: usize, es: usize) -> Self {
        Span {
            start,
            len,
            tag_base: start * es,
        }
    }
}

/// What an exchange does with what it receives.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Land {
    /// Combine into the buffer with this operator.
    Reduce(chorus_protocol::ReduceOp),
    /// Overwrite the buffer.
    Copy,
}

/// Send `out` to `peer` and receive `inn` from it, chunk by chunk, within one buffer, as
/// phase `phase` of a schedule with `k` chunks per phase and `ce` elements per chunk.
/// `output` says whether `mem` is the user's output (for the partial-output flag).
///
/// Sends run up to [`Run::lookahead`] chunks ahead of the receives, so several chunks are
/// on the wire each way instead of one (a chunk's transfer overlaps the landing of the
/// previous one). Both ends still send and receive in chunk order, which is what the tags
/// count. Ahead-of-time packing reads regions no earlier chunk lands in when the spans are
/// the same or disjoint; for other overlaps it would not, and the exchange goes one chunk at
/// a time.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange<D, L>(
    run: &mut Run<'_, D, L>,
    mem: &mut D::Mem,
    peer: u32,
    phase: usize,
    k: usize,
    ce: usize,
    out: Option<Span>,
    inn: Option<Span>,
    land: Land,
    output: bool,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    let es = run.es();
    let ko = out.map_or(0, |s| s.len.div_ceil(ce));
    let ki = inn.map_or(0, |s| s.len.div_ceil(ce));
    let ahead = match (out, inn) {
        (Some(o), Some(i)) if !same_or_disjoint(o, i) => 0,
        _ => run.lookahead(),
    };
    let mut sent = 0;
    for c in 0..ko.max(ki) {
        if let Some(o) = out {
            while sent < ko && sent <= c + ahead {
                let (s, l) = cut(o.len, ce, sent);
                let tag_off = o.tag_base + s * es;
                run.send_from(
                    peer,
                    step(phase, k, sent),
                    tag_off,
                    mem,
                    (o.start + s) * es,
                    l * es,
                )
                .await?;
                sent += 1;
            }
        }
        if let Some(i) = inn.filter(|_| c < ki) {
            let (s, l) = cut(i.len, ce, c);
            let off = (i.start + s) * es;
            let (tag_off, step) = (i.tag_base + s * es, step(phase, k, c));
            match land {
                Land::Reduce(op) => {
                    // Reduced straight from the link's buffers where it allows.
                    run.recv_reduce_into(peer, step, tag_off, mem, off, l * es, op, output)
                        .await?;
                }
                Land::Copy => {
                    // The link may write the memory while the receive is pending.
                    if output {
                        run.touch();
                    }
                    run.recv_into(peer, step, tag_off, mem, off, l * es).await?;
                }
            }
        }
    }
    Ok(())
}

/// Start a reduction's output with this rank's own contribution: `len` bytes of the input
/// at `src`, placed at `dst` of the output and pre-multiplied there by `premul`.
pub(crate) fn seed<D, L>(
    run: &mut Run<'_, D, L>,
    buf: &mut Buffer<'_, D::Mem>,
    dst: usize,
    src: usize,
    len: usize,
    premul: Option<f64>,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    place_own(run, buf, dst, src, len)?;
    if let Some(s) = premul {
        run.touch();
        run.scale(buf.recv(), dst, len, s)?;
    }
    Ok(())
}

/// Stage this rank's own `len` bytes of `src` at `off` in `scratch`, pre-multiplied by
/// `premul`: what the partial results passing through are combined into.
pub(crate) fn stage<D, L>(
    run: &Run<'_, D, L>,
    scratch: &mut D::Mem,
    src: &D::Mem,
    off: usize,
    len: usize,
    premul: Option<f64>,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    run.copy(scratch, 0, src, off, len)?;
    if let Some(s) = premul {
        run.scale(scratch, 0, len, s)?;
    }
    Ok(())
}

/// Copy this rank's own `len` bytes from the input at `src` to the output at `dst`. In place
/// there is nothing to do: the caller's layout has them at `dst` already (NCCL's in-place
/// forms).
pub(crate) fn place_own<D, L>(
    run: &mut Run<'_, D, L>,
    buf: &mut Buffer<'_, D::Mem>,
    dst: usize,
    src: usize,
    len: usize,
) -> Result<(), OpError>
where
    D: Device,
    L: Link<D::Payload> + ?Sized,
{
    if let Buffer::Separate { send, recv } = buf {
        run.touch();
        run.copy(recv, dst, send, src, len)?;
    }
    Ok(())
}

/// Whether two spans of one buffer are the same region or share no element.
fn same_or_disjoint(a: Span, b: Span) -> bool {
    (a.start == b.start && a.len == b.len)
        || a.start + a.len <= b.start
        || b.start + b.len <= a.start
}

/// Part `i` of `total` elements split into `parts` nearly equal parts (the first
/// `total % parts` get one more): `(start, len)`.
pub(crate) fn part(total: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = total / parts;
    let extra = total % parts;
    (i * base + i.min(extra), base + usize::from(i < extra))
}

/// The schedule step of chunk `c` in phase `phase` of a schedule with `k` chunks per phase.
/// Callers size `k` with [`crate::run::Run::schedule`], which keeps this below the credit
/// bit.
pub(crate) fn step(phase: usize, k: usize, c: usize) -> u32 {
    (phase * k + c) as u32
}

/// Chunks of `len` elements cut every `ce` elements: `(start, len)` of chunk `c`.
pub(crate) fn cut(len: usize, ce: usize, c: usize) -> (usize, usize) {
    let start = c * ce;
    (start, ce.min(len.saturating_sub(start)))
}

/// The largest power of two not above `n` (`n >= 1`).
pub(crate) fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_exactly() {
        for total in [0, 1, 7, 1023, 1 << 20] {
            for parts in 1..17 {
                let mut next = 0;
                for i in 0..parts {
                    let (s, l) = part(total, parts, i);
                    assert_eq!(s, next);
                    next = s + l;
                }
                assert_eq!(next, total);
            }
        }
        assert_eq!(pow2_floor(1), 1);
        assert_eq!(pow2_floor(5), 4);
        assert_eq!(pow2_floor(16), 16);
        assert_eq!(cut(10, 4, 2), (8, 2));
        assert_eq!(cut(10, 4, 3), (12, 0));
    }
}
