"""``ProcessGroupChorus``: a torch ``ProcessGroup`` whose collectives run on a chorus
communicator.

It is a Python subclass of ``torch.distributed.ProcessGroup`` (the shape torch's own
``test_c10d_pypg`` and torchft's process groups have): ``torch.distributed``'s functions
call its methods directly, and torch's C++ (DDP's reducer) reaches them through the
pybind trampoline. Every method checks its arguments in the caller's thread, turns the
call into chorus operations over the tensors' own memory (staging only where torch's
layout and chorus's differ: lists of tensors, uneven all-to-all) and returns a ``Work``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

import chorus

from . import _link, _ops, _shrink
from ._hooks import TorchHooks
from ._link import Step, byte_view
from ._ops import check_list, check_tensor, nbytes, one, same_layout
from ._rendezvous import _seconds
from ._work import Completer, Work, _Call, _error, ended

_SUM = dist.ReduceOp.SUM

# Slack on the Python-side deadline, so that with the timeout torch gave at creation the
# communicator's own op timeout (a Timeout naming the step and the peer) fires first.
_DEADLINE_SLACK = 1.0


class ChorusGroup(TorchHooks):
    """Everything a chorus group does, for the two shapes torch takes it in: a
    ``ProcessGroup`` (what the backend's creator returns) and a ``Backend`` inside one of
    torch's own ``ProcessGroup`` objects (what ``dist.shrink_group`` builds around the
    group :meth:`shrink` returns)."""

    def __init__(self, comm: object, timeout: float, comm_timeout: Optional[float] = None, created_by: str = "rendezvous") -> None:
        super().__init__(int(comm.rank), int(comm.size))
        self._comm = comm
        # The extension's communicator, for the blocking all-reduce's fast path in
        # ``allreduce`` (None for a stand-in without one).
        self._inner = getattr(comm, "_c", None)
        self._timeout = float(timeout)
        # The communicator's own op timeout (a split child inherits its parent's).
        self._comm_timeout = float(timeout if comm_timeout is None else comm_timeout)
        self._created_by = created_by
        self._last: Optional[_Call] = None  # the latest submission: later ones finish after it
        self._ancestor: Optional["ChorusGroup"] = None  # the group this one was shrunk or grown from
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._aborted = False
        self._closed = False
        self._batch: Optional[List[tuple]] = None  # between start and end of coalescing
        self._batch_call: Optional[_Call] = None
        self._completer_thread: Optional[Completer] = None

    # --- identity (the rest, and torch's hooks, are TorchHooks's) ---------------------

    @property
    def comm(self) -> object:
        """The chorus communicator (for ``health()``, ``members()`` and the like)."""
        return self._comm

    @property
    def created_by(self) -> str:
        """How this group's communicator was made: ``"rendezvous"`` (through the store),
        ``"launcher"`` (``chorus run``'s job), ``"split"`` (of the default group's, by
        ``new_group``), ``"shrink"``, ``"grow"`` or ``"join"``."""
        return self._created_by

    def _drain(self) -> None:
        """Waits (bounded by its deadline) until everything submitted so far has ended;
        how it ended is its own ``Work``'s to report."""
        last = self._last
        if last is not None:
            while not last.finish(1.0):
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank()}, size={self.size()})"

    # --- health, abort, teardown (torchft's contract) -------------------------------

    def errored(self) -> Optional[BaseException]:
        """The first failure of this group (an operation's, or one the communicator saw
        without an operation running, such as a peer's death), or None."""
        with self._lock:
            if self._error is not None:
                return self._error
        try:
            e = self._comm.async_error()
        except Exception as e2:  # destroyed
            e = e2 if not self._closed else None
        if e is not None:
            self._fail(e)
            return e
        if self._aborted:
            return _error(getattr(chorus, "Aborted", chorus.Error), "[chorus:aborted] abort() was called")
        return None

    def abort(self) -> None:
        """Ends every operation pending or running on this group with ``Aborted``, now,
        from any thread, without waiting on a peer. The group is unusable afterwards
        (``shrink`` it, or shut it down)."""
        self._aborted = True
        self._abort_comm("abort() on the torch process group")
        with self._lock:
            batch_call = self._batch_call
        if batch_call is not None and batch_call.work is None:
            batch_call._end(_error(getattr(chorus, "Aborted", chorus.Error), "[chorus:aborted] abort() during coalescing"))

    def _abort_comm(self, reason: str) -> None:
        try:
            self._comm.abort(reason)
        except TypeError:
            self._comm.abort()

    def shutdown(self) -> None:
        """Leaves the communicator (bounded by its teardown budget); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            completer = self._completer_thread
        try:
            self._comm.destroy()
        finally:
            if completer is not None:
                completer.stop(5.0)
            _shrink.release(self)
            ancestor, self._ancestor = self._ancestor, None
            if ancestor is not None:  # destroying an older epoch leaves this one be
                ancestor.shutdown()

    def set_timeout(self, timeout: timedelta) -> None:
        """The deadline of operations submitted from now on. Past it, an operation fails
        with ``chorus.Timeout`` and the communicator is aborted (as NCCL's watchdog does).
        The communicator's own op timeout, set at creation, still bounds every operation."""
        self._timeout = _seconds(timeout, self._timeout)

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self.set_timeout(timeout)

    def _deadline(self) -> float:
        slack = _DEADLINE_SLACK if self._timeout >= self._comm_timeout else 0.0
        return time.monotonic() + self._timeout + slack

    def timeout_seconds(self) -> float:
        return self._timeout

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = e

    def _completer(self) -> Completer:
        with self._lock:
            if self._completer_thread is None:
                self._completer_thread = Completer(f"chorus-torch-r{self.rank()}")
            return self._completer_thread

    # --- submission -------------------------------------------------------------------

    def _submit(
        self,
        name: str,
        steps: List[Step],
        outputs: List[torch.Tensor],
        keep: tuple,
        post: Optional[Callable[[], None]] = None,
        group: bool = False,
        now: bool = False,
    ) -> Work:
        """One torch call as one chorus submission. ``now``: torch waits for it at once (a
        blocking collective, ``async_op=False``), so it runs to its end before this returns
        (on this thread when nothing before it is unfinished) and the ``Work`` returned has
        ended; its error, if any, is raised by ``wait()`` as for any other."""
        if self._batch is not None:
            self._batch.append((name, steps, outputs, keep, post))
            return Work([self._batch_call], outputs)
        if now and steps and _link.on_host(steps):
            # torch waits for it as soon as this returns: run it here, on this thread,
            # rather than wake the submission thread for it.
            return self._run_here(name, outputs, lambda timeout: _link.run(self._comm, steps, group, timeout), post)
        deadline = self._deadline()
        work = _link.submit(self._comm, steps, group) if steps else None
        call = _Call(self, name, work, outputs, post, deadline)
        if work is None:
            call._end(None)
        else:
            self._last = call
        return Work([call])

    def _run_here(
        self,
        name: str,
        outputs: List[torch.Tensor],
        run: Callable[[Optional[float]], None],
        post: Optional[Callable[[], None]] = None,
    ) -> Work:
        """A blocking call run to its end on this thread by ``run(timeout)``: the ``Work``
        returned has ended, and its ``wait()`` raises the error, if any, as for any other."""
        timeout = self._run_timeout()
        try:
            run(timeout)
        except BaseException as e:  # the operation failed (or Ctrl-C aborted it)
            return self._failed_here(name, outputs, self._run_error(e, name, timeout))
        # Everything submitted before it has ended too (it ran inline only with nothing
        # unfinished, else behind the rest in the queue): nothing is left to drain.
        self._last = None
        if post is None:
            return ended(outputs)
        call = _Call(self, name, None, outputs, post)
        call._end(None)
        return Work([call], outputs)

    def _failed_here(self, name: str, outputs: List[torch.Tensor], e: BaseException) -> Work:
        """The ended ``Work`` of a blocking call that failed with ``e``."""
        call = _Call(self, name, None, outputs)
        call._end(e)
        self._last = call
        return Work([call], outputs)

    @staticmethod
    def _now(opts: object) -> bool:
        """Whether torch waits for the call as soon as the backend returns: its options say
        ``asyncOp=False`` (what ``torch.distributed``'s functions pass for a blocking call;
        torch's own default, and what DDP's reducer passes, is True)."""
        return opts is not None and getattr(opts, "asyncOp", True) is False

    def _run_timeout(self) -> Optional[float]:
        """The timeout to run a blocking call under: None when the communicator's own op
        timeout ends it first (torch's timeout is at least as long), else torch's."""
        return None if self._timeout >= self._comm_timeout else self._timeout

    def _run_error(self, e: BaseException, name: str, timeout: Optional[float]) -> BaseException:
        """The error a blocking call ended with, as the queued path reports it: a timeout
        that was this process group's (shorter than the communicator's) says so."""
        if timeout is not None and isinstance(e, getattr(chorus, "Timeout", ())):
            return _error(
                chorus.Timeout,
                f"[chorus:timeout] {name} did not finish within the process group's timeout "
                f"({timeout:g} s); the communicator was aborted",
            )
        return e

    def _start_coalescing(self, device: object = None) -> None:
        with self._lock:
            if self._batch is not None:
                raise RuntimeError("chorus: coalescing already started on this process group")
            self._batch = []
            self._batch_call = _Call(self, "coalesced", None, [])

    start_coalescing = _start_coalescing

    def _end_coalescing(self, device: object = None) -> Work:
        with self._lock:
            batch, call = self._batch, self._batch_call
            self._batch, self._batch_call = None, None
        if batch is None or call is None:
            raise RuntimeError("chorus: end_coalescing without start_coalescing")
        steps = [s for b in batch for s in b[1]]
        outputs = [t for b in batch for t in b[2]]
        posts = [b[4] for b in batch if b[4] is not None]
        call.name = "coalesced(" + ",".join(b[0] for b in batch) + ")"
        call.outputs[:] = outputs
        call.post = (lambda: [p() for p in posts]) if posts else None
        call.deadline = self._deadline()
        if call.ended:  # aborted during the block
            return Work([call])
        if steps:
            call.work = _link.submit(self._comm, steps, True)
            self._last = call
        else:
            call._end(None)
        return Work([call])

    end_coalescing = _end_coalescing

    # --- collectives --------------------------------------------------------------------

    def _reduce_steps(self, kind: str, t: torch.Tensor, red: _ops.Reduction, what: str, root: int = 0) -> Step:
        r = _ops.reducible(t, red, what)
        return Step(kind, r.tensor, r.tensor, r.red.name, r.red.factor, root)

    def allreduce(self, tensors: List[torch.Tensor], opts: object = None) -> Work:
        if type(tensors) is list and len(tensors) == 1 and self._batch is None:
            # The hot path (every DDP bucket, every dist.all_reduce): the same checks, with
            # no Step or list built in between.
            t = tensors[0]
            if opts is not None and getattr(opts, "asyncOp", True) is False:
                # ``dist.all_reduce(t)``: blocking, and (nearly always) a plain, contiguous
                # CPU tensor summed. The extension describes, checks and runs it in one
                # call, and returns False for anything else, which the general path below
                # checks and runs. Every line here is paid on every call: at 4 ranks on 2
                # cores each µs of Python costs several of latency.
                inner = self._inner
                if inner is not None and self._comm._group is None and getattr(opts, "reduceOp", None) == _SUM:
                    timeout = self._run_timeout()
                    try:
                        ran = inner.all_reduce_now(t, None, "sum", timeout)
                    except BaseException as e:  # the operation failed (or Ctrl-C aborted it)
                        return self._failed_here("all_reduce", tensors, self._run_error(e, "all_reduce", timeout))
                    if ran:
                        self._last = None  # as in _run_here
                        return ended(tensors)
            red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
            r = _ops.reducible(check_tensor(t, "tensors[0]"), red, "tensors[0]")
            rr = r.red  # bool tensors reduce as bytes, with max or min
            if self._now(opts) and t.is_cpu:
                # dist.all_reduce(async_op=False): torch waits at once, so run it here.
                return self._run_here(
                    "all_reduce",
                    tensors,
                    lambda timeout: _link.all_reduce_now(self._comm, r.tensor, r.dtype, rr.name, rr.factor, timeout),
                )
            work = _link.all_reduce(self._comm, r.tensor, r.dtype, rr.name, rr.factor)
            call = _Call(self, "all_reduce", work, tensors, None, self._deadline())
            self._last = call
            return Work([call])
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        ts = check_list(tensors, "tensors")
        steps = [self._reduce_steps("all_reduce", t, red, f"tensors[{i}]") for i, t in enumerate(ts)]
        return self._submit("all_reduce", steps, ts, tuple(s.send for s in steps), group=len(steps) > 1, now=self._now(opts))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: object = None) -> Work:
        ts = check_list(tensors, "tensors")
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        steps = [self._reduce_steps("all_reduce", t, red, f"tensors[{i}]") for i, t in enumerate(ts)]
        return self._submit("all_reduce_coalesced", steps, ts, tuple(s.send for s in steps), group=True, now=self._now(opts))

    def broadcast(self, tensors: List[torch.Tensor], opts: object = None) -> Work:
        ts = check_list(tensors, "tensors")
        root = self._root(opts, "rootRank")
        steps = []
        for t in ts:
            b = byte_view(t)
            steps.append(Step("broadcast", b, b, peer=root))
        return self._submit("broadcast", steps, ts, tuple(s.send for s in steps), group=len(steps) > 1, now=self._now(opts))

    def reduce(self, tensors: List[torch.Tensor], opts: object = None) -> Work:
        t = one(tensors, "tensors")
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        root = self._root(opts, "rootRank")
        step = self._reduce_steps("reduce", t, red, "tensors[0]", root)
        return self._submit("reduce", [step], [t], (step.send,), now=self._now(opts))

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: object = None) -> Work:
        inp = one(input_tensors, "input_tensors")
        if not isinstance(output_tensors, (list, tuple)) or len(output_tensors) != 1:
            raise ValueError("output_tensors: expected one list of tensors (one CPU device)")
        outs = self._per_rank(output_tensors[0], inp, "output_tensors[0]", "the input")
        return self._gather_list("all_gather", inp, outs, self._now(opts))

    def _gather_list(self, name: str, inp: torch.Tensor, outs: List[torch.Tensor], now: bool = False) -> Work:
        n = self.size()
        block = nbytes(inp)
        flat = torch.empty(n * block, dtype=torch.uint8, device=inp.device)
        step = Step("all_gather", byte_view(inp), flat)

        def post() -> None:
            for i, o in enumerate(outs):
                byte_view(o).copy_(flat[i * block : (i + 1) * block])

        return self._submit(name, [step], outs, (inp, flat, outs), post, now=now)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: object = None) -> Work:
        ins = check_list(input_tensors, "input_tensors")
        if not isinstance(output_lists, (list, tuple)) or len(output_lists) != len(ins):
            raise ValueError("output_lists: expected one list of tensors per input tensor")
        n = self.size()
        steps, keep, posts, outputs = [], [], [], []
        for k, inp in enumerate(ins):
            outs = self._per_rank(output_lists[k], inp, f"output_lists[{k}]", f"input_tensors[{k}]")
            block = nbytes(inp)
            flat = torch.empty(n * block, dtype=torch.uint8, device=inp.device)
            steps.append(Step("all_gather", byte_view(inp), flat))
            keep += [inp, flat, outs]
            outputs += outs
            posts.append((flat, outs, block))

        def post() -> None:
            for flat, outs, block in posts:
                for i, o in enumerate(outs):
                    byte_view(o).copy_(flat[i * block : (i + 1) * block])

        return self._submit("all_gather_coalesced", steps, outputs, tuple(keep), post, group=True, now=self._now(opts))

    def _gather_into(self, name: str, output: torch.Tensor, inp: torch.Tensor, what: str) -> Step:
        n = self.size()
        output = check_tensor(output, f"{what}output")
        inp = check_tensor(inp, f"{what}input")
        if output.dtype != inp.dtype:
            raise TypeError(f"{what}output: expected dtype {inp.dtype} (as the input), got {output.dtype}")
        if output.numel() != n * inp.numel():
            raise ValueError(
                f"{what}output: expected {n} x {inp.numel()} = {n * inp.numel()} elements "
                f"(world size x input), got {output.numel()}"
            )
        block = nbytes(inp)
        out = byte_view(output)
        if block and inp.data_ptr() == output.data_ptr() + self.rank() * block:
            return Step("all_gather", out, out)  # in place: the input is this rank's block
        if block and _overlaps(inp, output):
            inp = inp.clone()
        return Step("all_gather", byte_view(inp), out)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> Work:
        step = self._gather_into("all_gather_into_tensor", output, input, "")
        return self._submit("all_gather_into_tensor", [step], [output], (output, input, step.send), now=self._now(opts))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: object = None) -> Work:
        if len(outputs) != len(inputs):
            raise ValueError(f"outputs: expected {len(inputs)} tensors (one per input), got {len(outputs)}")
        steps = [self._gather_into("", o, i, f"[{k}] ") for k, (o, i) in enumerate(zip(outputs, inputs))]
        keep = tuple(outputs) + tuple(inputs) + tuple(s.send for s in steps)
        return self._submit("all_gather_into_tensor_coalesced", steps, list(outputs), keep, group=True, now=self._now(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: object = None) -> Work:
        out = one(output_tensors, "output_tensors")
        if not isinstance(input_lists, (list, tuple)) or len(input_lists) != 1:
            raise ValueError("input_tensors: expected one list of tensors (one CPU device)")
        ins = self._per_rank(input_lists[0], out, "input_tensors[0]", "the output")
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        flat = torch.cat([t.reshape(-1) for t in ins]) if ins else torch.empty(0, dtype=out.dtype, device=out.device)
        r_in = _ops.reducible(flat, red, "input_tensors[0]")
        r_out = _ops.reducible(out, red, "output_tensors[0]")
        step = Step("reduce_scatter", r_in.tensor, r_out.tensor, r_in.red.name, r_in.red.factor)
        return self._submit("reduce_scatter", [step], [out], (flat, out, r_in.tensor, r_out.tensor), now=self._now(opts))

    def _scatter_from(self, output: torch.Tensor, inp: torch.Tensor, red: _ops.Reduction, what: str) -> tuple:
        n = self.size()
        output = check_tensor(output, f"{what}output")
        inp = check_tensor(inp, f"{what}input")
        if output.dtype != inp.dtype:
            raise TypeError(f"{what}output: expected dtype {inp.dtype} (as the input), got {output.dtype}")
        if inp.numel() != n * output.numel():
            raise ValueError(
                f"{what}input: expected {n} x {output.numel()} = {n * output.numel()} elements "
                f"(world size x output), got {inp.numel()}"
            )
        block = nbytes(output)
        if block and _overlaps(inp, output):
            inp = inp.clone()
        r_in = _ops.reducible(inp, red, f"{what}input")
        r_out = _ops.reducible(output, red, f"{what}output")
        step = Step("reduce_scatter", r_in.tensor, r_out.tensor, r_in.red.name, r_in.red.factor)
        return step, (inp, output, r_in.tensor, r_out.tensor)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> Work:
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        step, keep = self._scatter_from(output, input, red, "")
        return self._submit("reduce_scatter_tensor", [step], [output], keep, now=self._now(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: object = None) -> Work:
        if len(outputs) != len(inputs):
            raise ValueError(f"outputs: expected {len(inputs)} tensors (one per input), got {len(outputs)}")
        red = _ops.reduction(opts if opts is not None else dist.ReduceOp.SUM)
        steps, keep = [], []
        for k, (o, i) in enumerate(zip(outputs, inputs)):
            s, kp = self._scatter_from(o, i, red, f"[{k}] ")
            steps.append(s)
            keep.append(kp)
        return self._submit("reduce_scatter_tensor_coalesced", steps, list(outputs), tuple(keep), group=True, now=self._now(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: object = None) -> Work:
        inp = one(input_tensors, "input_tensors")
        root = self._root(opts, "rootRank")
        n, block = self.size(), nbytes(inp)
        if self.rank() == root:
            if not isinstance(output_lists, (list, tuple)) or len(output_lists) != 1:
                raise ValueError("output_tensors: expected one list of tensors at the root")
            outs = self._per_rank(output_lists[0], inp, "output_tensors[0]", "the input")
            flat = torch.empty(n * block, dtype=torch.uint8, device=inp.device)

            def post() -> None:
                for i, o in enumerate(outs):
                    byte_view(o).copy_(flat[i * block : (i + 1) * block])

            step = Step("gather", byte_view(inp), flat, peer=root)
            return self._submit("gather", [step], outs, (inp, flat, outs), post, now=self._now(opts))
        if output_lists and any(len(x) for x in output_lists):
            raise ValueError("output_tensors: expected no output tensors on a rank that is not the root")
        step = Step("gather", byte_view(inp), None, peer=root)
        return self._submit("gather", [step], [], (inp,), now=self._now(opts))

    def gather_single(self, output: Optional[torch.Tensor], input: torch.Tensor, opts: object = None) -> Work:
        inp = check_tensor(input, "tensor")
        root = self._root(opts, "rootRank")
        n, block = self.size(), nbytes(inp)
        if self.rank() == root:
            out = check_tensor(output, "gather_tensor")
            if out.dtype != inp.dtype or out.numel() != n * inp.numel():
                raise ValueError(
                    f"gather_tensor: expected {n * inp.numel()} elements of {inp.dtype}, "
                    f"got {out.numel()} of {out.dtype}"
                )
            step = Step("gather", byte_view(inp), byte_view(out), peer=root)
            return self._submit("gather", [step], [out], (inp, out), now=self._now(opts))
        step = Step("gather", byte_view(inp), None, peer=root)
        return self._submit("gather", [step], [], (inp,), now=self._now(opts))

    def scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: object = None) -> Work:
        out = one(output_tensors, "output_tensors")
        root = self._root(opts, "rootRank")
        n, block = self.size(), nbytes(out)
        if self.rank() == root:
            if not isinstance(input_lists, (list, tuple)) or len(input_lists) != 1:
                raise ValueError("input_tensors: expected one list of tensors at the root")
            ins = self._per_rank(input_lists[0], out, "input_tensors[0]", "the output")
            flat = torch.cat([byte_view(t) for t in ins]) if ins else torch.empty(0, dtype=torch.uint8, device=out.device)
            step = Step("scatter", flat, byte_view(out), peer=root)
            return self._submit("scatter", [step], [out], (flat, out), now=self._now(opts))
        if input_lists and any(len(x) for x in input_lists):
            raise ValueError("input_tensors: expected no input tensors on a rank that is not the root")
        step = Step("scatter", None, byte_view(out), peer=root)
        return self._submit("scatter", [step], [out], (out,), now=self._now(opts))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int], input_split_sizes: List[int], opts: object = None) -> Work:
        n, r = self.size(), self.rank()
        out = check_tensor(output, "output")
        inp = check_tensor(input, "input")
        if out.dtype != inp.dtype:
            raise TypeError(f"output: expected dtype {inp.dtype} (as the input), got {out.dtype}")
        if not output_split_sizes and not input_split_sizes:
            if out.numel() != inp.numel() or inp.numel() % n:
                raise ValueError(
                    f"input/output: equal all_to_all needs the same number of elements, divisible "
                    f"by the world size {n}; got {inp.numel()} and {out.numel()}"
                )
            if _overlaps(inp, out) and inp.data_ptr() != out.data_ptr():
                inp = inp.clone()
            src = byte_view(inp)
            dst = byte_view(out)
            step = Step("all_to_all", src, dst if inp.data_ptr() != out.data_ptr() else src)
            return self._submit("all_to_all_single", [step], [output], (inp, out), now=self._now(opts))
        ins = _ops.split_sizes(input_split_sizes, inp, n, "input_split_sizes")
        outs = _ops.split_sizes(output_split_sizes, out, n, "output_split_sizes")
        if _overlaps(inp, out):
            inp = inp.clone()
        in_row = nbytes(inp) // max(inp.shape[0], 1) if inp.dim() else inp.element_size()
        out_row = nbytes(out) // max(out.shape[0], 1) if out.dim() else out.element_size()
        src, dst = byte_view(inp), byte_view(out)
        in_off = [sum(ins[:p]) * in_row for p in range(n)]
        out_off = [sum(outs[:p]) * out_row for p in range(n)]
        mine = ins[r] * in_row
        if outs[r] * out_row != mine:
            raise ValueError(
                f"input_split_sizes/output_split_sizes: this rank sends itself {ins[r]} rows "
                f"but expects {outs[r]}"
            )
        dst[out_off[r] : out_off[r] + mine].copy_(src[in_off[r] : in_off[r] + mine])
        return self._p2p_exchange(
            "all_to_all_single",
            [(p, src[in_off[p] : in_off[p] + ins[p] * in_row]) for p in range(n) if p != r],
            [(p, dst[out_off[p] : out_off[p] + outs[p] * out_row]) for p in range(n) if p != r],
            [output],
            (inp, out),
            self._now(opts),
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: object = None) -> Work:
        n, r = self.size(), self.rank()
        outs = check_list(output_tensors, "output_tensor_list")
        ins = check_list(input_tensors, "input_tensor_list")
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"all_to_all: expected {n} input and {n} output tensors, got {len(ins)} and {len(outs)}")
        if nbytes(outs[r]) != nbytes(ins[r]):
            raise ValueError(
                f"output_tensor_list[{r}]: expected {ins[r].numel()} elements (as input_tensor_list[{r}]), "
                f"got {outs[r].numel()}"
            )
        byte_view(outs[r]).copy_(byte_view(ins[r]))
        return self._p2p_exchange(
            "all_to_all",
            [(p, byte_view(ins[p])) for p in range(n) if p != r],
            [(p, byte_view(outs[p])) for p in range(n) if p != r],
            outs,
            (ins, outs),
            self._now(opts),
        )

    def _p2p_exchange(self, name: str, sends: list, recvs: list, outputs: list, keep: tuple, now: bool = False) -> Work:
        steps = [Step("send", b, None, peer=p) for p, b in sends if b.numel()]
        steps += [Step("recv", None, b, peer=p) for p, b in recvs if b.numel()]
        return self._submit(name, steps, outputs, keep + tuple(s.send if s.send is not None else s.recv for s in steps), group=True, now=now)

    def send(self, tensors: List[torch.Tensor], dst_rank: int, tag: int = 0) -> Work:
        # Tags are not matched (as with NCCL): messages between two ranks pair in order.
        t = one(tensors, "tensors")
        peer = self._peer(dst_rank, "dst")
        b = byte_view(t)
        return self._submit("send", [Step("send", b, None, peer=peer)], [t], (t, b))

    def recv(self, tensors: List[torch.Tensor], src_rank: int, tag: int = 0) -> Work:
        t = one(tensors, "tensors")
        peer = self._peer(src_rank, "src")
        b = byte_view(t)
        return self._submit("recv", [Step("recv", None, b, peer=peer)], [t], (t, b))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        raise ValueError("recv: the chorus backend needs the source rank (receiving from any source is not supported)")

    def barrier(self, opts: object = None) -> Work:
        return self._submit("barrier", [Step("barrier", None, None)], [], (), now=self._now(opts))

    # --- helpers ------------------------------------------------------------------------

    def _root(self, opts: object, attr: str) -> int:
        root = int(getattr(opts, attr, 0)) if opts is not None else 0
        if not 0 <= root < self.size():
            raise ValueError(f"root: expected a rank of the group (0..{self.size() - 1}), got {root}")
        return root

    def _peer(self, peer: int, what: str) -> int:
        peer = int(peer)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{what}: expected another rank of the group (0..{self.size() - 1}, not {self.rank()}), got {peer}")
        return peer

    def _per_rank(self, ts: object, ref: torch.Tensor, what: str, ref_what: str) -> List[torch.Tensor]:
        ts = check_list(ts, what)
        if len(ts) != self.size():
            raise ValueError(f"{what}: expected {self.size()} tensors (one per rank), got {len(ts)}")
        for i, t in enumerate(ts):
            same_layout(t, ref, f"{what}[{i}]", ref_what)
        return ts


class ProcessGroupChorus(ChorusGroup, dist.ProcessGroup):
    """A process group over one chorus communicator (CPU tensors)."""


class BackendChorus(ChorusGroup, _C10dBackend):
    """The same group as a torch ``Backend`` (what torch's shrink hook must return)."""


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + nbytes(b) and b0 < a0 + nbytes(a)
