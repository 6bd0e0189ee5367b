//! Support for this crate's GPU tests and the device check (`kernels/check.sh`): detecting
//! a GPU, a minimal executor, and communicators of [`chorus_engine::Engine`]s over device
//! links, ranks as threads sharing one GPU, with a watchdog so nothing hangs.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::{Arc, mpsc};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

use chorus_engine::link::{CancelReason, Link};
use chorus_engine::{AbortReason, Context, Engine, EngineConfig};
use chorus_protocol::{CloseCode, Rank};
use parking_lot::{Condvar, Mutex};

use crate::device::CudaDevice;
use crate::error::CudaError;
use crate::gpu::Gpu;
use crate::link::{DeviceLink, LinkConfig};
use crate::local::connect_all;
use crate::memory::{GpuBuffer, GpuMem};

/// The engine on a GPU: what the tests and the benchmark drive.
pub type GpuEngine = Engine<CudaDevice, DeviceLink>;

/// The GPU to test on, or `None` after printing (once per process) one line saying which
/// tests were skipped and why. With `CHORUS_REQUIRE_GPU=1` in the environment (the device
/// check sets it) a missing GPU fails the test instead: there, a skip would hide a broken
/// setup behind passing tests.
pub fn gpu_or_skip(what: &str) -> Option<Arc<Gpu>> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var("CHORUS_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            // Test support only: failing the test is the point.
            #[allow(clippy::panic)]
            {
                panic!("{what} need a GPU (CHORUS_REQUIRE_GPU=1): {e}")
            }
        }
        Err(e) => {
            chorus_engine::testkit::skip(&format!("{what}: {e}"));
            None
        }
    }
}

/// Run a future to completion on this thread.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Signal(Mutex<bool>, Condvar);
    impl Wake for Signal {
        fn wake(self: Arc<Self>) {
            *self.0.lock() = true;
            self.1.notify_one();
        }
    }
    let signal = Arc::new(Signal(Mutex::new(false), Condvar::new()));
    let waker = Waker::from(signal.clone());
    let mut cx = TaskContext::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let mut woken = signal.0.lock();
        while !*woken {
            signal.1.wait(&mut woken);
        }
        *woken = false;
    }
}

/// One communicator of `devices.len()` ranks on one GPU: rank `i` on `devices[i]`, every
/// pair joined by a device link, under `parent`.
pub struct World {
    pub engines: Vec<GpuEngine>,
    links: Vec<Vec<Arc<DeviceLink>>>,
}

impl World {
    pub fn new(
        devices: &[CudaDevice],
        links: &LinkConfig,
        config: &EngineConfig,
        parent: &Context,
    ) -> Result<World, CudaError> {
        let n = devices.len() as u32;
        let links: Vec<Vec<Arc<DeviceLink>>> = connect_all(devices, links)?
            .into_iter()
            .map(|row| row.into_iter().map(Arc::new).collect())
            .collect();
        let mut engines = Vec::with_capacity(devices.len());
        for (r, (dev, row)) in devices.iter().zip(&links).enumerate() {
            let engine = Engine::new(
                Rank(r as u32),
                n,
                row.iter().cloned(),
                Arc::new(dev.clone()),
                parent,
                config.clone(),
            )
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
            engines.push(engine);
        }
        Ok(World { engines, links })
    }

    /// Rank `me`'s link to `peer`.
    pub fn link(&self, me: usize, peer: usize) -> &Arc<DeviceLink> {
        &self.links[me][crate::local::peer_index(me, peer)]
    }

    /// Cancel every link (what the runtime does when it aborts a communicator): device
    /// waits on absent peers retire.
    pub fn cancel_links(&self, why: &str) {
        for l in self.links.iter().flatten() {
            l.cancel(CancelReason::new(CloseCode::ABORTED, why.to_string()));
        }
    }

    /// Run `f` on every rank, one thread each. If a rank fails (`Err`) or panics, or they
    /// have not all finished within `limit`, every engine is aborted and every link
    /// cancelled at once (so the other ranks end too, and nothing hangs), and the result
    /// names every rank's failure.
    pub fn run<R: Send>(
        &self,
        limit: Duration,
        f: impl Fn(&GpuEngine) -> Result<R, String> + Send + Sync,
    ) -> Result<Vec<R>, String> {
        let (tx, rx) = mpsc::channel::<bool>();
        let stop = |why: &str| {
            for e in &self.engines {
                e.context().abort(AbortReason::requested(why.to_string()));
            }
            self.cancel_links(why);
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .engines
                .iter()
                .map(|e| {
                    let tx = tx.clone();
                    let f = &f;
                    s.spawn(move || {
                        let r = match std::panic::catch_unwind(AssertUnwindSafe(|| f(e))) {
                            Ok(r) => r,
                            Err(p) => Err(p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "panicked".into())),
                        };
                        let _ = tx.send(r.is_ok());
                        r
                    })
                })
                .collect();
            let mut timed_out = false;
            for _ in 0..self.engines.len() {
                match rx.recv_timeout(limit) {
                    Ok(true) => {}
                    Ok(false) => stop("a rank of the test failed"),
                    Err(_) => {
                        stop("test watchdog");
                        timed_out = true;
                        break;
                    }
                }
            }
            let mut out = Vec::with_capacity(handles.len());
            let mut failures = Vec::new();
            for (r, h) in handles.into_iter().enumerate() {
                match h.join() {
                    Ok(Ok(v)) => out.push(v),
                    Ok(Err(what)) => failures.push(format!("rank {r}: {what}")),
                    Err(_) => failures.push(format!("rank {r}: panicked")),
                }
            }
            if timed_out {
                failures.insert(
                    0,
                    format!(
                        "a world of {} did not finish within {limit:?}",
                        self.engines.len()
                    ),
                );
            }
            if failures.is_empty() {
                Ok(out)
            } else {
                Err(failures.join("\n"))
            }
        })
    }
}

/// A kernel holding a stream until released: work queued behind it waits (tests of the
/// bounded and abortable waits, and of a peer whose queued work never runs).
pub struct Stall {
    words: Option<crate::mapped::MappedHost>,
    stream: Arc<cudarc::driver::CudaStream>,
}

impl Stall {
    /// Queue the stall on `stream`.
    pub fn on(
        gpu: &Arc<Gpu>,
        stream: &Arc<cudarc::driver::CudaStream>,
    ) -> Result<Stall, CudaError> {
        let words = crate::mapped::MappedHost::new(gpu, 256)?;
        // A wait for a flag nobody raises, ended by its abort word.
        gpu.kernels.wait(
            stream,
            words.device_ptr(0),
            1,
            words.device_ptr(64),
            words.device_ptr(128),
            1,
            words.device_ptr(192),
        )?;
        Ok(Stall {
            words: Some(words),
            stream: stream.clone(),
        })
    }

    /// Let the stream go on.
    pub fn release(&self) {
        if let Some(w) = &self.words {
            w.store_u32(64, 1);
        }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.release();
        let drained = crate::sync::drain(&[&self.stream], Duration::from_secs(10), "a stall");
        if drained.is_err() {
            // The kernel may still read its words.
            std::mem::forget(self.words.take());
        }
    }
}

/// Bound on each of [`OnGpu`]'s copies.
const COPY_TIMEOUT: Duration = Duration::from_secs(20);

/// How the engine's shared collective matrix stages its bytes on a GPU: uploads the
/// inputs, downloads the outputs, each copy bounded.
pub struct OnGpu;

impl chorus_engine::testkit::Rig for OnGpu {
    type Device = CudaDevice;
    fn load(&self, dev: &CudaDevice, data: &[u8]) -> GpuBuffer {
        let mut b = dev
            .buffer(data.len())
            .expect("allocate a matrix input on the GPU");
        dev.upload(&mut b, 0, data, COPY_TIMEOUT)
            .expect("upload a matrix input");
        b
    }
    fn read(&self, dev: &CudaDevice, mem: &GpuMem) -> Vec<u8> {
        dev.download(mem, 0, mem.len(), COPY_TIMEOUT)
            .expect("download a matrix output")
    }
}
