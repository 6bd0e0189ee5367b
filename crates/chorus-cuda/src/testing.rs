//! Support for this crate's GPU tests and the device check (`kernels/check.sh`): detecting
//! a GPU, a minimal executor, and plain collectives written against the engine's ports.
//!
//! The collectives here are deliberately simple (rings, and root-centred trees) so that the
//! tests exercise the `Device` and `Link` implementations on real device memory; the
//! engine's own algorithms replace them once it drives these ports.

use std::future::Future;
use std::io::Write as _;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use chorus_engine::device::Device;
use chorus_engine::link::{Link, Tag};
use chorus_protocol::{Collective, DType, OpSeq, ReduceOp};

use crate::gpu::Gpu;

/// The GPU to test on, or `None` after printing (once per process) one line saying which
/// tests were skipped and why.
pub fn gpu_or_skip(what: &str) -> Option<Arc<Gpu>> {
    static SAID: AtomicBool = AtomicBool::new(false);
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            if !SAID.swap(true, Ordering::SeqCst) {
                // Straight to the stream: the test harness captures `eprintln!` of passing
                // tests, and this line is for the person running them.
                let _ = writeln!(std::io::stderr(), "skipped {what}: {e}");
            }
            None
        }
    }
}

/// Run a future to completion on this thread.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Signal(Mutex<bool>, Condvar);
    impl Wake for Signal {
        fn wake(self: Arc<Self>) {
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
            self.1.notify_one();
        }
    }
    let signal = Arc::new(Signal(Mutex::new(false), Condvar::new()));
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let mut woken = signal.0.lock().unwrap_or_else(|p| p.into_inner());
        while !*woken {
            woken = signal.1.wait(woken).unwrap_or_else(|p| p.into_inner());
        }
        *woken = false;
    }
}

/// What one rank needs to run a collective: its device, its links (row from
/// [`crate::local::connect_all`]), its rank and the world size.
pub struct Rank<'a, D: Device, L: Link<D::Payload>> {
    pub device: &'a D,
    pub links: &'a [L],
    pub me: usize,
    pub world: usize,
}

impl<D: Device, L: Link<D::Payload>> Rank<'_, D, L> {
    fn link(&self, peer: usize) -> &L {
        &self.links[crate::local::peer_index(self.me, peer)]
    }

    fn tag(&self, collective: Collective, op: u64, step: u32, offset: usize, dtype: DType) -> Tag {
        Tag {
            collective,
            op: OpSeq(op),
            step,
            offset: offset as u64,
            dtype,
        }
    }

    /// Byte range of chunk `c` when `len` bytes of `dtype` are split into `world` chunks.
    pub fn chunk(&self, c: usize, len: usize, dtype: DType) -> (usize, usize) {
        let size = dtype.size();
        let elems = len / size;
        let lo = c * elems / self.world;
        let hi = (c + 1) * elems / self.world;
        (lo * size, (hi - lo) * size)
    }

    /// Ring all-reduce of `buf[..len]` in place; `Avg` divides the sum by the world size,
    /// `PreMulSum` multiplies each contribution by `scalar` first.
    pub fn all_reduce(
        &self,
        buf: &mut D::Mem,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        scalar: f64,
        seq: u64,
    ) -> Result<(), String> {
        let base = match op {
            ReduceOp::Avg | ReduceOp::PreMulSum => ReduceOp::Sum,
            other => other,
        };
        if op == ReduceOp::PreMulSum {
            self.device
                .scale(buf, 0, len, dtype, scalar)
                .map_err(|e| e.to_string())?;
        }
        self.reduce_scatter_ring(buf, len, dtype, base, seq, 0)?;
        self.all_gather_ring(buf, len, dtype, seq, self.world as u32)?;
        if op == ReduceOp::Avg {
            self.device
                .scale(buf, 0, len, dtype, 1.0 / self.world as f64)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Ring reduce-scatter: afterwards chunk `(me + 1) % world` of `buf` holds the reduction.
    pub fn reduce_scatter_ring(
        &self,
        buf: &mut D::Mem,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        seq: u64,
        step0: u32,
    ) -> Result<(), String> {
        let n = self.world;
        if n == 1 {
            return Ok(());
        }
        let (right, left) = ((self.me + 1) % n, (self.me + n - 1) % n);
        for step in 0..n - 1 {
            let send_c = (self.me + n - step) % n;
            let recv_c = (self.me + 2 * n - step - 1) % n;
            let (so, sl) = self.chunk(send_c, len, dtype);
            let (ro, _) = self.chunk(recv_c, len, dtype);
            let s = step0 + step as u32;
            let payload = self.device.pack(buf, so, sl).map_err(|e| e.to_string())?;
            block_on(
                self.link(right)
                    .send(self.tag(Collective::AllReduce, seq, s, so, dtype), payload),
            )
            .map_err(|e| e.to_string())?;
            let got =
                block_on(
                    self.link(left)
                        .recv(self.tag(Collective::AllReduce, seq, s, ro, dtype)),
                )
                .map_err(|e| e.to_string())?;
            self.device
                .unpack_reduce(buf, ro, &got, dtype, op)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Ring all-gather of the chunks, starting from chunk `(me + 1) % world` being final.
    pub fn all_gather_ring(
        &self,
        buf: &mut D::Mem,
        len: usize,
        dtype: DType,
        seq: u64,
        step0: u32,
    ) -> Result<(), String> {
        let n = self.world;
        let (right, left) = ((self.me + 1) % n, (self.me + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let send_c = (self.me + 1 + n - step) % n;
            let recv_c = (self.me + n - step) % n;
            let (so, sl) = self.chunk(send_c, len, dtype);
            let (ro, _) = self.chunk(recv_c, len, dtype);
            let s = step0 + step as u32;
            let payload = self.device.pack(buf, so, sl).map_err(|e| e.to_string())?;
            block_on(
                self.link(right)
                    .send(self.tag(Collective::AllReduce, seq, s, so, dtype), payload),
            )
            .map_err(|e| e.to_string())?;
            let got =
                block_on(
                    self.link(left)
                        .recv(self.tag(Collective::AllReduce, seq, s, ro, dtype)),
                )
                .map_err(|e| e.to_string())?;
            self.device
                .unpack(buf, ro, &got)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Broadcast `buf[..len]` from `root` (the root sends to each rank directly).
    pub fn broadcast(
        &self,
        buf: &mut D::Mem,
        len: usize,
        root: usize,
        seq: u64,
    ) -> Result<(), String> {
        let tag = self.tag(Collective::Broadcast, seq, 0, 0, DType::U8);
        if self.me == root {
            for peer in (0..self.world).filter(|&p| p != root) {
                let payload = self.device.pack(buf, 0, len).map_err(|e| e.to_string())?;
                block_on(self.link(peer).send(tag, payload)).map_err(|e| e.to_string())?;
            }
        } else {
            let got = block_on(self.link(root).recv(tag)).map_err(|e| e.to_string())?;
            self.device
                .unpack(buf, 0, &got)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Reduce `buf[..len]` onto `root` (every rank sends to the root, which reduces in rank
    /// order).
    pub fn reduce(
        &self,
        buf: &mut D::Mem,
        len: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        seq: u64,
    ) -> Result<(), String> {
        let tag = self.tag(Collective::Reduce, seq, 0, 0, dtype);
        if self.me == root {
            for peer in (0..self.world).filter(|&p| p != root) {
                let got = block_on(self.link(peer).recv(tag)).map_err(|e| e.to_string())?;
                self.device
                    .unpack_reduce(buf, 0, &got, dtype, op)
                    .map_err(|e| e.to_string())?;
            }
        } else {
            let payload = self.device.pack(buf, 0, len).map_err(|e| e.to_string())?;
            block_on(self.link(root).send(tag, payload)).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// All-gather: rank `r`'s `block` bytes at `out[r * block..]` on every rank (`out` holds
    /// this rank's block in place already).
    pub fn all_gather(&self, out: &mut D::Mem, block: usize, seq: u64) -> Result<(), String> {
        for peer in (0..self.world).filter(|&p| p != self.me) {
            let tag = self.tag(
                Collective::AllGather,
                seq,
                self.me as u32,
                self.me * block,
                DType::U8,
            );
            let payload = self
                .device
                .pack(out, self.me * block, block)
                .map_err(|e| e.to_string())?;
            block_on(self.link(peer).send(tag, payload)).map_err(|e| e.to_string())?;
        }
        for peer in (0..self.world).filter(|&p| p != self.me) {
            let tag = self.tag(
                Collective::AllGather,
                seq,
                peer as u32,
                peer * block,
                DType::U8,
            );
            let got = block_on(self.link(peer).recv(tag)).map_err(|e| e.to_string())?;
            self.device
                .unpack(out, peer * block, &got)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// All-to-all: block `p` of `send` goes to rank `p`, landing at block `me` of its `recv`.
    pub fn all_to_all(
        &self,
        send: &D::Mem,
        recv: &mut D::Mem,
        block: usize,
        seq: u64,
    ) -> Result<(), String> {
        for peer in (0..self.world).filter(|&p| p != self.me) {
            let tag = self.tag(Collective::AllToAll, seq, 0, self.me * block, DType::U8);
            let payload = self
                .device
                .pack(send, peer * block, block)
                .map_err(|e| e.to_string())?;
            block_on(self.link(peer).send(tag, payload)).map_err(|e| e.to_string())?;
        }
        self.device
            .copy(recv, self.me * block, send, self.me * block, block)
            .map_err(|e| e.to_string())?;
        for peer in (0..self.world).filter(|&p| p != self.me) {
            let tag = self.tag(Collective::AllToAll, seq, 0, peer * block, DType::U8);
            let got = block_on(self.link(peer).recv(tag)).map_err(|e| e.to_string())?;
            self.device
                .unpack(recv, peer * block, &got)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
