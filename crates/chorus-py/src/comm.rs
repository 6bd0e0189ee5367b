//! `chorus._chorus.Comm`: a `chorus::Comm` shared across Python threads (a second thread's
//! `abort()` releases a collective blocked in the first), with its submission thread.
//! The pure-Python `chorus.Comm` wraps it and checks arguments first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus::{Comm, RootHost, UniqueId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::done::Done;
use crate::drive::Running;
use crate::op::{self, OpTuple};
use crate::queue::{Claim, Job, Payload, Queue};
use crate::unique_id::PyUniqueId;
use crate::wait;
use crate::work::{self, Steal, Work};
use crate::{config, error, host, tensor, view};

#[pyclass(frozen, module = "chorus._chorus", name = "Comm")]
pub(crate) struct PyComm {
    /// `None` once destroyed.
    comm: Mutex<Option<Arc<Comm>>>,
    queue: Queue,
    calls: Calls,
    rank: u32,
    size: u32,
    epoch: u64,
    /// The configuration's bounds this layer applies itself.
    limits: Limits,
    /// The bootstrap root this process hosts for the job, if it made the `UniqueId`.
    _root: Option<Arc<RootHost>>,
}

impl PyComm {
    fn new(comm: Comm, limits: Limits, root: Option<Arc<RootHost>>) -> PyResult<PyComm> {
        let comm = Arc::new(comm);
        Ok(PyComm {
            rank: comm.rank(),
            size: comm.size(),
            epoch: comm.epoch(),
            queue: Queue::start(comm.clone())?,
            calls: Calls::default(),
            comm: Mutex::new(Some(comm)),
            limits,
            _root: root,
        })
    }

    pub(crate) fn get(&self) -> PyResult<Arc<Comm>> {
        self.comm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(destroyed)
    }

    /// Runs a bounded membership call on its own thread; Ctrl-C aborts the communicator.
    fn call<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Comm) -> chorus::Result<T> + Send + 'static,
    ) -> PyResult<T> {
        let comm = self.get()?;
        let weak = Arc::downgrade(&comm);
        wait::call(py, move || work::interrupt(&weak), move || f(&comm))?
            .map_err(|e| error::to_py(py, &e))
    }

    fn enqueue(
        &self,
        comm: &Arc<Comm>,
        specs: Vec<op::Spec>,
        group: bool,
        timeout: Option<Duration>,
        keep: Py<PyAny>,
    ) -> PyResult<Work> {
        let done = Done::new();
        let claim: Claim = Arc::new(Mutex::new(Some(Payload {
            specs,
            group,
            timeout,
            keep,
        })));
        let job = Job {
            claim: claim.clone(),
            done: done.clone(),
        };
        if self.queue.submit(job).is_err() {
            return Err(destroyed());
        }
        self.calls.queued.fetch_add(1, Ordering::Relaxed);
        Ok(Work {
            done,
            comm: Arc::downgrade(comm),
            thread: self.queue.thread(),
            steal: Some(Steal {
                claim,
                lane: self.queue.lane(),
                op_timeout: self.limits.op_timeout,
            }),
        })
    }

    /// Runs parsed operations and waits for them: inline when nothing submitted before is
    /// unfinished, else through the queue (see `run`).
    fn run_specs(
        &self,
        py: Python<'_>,
        specs: Vec<op::Spec>,
        group: bool,
        keep: Py<PyAny>,
        timeout: Option<Duration>,
    ) -> PyResult<()> {
        let comm = self.get()?;
        if self.queue.is_own_thread() {
            return Err(work::own_thread("a blocking collective"));
        }
        let weak = Arc::downgrade(&comm);
        if let Some(_turn) = self.queue.inline() {
            self.calls.inline.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `keep` (held by this frame, as is `specs`) owns the memory every spec
            // names until `running` is dropped inside `wait::run`; `op::parse` (or
            // `Spec::checked`) checked the overlaps.
            let running = unsafe { Running::start(&comm, &specs, group, timeout) };
            let result = wait::run(py, running, || work::interrupt(&weak))?;
            drop(keep);
            return result.map_err(|e| error::to_py(py, &e));
        }
        let work = self.enqueue(&comm, specs, group, timeout, keep)?;
        drop(comm);
        let outcome = &work.done.outcome;
        wait::wait(py, outcome, None, || work::interrupt(&weak))?;
        outcome.with(|r| match r {
            Some(Err(e)) => Err(error::to_py(py, e)),
            _ => Ok(()),
        })
    }

    fn child(&self, comm: Comm) -> PyResult<PyComm> {
        PyComm::new(comm, self.limits, self._root.clone())
    }
}

#[pymethods]
impl PyComm {
    /// Joins the communicator `uid` names as `rank` of `world` (blocking, bounded by
    /// `init_timeout`, GIL released).
    #[staticmethod]
    #[pyo3(signature = (uid, rank, world, **config))]
    fn init(
        py: Python<'_>,
        uid: &Bound<'_, PyUniqueId>,
        rank: u32,
        world: u32,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyComm> {
        let config = config::resolve(config)?;
        let uid = uid.get();
        let (id, root) = (uid.id.clone(), uid.root.clone());
        let limits = Limits::of(&config);
        let comm = wait::call(
            py,
            || {},
            move || Comm::init_blocking(&id, rank, world, config),
        )?
        .map_err(|e| error::to_py(py, &e))?;
        PyComm::new(comm, limits, root)
    }

    /// `init` from the launch environment (`chorus run`, torchrun, Slurm, Open MPI).
    #[staticmethod]
    #[pyo3(signature = (**config))]
    fn from_env(py: Python<'_>, config: Option<&Bound<'_, PyDict>>) -> PyResult<PyComm> {
        let config = config::resolve(config)?;
        let limits = Limits::of(&config);
        let comm = wait::call(py, || {}, move || Comm::from_env_blocking(config))?
            .map_err(|e| error::to_py(py, &e))?;
        PyComm::new(comm, limits, None)
    }

    /// Joins a running communicator whose members call `grow`, with their `grow_token()`.
    #[staticmethod]
    #[pyo3(signature = (token, **config))]
    fn join(py: Python<'_>, token: &str, config: Option<&Bound<'_, PyDict>>) -> PyResult<PyComm> {
        let id =
            UniqueId::parse(token).map_err(|e| PyValueError::new_err(format!("token: {e}")))?;
        let config = config::resolve(config)?;
        let limits = Limits::of(&config);
        let comm = wait::call(py, || {}, move || Comm::join_blocking(&id, config))?
            .map_err(|e| error::to_py(py, &e))?;
        PyComm::new(comm, limits, None)
    }

    /// Queues operations (a list of op tuples; `group`: run them as one NCCL group) behind
    /// everything submitted before. `keep` owns their memory until they finish; `timeout`
    /// (seconds, from when they start) aborts the communicator if they overrun it.
    #[pyo3(signature = (ops, group, keep, timeout=None))]
    fn submit(
        &self,
        ops: Vec<OpTuple>,
        group: bool,
        keep: Py<PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Work> {
        let timeout = timeout.map(|t| wait::seconds("timeout", t)).transpose()?;
        let specs = op::parse(ops)?;
        let comm = self.get()?;
        self.enqueue(&comm, specs, group, timeout, keep)
    }

    /// Runs operations as `submit` does and waits for them, on this thread when nothing
    /// submitted before is unfinished (the inline path), else through the queue. Raises
    /// the operation's error; Ctrl-C aborts the communicator and raises `KeyboardInterrupt`.
    #[pyo3(signature = (ops, group, keep, timeout=None))]
    fn run(
        &self,
        py: Python<'_>,
        ops: Vec<OpTuple>,
        group: bool,
        keep: Py<PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let timeout = timeout.map(|t| wait::seconds("timeout", t)).transpose()?;
        let specs = op::parse(ops)?;
        self.run_specs(py, specs, group, keep, timeout)
    }

    /// The blocking, in-place (`out=None`) or out-of-place all-reduce of numpy arrays or
    /// plain torch CPU tensors with a plain reduction (`"sum"`, `"prod"`, `"min"`, `"max"`,
    /// `"avg"`), described here in one call, as `run` runs it (within `timeout` seconds if
    /// given): True once it has run (or raises its error), False when the arguments are
    /// anything else (another type, a dtype, layout or reduction this path does not take,
    /// `out` unlike `a`), which the caller then describes, checks and runs the general way.
    #[pyo3(signature = (a, out, op, timeout=None))]
    fn all_reduce_now(
        &self,
        py: Python<'_>,
        a: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<bool> {
        let Ok(name) = op.cast::<PyString>() else {
            return Ok(false);
        };
        let reduction = match &*name.to_cow()? {
            name @ ("sum" | "prod" | "min" | "max" | "avg") => op::reduction(name, 0.0)?,
            _ => return Ok(false),
        };
        let in_place = out.is_none();
        let describe =
            |obj, writable| host::describe(obj, writable).or_else(|| tensor::describe(obj));
        let Some(send) = describe(a, in_place) else {
            return Ok(false);
        };
        let recv = if in_place {
            send
        } else {
            match describe(out, true) {
                Some(r) if r.dtype == send.dtype && r.numel == send.numel => r,
                _ => return Ok(false),
            }
        };
        let timeout = timeout.map(|t| wait::seconds("timeout", t)).transpose()?;
        let raw = |h: host::Host| op::Raw {
            addr: h.addr,
            len: h.nbytes,
        };
        let spec = op::Spec::checked(op::Spec {
            kind: op::Kind::AllReduce,
            send: Some(raw(send)),
            recv: Some(raw(recv)),
            count: send.numel,
            dtype: send.dtype,
            reduction,
            peer: 0,
        })?;
        let keep = if in_place {
            a.clone().unbind()
        } else {
            PyTuple::new(py, [a, out])?.into_any().unbind()
        };
        self.run_specs(py, vec![spec], false, keep, timeout)?;
        Ok(true)
    }

    /// How many blocking calls took the inline path and how many went through the queue
    /// (`(inline, queued)`), for tests and benchmarks.
    fn _calls(&self) -> (u64, u64) {
        (
            self.calls.inline.load(Ordering::Relaxed),
            self.calls.queued.load(Ordering::Relaxed),
        )
    }

    /// How many queued operations their `Work.wait` ran on its own thread.
    fn _stolen(&self) -> u64 {
        self.queue.stolen()
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    #[getter]
    fn size(&self) -> u32 {
        self.size
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    #[getter]
    fn destroyed(&self) -> bool {
        self.comm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn members<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        view::members(py, &*self.get()?)
    }

    fn health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        view::health(py, &*self.get()?)
    }

    fn async_error<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.get()?.async_error().map(|e| error::instance(py, &e)))
    }

    /// Aborts now (local, immediate, idempotent): every operation in flight or queued on
    /// this communicator, and on those split or shrunk from it, fails with `Aborted`.
    #[pyo3(signature = (reason="aborted from Python"))]
    fn abort(&self, reason: &str) {
        if let Ok(comm) = self.get() {
            comm.abort(reason);
        }
    }

    fn revoke(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |c| c.blocking().revoke())
    }

    fn shrink(&self, py: Python<'_>) -> PyResult<PyComm> {
        let comm = self.call(py, |c| c.blocking().shrink())?;
        self.child(comm)
    }

    fn grow(&self, py: Python<'_>, joiners: u32) -> PyResult<PyComm> {
        let comm = self.call(py, move |c| c.blocking().grow(joiners))?;
        self.child(comm)
    }

    fn grow_token(&self) -> PyResult<String> {
        Ok(self.get()?.grow_token().to_token())
    }

    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: u32) -> PyResult<Option<PyComm>> {
        match self.call(py, move |c| c.blocking().split(color, key))? {
            Some(comm) => Ok(Some(self.child(comm)?)),
            None => Ok(None),
        }
    }

    /// Leaves gracefully (idempotent). Queued operations get the teardown budget to
    /// finish; then the communicator is aborted, which ends them with `Aborted`.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let Some(comm) = self.comm.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        self.queue.close();
        let weak = Arc::downgrade(&comm);
        let drained = wait::wait(py, &self.queue.exited, Some(self.limits.teardown), || {
            work::interrupt(&weak)
        })?;
        if !drained {
            comm.abort("destroyed with operations still queued");
            wait::wait(py, &self.queue.exited, Some(self.limits.teardown), || {})?;
        }
        match Arc::try_unwrap(comm) {
            Ok(comm) => wait::call(py, || {}, move || comm.destroy_blocking())?
                .map_err(|e| error::to_py(py, &e)),
            // A membership call still holds it (it returns within its own deadline): leave
            // without waiting on anyone.
            Err(shared) => {
                shared.abort("destroyed while another call was using it");
                Ok(())
            }
        }
    }
}

/// The configuration's bounds this layer applies itself.
#[derive(Clone, Copy)]
struct Limits {
    /// The bound on `destroy`'s wait for queued operations (the teardown budget).
    teardown: Duration,
    /// The operation timeout: a `Work.wait` at least this long may run its operation
    /// itself, as the operation ends within it anyway.
    op_timeout: Duration,
}

impl Limits {
    fn of(config: &chorus::Config) -> Limits {
        Limits {
            teardown: config.teardown_budget,
            op_timeout: config.op_timeout,
        }
    }
}

/// Counts of the paths operations took.
#[derive(Default)]
struct Calls {
    inline: AtomicU64,
    queued: AtomicU64,
}

fn destroyed() -> PyErr {
    error::to_py_destroyed()
}
