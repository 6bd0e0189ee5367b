//! `chorus._chorus.CudaComm`: a communicator's collectives on CUDA device memory
//! (`chorus::cuda::CudaComm`), with its own submission thread, and `cuda_unavailable`, the
//! probe the pure-Python layer uses to name a missing device before it submits anything.
//!
//! The pure-Python layer (`chorus._cuda`) reads the address, size, dtype and stream from
//! the object's own interface (torch CUDA tensors, `__cuda_array_interface__`,
//! `__dlpack__`) and hands the object to the job, which holds it until the operation has
//! finished on the device; that is what makes the device regions below valid.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use chorus::Op;
use chorus::cuda::{CudaComm, GpuMem, Stream};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::comm::PyComm;
use crate::done::Done;
use crate::error;
use crate::op::{self, OpTuple, Raw, Spec};
use crate::wait::{self, Slot};
use crate::work::{self, Work};

/// One device submission: operations, the caller's stream, the objects owning the memory.
struct DeviceJob {
    specs: Vec<Spec>,
    group: bool,
    stream: usize,
    done: Arc<Done>,
    keep: Py<PyAny>,
}

#[pyclass(frozen, module = "chorus._chorus", name = "CudaComm")]
pub(crate) struct PyCudaComm {
    tx: Mutex<Option<mpsc::Sender<DeviceJob>>>,
    exited: Arc<Slot<()>>,
    /// `None` once closed.
    cuda: Mutex<Option<Arc<CudaComm>>>,
    /// The host communicator, to abort when Ctrl-C interrupts a wait (its abort reaches
    /// this one, a split of it).
    host: std::sync::Weak<chorus::Comm>,
    device: String,
    /// The submission thread, which must never wait for its own queue.
    thread: std::thread::ThreadId,
}

#[pymethods]
impl PyCudaComm {
    /// The members of `comm` on CUDA device `ordinal` (every member calls it; blocking,
    /// bounded by the init timeout, GIL released).
    #[new]
    fn new(py: Python<'_>, comm: &Bound<'_, PyComm>, ordinal: usize) -> PyResult<PyCudaComm> {
        let host = comm.get().get()?;
        let weak = Arc::downgrade(&host);
        let interrupt = weak.clone();
        let cuda = wait::call(
            py,
            move || work::interrupt(&interrupt),
            move || host.cuda_blocking(ordinal),
        )?
        .map_err(|e| error::to_py(py, &e))?;
        let cuda = Arc::new(cuda);
        let device = cuda.device_name().to_string();
        let (tx, rx) = mpsc::channel::<DeviceJob>();
        let exited = Slot::new();
        let (worker, done) = (cuda.clone(), exited.clone());
        let handle = std::thread::Builder::new()
            .name(format!("chorus-py-cuda-r{}", cuda.rank()))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let DeviceJob {
                        specs,
                        group,
                        stream,
                        done,
                        keep,
                    } = job;
                    done.set(run(&worker, &specs, group, stream));
                    // Only now may the memory go: the operation has completed on the device.
                    drop(specs);
                    drop(keep);
                }
                drop(worker);
                done.set(());
            })
            .map_err(|e| {
                PyRuntimeError::new_err(format!("cannot start the submission thread: {e}"))
            })?;
        Ok(PyCudaComm {
            tx: Mutex::new(Some(tx)),
            exited,
            cuda: Mutex::new(Some(cuda)),
            host: weak,
            device,
            thread: handle.thread().id(),
        })
    }

    /// Queues operations on device memory (op tuples as `Comm.submit` takes them) behind
    /// everything submitted before, ordered after the work on `stream` (a raw
    /// `cudaStream_t`; 0 is the legacy default stream), their completion recorded on it.
    fn submit(
        &self,
        ops: Vec<OpTuple>,
        group: bool,
        keep: Py<PyAny>,
        stream: usize,
    ) -> PyResult<Work> {
        let specs = op::parse(ops)?;
        let done = Done::new();
        let job = DeviceJob {
            specs,
            group,
            stream,
            done: done.clone(),
            keep,
        };
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref().map(|tx| tx.send(job)) {
            Some(Ok(())) => Ok(Work {
                done,
                comm: self.host.clone(),
                thread: self.thread,
                steal: None,
            }),
            _ => Err(error::to_py_destroyed()),
        }
    }

    /// The device's name (`cuda:0`).
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// Aborts now (the host communicator stays usable); queued operations fail `Aborted`.
    #[pyo3(signature = (reason="aborted from Python"))]
    fn abort(&self, reason: &str) {
        if let Some(cuda) = self.cuda.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            cuda.abort(reason);
        }
    }

    /// Accepts no more operations and waits (bounded by `timeout` seconds) until the queued
    /// ones have finished (past it, aborts them), then leaves the device communicator
    /// (bounded by the teardown budget). True if the queued operations finished in time.
    /// Idempotent.
    #[pyo3(signature = (timeout=30.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let timeout = wait::seconds("timeout", timeout)?;
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(cuda) = self.cuda.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(true);
        };
        let host = self.host.clone();
        let drained = wait::wait(py, &self.exited, Some(timeout), move || {
            work::interrupt(&host)
        })?;
        if !drained {
            cuda.abort("closed with device operations still queued");
            wait::wait(py, &self.exited, Some(timeout), || {})?;
        }
        match Arc::try_unwrap(cuda) {
            Ok(cuda) => {
                wait::call(py, || {}, move || cuda.destroy_blocking())?
                    .map_err(|e| error::to_py(py, &e))?;
            }
            // The submission thread still holds it (it did not exit in time): leave at once.
            Err(shared) => shared.abort("closed while an operation was still running"),
        }
        Ok(drained)
    }
}

/// None if CUDA device `ordinal` is usable here, else why not (`[chorus:device] ...`).
#[pyfunction]
pub(crate) fn cuda_unavailable(py: Python<'_>, ordinal: usize) -> Option<String> {
    py.detach(|| chorus::cuda::probe(ordinal).err().map(|e| e.to_string()))
}

fn run(cuda: &CudaComm, specs: &[Spec], group: bool, stream: usize) -> chorus::Result<()> {
    // SAFETY: the Python layer took `stream` from the tensor's (or object's) own stream on
    // this device, and the job's `keep` holds that object until after this returns.
    let stream = unsafe { Stream::from_raw(stream) };
    // SAFETY: the job's `keep` holds the objects owning the device memory of every spec
    // until after this returns; `op::parse` checked that no written range overlaps another.
    let mut mems: Vec<[GpuMem; 2]> = specs.iter().map(|s| unsafe { regions(s) }).collect();
    let mut ops: Vec<Op<'_, GpuMem>> = specs
        .iter()
        .zip(mems.iter_mut())
        .map(|(s, m)| device_op(s, m))
        .collect();
    match ops.pop() {
        Some(op) if ops.is_empty() && !group => cuda.run_blocking(op, &stream),
        Some(op) => {
            ops.push(op);
            cuda.group_blocking(ops, &stream)
        }
        None => Ok(()),
    }
}

/// The send and receive regions of `s` (empty where it has none).
///
/// # Safety
/// The memory they name is device memory that stays valid while the operation runs.
unsafe fn regions(s: &Spec) -> [GpuMem; 2] {
    let mem = |r: Option<Raw>| {
        let r = r.unwrap_or(Raw { addr: 0, len: 0 });
        // SAFETY: this function's contract.
        unsafe { GpuMem::from_raw(r.addr as u64, r.len) }
    };
    [mem(s.send), mem(s.recv)]
}

/// The operation over `mems` (`[send, recv]`); in place when both name the same memory.
fn device_op<'a>(s: &Spec, mems: &'a mut [GpuMem; 2]) -> Op<'a, GpuMem> {
    let [send, recv] = mems;
    s.build(send, recv)
}
