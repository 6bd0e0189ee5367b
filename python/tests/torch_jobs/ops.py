"""Every operation the chorus backend offers, against gloo's result on the same ranks.

Run under torchrun: the default group is chorus, a gloo group over the same ranks is the
reference. Each check prints nothing when it passes; a failure raises, which fails the
rank and so the launch. Rank 0 writes the names of the checks run to $OUT/ops.json.
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import chorus
import chorus.torch  # noqa: F401  (registers the backend)

dist.init_process_group("chorus", timeout=timedelta(seconds=60))
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
assert dist.get_backend() == "chorus", dist.get_backend()
checked = []
checks = []


def check(name):
    def wrap(fn):
        checks.append((name, fn))
        return fn

    return wrap


def same(a, b, what):
    if isinstance(a, torch.Tensor):
        if a.dtype.is_floating_point:
            ok = torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
        else:
            ok = torch.equal(a, b)
        if not ok:
            raise AssertionError(f"rank {rank}: {what}: chorus {a} != gloo {b}")
    elif a != b:
        raise AssertionError(f"rank {rank}: {what}: chorus {a!r} != gloo {b!r}")


def both(fn):
    """fn(group) on chorus and on gloo, returning what each made."""
    return fn(None), fn(gloo)


def data(k, dtype=torch.float32, shape=(5,), of=None):
    g = torch.Generator().manual_seed(1000 * (rank if of is None else of) + k)
    t = torch.randint(1, 6, shape, generator=g)
    return t.to(dtype)


DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16]


@check("all_reduce")
def _():
    for k, dtype in enumerate(DTYPES):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            a, b = both(lambda g: _ar(data(k, dtype), op, g))
            same(a, b, f"all_reduce {dtype} {op}")


def _ar(t, op, g):
    dist.all_reduce(t, op=op, group=g)
    return t


@check("all_reduce_blocking_work")
def _():
    # A blocking SUM all-reduce of a plain CPU tensor takes the backend's shortest path
    # (run inline, returning a bare ended Work); what it returns still behaves as an
    # ended Work, and every other case (another op, a non-contiguous tensor, a Parameter)
    # still gets the general path's result or error.
    pg = dist.distributed_c10d._get_default_group()
    inline = pg.comm._c._calls()[0]
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.asyncOp = False
    t = data(90)
    ref = t.clone()
    dist.all_reduce(ref, group=gloo)
    w = pg.allreduce([t], opts)
    same(t, ref, "blocking all_reduce")
    assert pg.comm._c._calls()[0] == inline + 1, "the blocking all_reduce did not run inline"
    assert w.is_completed() and w.is_success() and w.exception() is None and w.wait(), w
    assert w.result()[0] is t, "result() is not the reduced tensor"
    fut = w.get_future()
    assert fut.done() and fut.value()[0] is t, fut
    u = data(95)
    w2 = pg.allreduce([u], opts)
    assert w.result()[0] is t and w2.result()[0] is u, "a kept Work's result() is another call's"
    half = data(91, shape=(6,))[::2]
    try:
        dist.all_reduce(half)
    except ValueError as e:
        assert "contiguous" in str(e), e
    else:
        raise AssertionError("a non-contiguous tensor was accepted")
    for make in (lambda: data(92, torch.float64), lambda: torch.nn.Parameter(data(93), requires_grad=False)):
        a, b = both(lambda g: _ar(make(), dist.ReduceOp.SUM, g))
        same(a, b, f"blocking all_reduce of {type(a).__name__} {a.dtype}")
    a, b = both(lambda g: _ar(data(94), dist.ReduceOp.MAX, g))
    same(a, b, "blocking all_reduce MAX")


@check("all_reduce_avg_premul")
def _():
    # gloo has neither: the reference is the sum.
    t = data(1, torch.float64)
    ref = t.clone()
    dist.all_reduce(ref, group=gloo)
    avg = t.clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    same(avg, ref / n, "AVG")
    pre = t.clone()
    dist.all_reduce(pre, op=dist._make_nccl_premul_sum(0.5))
    same(pre, ref * 0.5, "PREMUL_SUM")


@check("all_reduce_bool_complex")
def _():
    flags = torch.tensor([rank == 0, False, True])
    dist.all_reduce(flags)
    same(flags, torch.tensor([True, False, True]), "bool sum is any")
    z = torch.tensor([1 + 2j, rank * 1j], dtype=torch.complex64)
    dist.all_reduce(z)
    same(z, torch.tensor([n + 2j * n, 1j * sum(range(n))], dtype=torch.complex64), "complex sum")


@check("all_reduce_async_future")
def _():
    t = data(2)
    ref = t.clone()
    dist.all_reduce(ref, group=gloo)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    out = fut.wait()
    assert w.is_completed() and w.is_success() and w.exception() is None
    same(out[0], ref, "future value")
    same(t, ref, "async all_reduce")


@check("all_reduce_coalesced")
def _():
    def go(g):
        ts = [data(3), data(4, torch.float32, (2, 3))]
        with dist._coalescing_manager(group=g):
            for t in ts:
                dist.all_reduce(t, group=g)
        return ts

    a, b = both(go)
    for x, y in zip(a, b):
        same(x, y, "coalesced all_reduce")
    ts = [data(5), data(6)]
    dist.all_reduce_coalesced(ts)
    ref = [data(5), data(6)]
    dist.all_reduce_coalesced(ref, group=gloo)
    for x, y in zip(ts, ref):
        same(x, y, "all_reduce_coalesced")


@check("broadcast")
def _():
    for root in range(n):
        a, b = both(lambda g: _bc(data(7, torch.int64, (3, 2)), root, g))
        same(a, b, f"broadcast root {root}")


def _bc(t, root, g):
    dist.broadcast(t, src=root, group=g)
    return t


@check("all_gather")
def _():
    def go(g):
        out = [torch.zeros(2, 3) for _ in range(n)]
        dist.all_gather(out, data(8, shape=(2, 3)), group=g)
        return torch.stack(out)

    same(*both(go), "all_gather")


@check("all_gather_into_tensor")
def _():
    def go(g):
        out = torch.zeros(n * 4, dtype=torch.int32)
        dist.all_gather_into_tensor(out, data(9, torch.int32, (4,)), group=g)
        return out

    same(*both(go), "all_gather_into_tensor")
    # In place, as FSDP2 does it: the input is this rank's block of the output.
    out = torch.zeros(n * 4)
    out[rank * 4 : (rank + 1) * 4] = data(10, shape=(4,))
    dist.all_gather_into_tensor(out, out[rank * 4 : (rank + 1) * 4])
    ref = torch.zeros(n * 4)
    dist.all_gather_into_tensor(ref, data(10, shape=(4,)), group=gloo)
    same(out, ref, "all_gather_into_tensor in place")


@check("all_gather_into_tensor_coalesced")
def _():
    def go(g):
        outs = [torch.zeros(n * 3), torch.zeros(n * 2, dtype=torch.int64)]
        ins = [data(11, shape=(3,)), data(12, torch.int64, (2,))]
        with dist._coalescing_manager(group=g):
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i, group=g)
        return outs

    a, b = both(go)
    for x, y in zip(a, b):
        same(x, y, "all_gather_into_tensor coalesced")


@check("all_gather_coalesced")
def _():
    outs = [[torch.zeros(2) for _ in range(n)], [torch.zeros(3) for _ in range(n)]]
    dist.all_gather_coalesced(outs, [data(13, shape=(2,)), data(14, shape=(3,))])
    for k, (shape, dtype) in enumerate([((2,), torch.float32), ((3,), torch.float32)]):
        ref = [torch.zeros(shape, dtype=dtype) for _ in range(n)]
        dist.all_gather(ref, data(13 + k, dtype, shape), group=gloo)
        same(torch.stack(outs[k]), torch.stack(ref), "all_gather_coalesced")


@check("reduce_scatter")
def _():
    def go(g):
        out = torch.zeros(3)
        dist.reduce_scatter(out, [data(15 + i, shape=(3,)) for i in range(n)], group=g)
        return out

    same(*both(go), "reduce_scatter")


@check("reduce_scatter_tensor")
def _():
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        def go(g):
            out = torch.zeros(2, dtype=torch.float64)
            dist.reduce_scatter_tensor(out, data(20, torch.float64, (n * 2,)), op=op, group=g)
            return out

        same(*both(go), f"reduce_scatter_tensor {op}")


@check("reduce_scatter_tensor_coalesced")
def _():
    def go(g):
        outs = [torch.zeros(2), torch.zeros(1, dtype=torch.int32)]
        ins = [data(21, shape=(n * 2,)), data(22, torch.int32, (n,))]
        with dist._coalescing_manager(group=g):
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, group=g)
        return outs

    a, b = both(go)
    for x, y in zip(a, b):
        same(x, y, "reduce_scatter_tensor coalesced")


@check("reduce")
def _():
    for root in range(n):
        def go(g):
            t = data(23)
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM, group=g)
            return t

        a, b = both(go)
        if rank == root:
            same(a, b, f"reduce root {root}")


@check("gather")
def _():
    root = n - 1
    def go(g):
        out = [torch.zeros(3) for _ in range(n)] if rank == root else None
        dist.gather(data(24, shape=(3,)), out, dst=root, group=g)
        return torch.stack(out) if out else None

    a, b = both(go)
    if rank == root:
        same(a, b, "gather")


@check("scatter")
def _():
    root = 1 % n
    def go(g):
        out = torch.zeros(2, dtype=torch.int64)
        ins = [data(25 + i, torch.int64, (2,)) for i in range(n)] if rank == root else None
        dist.scatter(out, ins, src=root, group=g)
        return out

    same(*both(go), "scatter")


@check("all_to_all_single")
def _():
    def go(g):
        out = torch.zeros(n * 2)
        dist.all_to_all_single(out, data(30, shape=(n * 2,)), group=g)
        return out

    same(*both(go), "all_to_all_single")


@check("all_to_all_single_uneven")
def _():
    # Rank r sends (r + p) % 3 rows (of 2 columns) to rank p: some zero, all different.
    ins = [(rank + p) % 3 for p in range(n)]
    outs = [(p + rank) % 3 for p in range(n)]
    def go(g):
        out = torch.full((sum(outs), 2), -1.0)
        dist.all_to_all_single(out, data(31, shape=(sum(ins), 2)), outs, ins, group=g)
        return out

    same(*both(go), "all_to_all_single uneven")


@check("all_to_all")
def _():
    # Sizes differ per pair (gloo refuses that, so the reference is what each peer sent).
    outs = [torch.zeros(p + 1 + rank) for p in range(n)]
    ins = [data(32 + p, shape=(rank + 1 + p,)) for p in range(n)]
    dist.all_to_all(outs, ins)
    want = [data(32 + rank, shape=(p + 1 + rank,), of=p) for p in range(n)]
    same(torch.cat(outs), torch.cat(want), "all_to_all")


@check("send_recv")
def _():
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    if rank % 2 == 0:
        dist.send(data(40, torch.int64), nxt)
        got = torch.zeros(5, dtype=torch.int64)
        dist.recv(got, prv)
    else:
        got = torch.zeros(5, dtype=torch.int64)
        dist.recv(got, prv)
        dist.send(data(40, torch.int64), nxt)
    want = torch.randint(1, 6, (5,), generator=torch.Generator().manual_seed(1000 * prv + 40))
    same(got, want, "send/recv")


@check("isend_irecv")
def _():
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(5)
    reqs = [dist.irecv(got, prv), dist.isend(data(41), nxt)] if rank % 2 else [dist.isend(data(41), nxt), dist.irecv(got, prv)]
    for r in reqs:
        r.wait()
    same(got, torch.randint(1, 6, (5,), generator=torch.Generator().manual_seed(1000 * prv + 41)).float(), "isend/irecv")


@check("batch_isend_irecv")
def _():
    def go(g):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        got = [torch.zeros(4), torch.zeros(4)]
        ops = [
            dist.P2POp(dist.isend, data(42, shape=(4,)), nxt, group=g),
            dist.P2POp(dist.irecv, got[0], prv, group=g),
            dist.P2POp(dist.irecv, got[1], nxt, group=g),
            dist.P2POp(dist.isend, data(43, shape=(4,)), prv, group=g),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return torch.stack(got)

    same(*both(go), "batch_isend_irecv")


@check("barrier")
def _():
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait(timeout=timedelta(seconds=30))


@check("object_collectives")
def _():
    obj = {"rank": rank, "payload": list(range(rank + 1)), "text": "x" * (rank * 7)}
    got = [None] * n
    dist.all_gather_object(got, obj)
    ref = [None] * n
    dist.all_gather_object(ref, obj, group=gloo)
    same(got, ref, "all_gather_object")
    objs = [{"a": 1}, [2, 3], "four"] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0)
    same(objs, [{"a": 1}, [2, 3], "four"], "broadcast_object_list")
    root = n - 1
    gathered = [None] * n if rank == root else None
    dist.gather_object(obj, gathered, dst=root)
    if rank == root:
        same(gathered, ref, "gather_object")
    out = [None]
    dist.scatter_object_list(out, [("to", p, "x" * p) for p in range(n)] if rank == 0 else None, src=0)
    same(out[0], ("to", rank, "x" * rank), "scatter_object_list")


@check("new_group")
def _():
    members = list(range(1, n))
    sub_gloo = dist.new_group(members, backend="gloo")
    # An async operation still queued on the parent when the split's all-gather starts.
    pending = dist.all_reduce(torch.ones(1 << 16), async_op=True)
    made = {}
    for how, kw in (
        ("split", {"timeout": timedelta(seconds=60)}),  # the parent's op timeout: split
        ("rendezvous", {}),  # torch's default 30 min is longer than the parent's: the store
        ("local", {"use_local_synchronization": True}),  # non-members never call: the store
    ):
        dist.barrier()
        t0 = time.monotonic()
        made[how] = (dist.new_group(members, **kw), time.monotonic() - t0)
    pending.wait()
    if rank == 1:
        with open(os.path.join(os.environ["OUT"], "new_group.json"), "w") as f:
            json.dump({how: t for how, (_, t) in made.items()}, f)
    if rank not in members:
        for how, (sub, _) in made.items():
            assert sub is dist.GroupMember.NON_GROUP_MEMBER, (how, sub)
        return
    for how, (sub, _) in made.items():
        assert isinstance(sub, chorus.torch.ProcessGroupChorus), (how, type(sub))
        assert sub.created_by == ("split" if how == "split" else "rendezvous"), (how, sub.created_by)
        assert sub.comm is not dist.group.WORLD.comm
        a, b = data(50), data(50)
        dist.all_reduce(a, group=sub)
        dist.all_reduce(b, group=sub_gloo)
        same(a, b, f"new_group ({how}) all_reduce")
        same(dist.get_rank(sub), rank - 1, f"group rank ({how})")
        c = torch.zeros(len(members) * 2)
        dist.all_gather_into_tensor(c, data(51, shape=(2,)), group=sub)
        d = torch.zeros(len(members) * 2)
        dist.all_gather_into_tensor(d, data(51, shape=(2,)), group=sub_gloo)
        same(c, d, f"new_group ({how}) all_gather")
        obj = [None] * len(members)
        dist.all_gather_object(obj, rank, group=sub)
        same(obj, members, f"new_group ({how}) all_gather_object")


@check("unsupported_ops")
def _():
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        t = torch.ones(3, dtype=torch.int32)
        try:
            dist.all_reduce(t, op=op)
        except ValueError as e:
            assert "not supported" in str(e) and op.name in str(e), e
        else:
            raise AssertionError(f"{op} was accepted")
        assert torch.equal(t, torch.ones(3, dtype=torch.int32)), "a refused op touched the tensor"
    for bad, why in (
        (torch.ones(4, 4).t(), "contiguous"),
        (torch.ones(3, dtype=torch.int16), "int16"),
    ):
        try:
            dist.all_reduce(bad)
        except (ValueError, TypeError) as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"{why}: accepted")
    try:
        dist.all_gather([torch.zeros(3)] * (n - 1), torch.zeros(3))
    except ValueError as e:
        assert "one per rank" in str(e), e
    else:
        raise AssertionError("a short all_gather output list was accepted")
    try:
        dist.all_to_all_single(torch.zeros(n), torch.zeros(n), [1] * n, [2] * n)
    except ValueError as e:
        assert "split sizes" in str(e), e
    else:
        raise AssertionError("split sizes that do not add up were accepted")
    # The communicator is still usable after refused calls: nothing was submitted.
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(n)), "after refusals")


for name, fn in checks:
    fn()
    checked.append(name)
dist.barrier()
if rank == 0:
    with open(os.path.join(os.environ["OUT"], "ops.json"), "w") as f:
        json.dump(checked, f)
dist.destroy_process_group()
print(f"rank {rank}: {len(checked)} checks passed", file=sys.stderr)
