//! Running matrix cases on an engine over any device, and comparing with the reference.

use std::io::Write as _;

use chorus_protocol::{DType, Rank};
use futures::executor::block_on;

use super::case::{Case, layout};
use super::reference::{garbage, input};
use crate::{Buffer, Device, Engine, HostBuffer, HostDevice, Link, Op, Reduction};

/// How the matrix puts inputs on a device and reads results back. A device crate's tests
/// implement it on a type of their own (the orphan rule keeps them from implementing a trait
/// of this crate on a device of theirs); [`Host`] is the host device's.
pub trait Rig: Sync {
    /// The device the matrix runs on.
    type Device: Device;
    /// A new allocation on `dev` holding `data`.
    fn load(&self, dev: &Self::Device, data: &[u8]) -> <Self::Device as Device>::Owned;
    /// The bytes of `mem`.
    fn read(&self, dev: &Self::Device, mem: &<Self::Device as Device>::Mem) -> Vec<u8>;
}

/// The [`Rig`] of [`HostDevice`].
#[derive(Copy, Clone, Debug, Default)]
pub struct Host;

impl Rig for Host {
    type Device = HostDevice;
    fn load(&self, dev: &HostDevice, data: &[u8]) -> HostBuffer {
        #[allow(clippy::unwrap_used)] // test support: a failed allocation fails the test
        let mut b = dev.alloc(data.len()).unwrap();
        b.copy_from_slice(data);
        b
    }
    fn read(&self, _dev: &HostDevice, mem: &[u8]) -> Vec<u8> {
        mem.to_vec()
    }
}

/// Run `case` on `e` (device memory in, device memory out) and compare with the reference;
/// `Err` names the engine, the algorithm, the case and the first differing element.
pub fn check<R, L>(rig: &R, e: &Engine<R::Device, L>, case: &Case) -> Result<(), String>
where
    R: Rig,
    L: Link<<R::Device as Device>::Payload> + ?Sized,
{
    let (n, r) = (e.world(), e.rank().0);
    let dev = &**e.device();
    let (send, buf, want) = layout(case, r, n);
    let dsend = rig.load(dev, &send);
    let mut dbuf = rig.load(dev, &buf);
    let b = if case.in_place {
        Buffer::InPlace(&mut *dbuf)
    } else {
        Buffer::Separate {
            send: &*dsend,
            recv: &mut *dbuf,
        }
    };
    let es = case.dtype.size();
    let algo = e.algorithm_for(case.collective, case.count * es);
    block_on(e.run(case.op(b))).map_err(|err| format!("r{r}/{n} {algo} {case:?}: {err}"))?;
    let got = rig.read(dev, &dbuf);
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        let el = |v: &[u8]| v[at - at % es..(at - at % es + es).min(v.len())].to_vec();
        return Err(format!(
            "r{r}/{n} {algo} {case:?}: first difference at element {}: got {:?} want {:?}",
            at / es,
            el(&got),
            el(&want),
        ));
    }
    Ok(())
}

/// Every case in order on this rank, stopping at the first failure (the communicator is
/// poisoned then), which is also printed at once.
pub fn sweep<R, L>(rig: &R, e: &Engine<R::Device, L>, cases: &[Case]) -> Result<(), String>
where
    R: Rig,
    L: Link<<R::Device as Device>::Payload> + ?Sized,
{
    for case in cases {
        if let Err(m) = check(rig, e, case) {
            let _ = writeln!(std::io::stderr(), "FAILED: {m}");
            return Err(m);
        }
    }
    Ok(())
}

/// Send to the right and receive from the left in one group, then a barrier, for a few
/// counts; `Err` names the first problem.
pub fn ring_exchange<R, L>(rig: &R, e: &Engine<R::Device, L>, round0: u64) -> Result<(), String>
where
    R: Rig,
    L: Link<<R::Device as Device>::Payload> + ?Sized,
{
    let (n, r) = (e.world(), e.rank().0);
    let dev = &**e.device();
    let (right, left) = (Rank((r + 1) % n), Rank((r + n - 1) % n));
    for (k, count) in [1usize, 7, 1023, 100_000].into_iter().enumerate() {
        let round = round0 + k as u64;
        let send = rig.load(dev, &input(round, r, 0, count, DType::I32, Reduction::Sum));
        let mut recv = rig.load(dev, &garbage(count * 4));
        let ops = vec![
            Op::Send {
                buf: &*send,
                count,
                dtype: DType::I32,
                peer: right,
            },
            Op::Recv {
                buf: &mut *recv,
                count,
                dtype: DType::I32,
                peer: left,
            },
        ];
        block_on(e.group(ops)).map_err(|err| format!("r{r} send/recv: {err}"))?;
        if rig.read(dev, &recv) != input(round, left.0, 0, count, DType::I32, Reduction::Sum) {
            return Err(format!("r{r} round {round}: wrong data from {left}"));
        }
        block_on(e.barrier()).map_err(|err| format!("r{r} barrier: {err}"))?;
    }
    Ok(())
}

/// Fail the test with the first few of `failures`, if there are any.
pub fn assert_clean(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(8)].join("\n")
    );
}
