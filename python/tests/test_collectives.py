"""The API matrix: every collective x a dtype subset x every op, at 2 and 4 ranks, on numpy
arrays and torch CPU tensors, checked against numpy; in place and out of place; zero copy
(the result lands in the caller's memory); async works completing in submission order."""

import importlib.util

import pytest

import harness

HAVE_TORCH = importlib.util.find_spec("torch") is not None

MATRIX = r'''
comm = connect()          # before importing torch, which can take seconds on a loaded machine
kind = ARGS["kind"]
if kind == "torch":
    import torch
    DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8",
              "float8_e4m3fn", "float8_e5m2"]
    def make(values, dtype):
        t = torch.tensor(np.asarray(values, dtype=np.float64))
        return t.to(getattr(torch, dtype))
    def empty(n, dtype):
        return torch.zeros(n, dtype=getattr(torch, dtype))
    def host(x):
        if isinstance(x, torch.Tensor):
            return x.to(torch.float64).numpy()
        return np.asarray(x, dtype=np.float64)
    def ptr(x):
        return x.data_ptr()
else:
    DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "uint32", "uint64"]
    def make(values, dtype):
        return np.asarray(values, dtype=np.float64).astype(dtype)
    def empty(n, dtype):
        return np.zeros(n, dtype=dtype)
    def host(x):
        return np.asarray(x, dtype=np.float64)
    def ptr(x):
        return x.__array_interface__["data"][0]

N = 6
def values(rank, n=N):
    # small integers: every reduction of up to 4 ranks is exact in every dtype, fp8 included
    return [((rank + i) % 3) + 1 for i in range(n)]

REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "prod": lambda xs: np.prod(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "avg": lambda xs: np.sum(xs, axis=0) / WORLD,
    "premul": lambda xs: np.sum(xs, axis=0) * 0.5,
}

def ops_for(dtype):
    ops = ["sum", "min", "max"]
    if not dtype.startswith("float8"):
        ops.append("prod")          # 3^4 = 81 is not exact in fp8
    ops.append("avg")
    if dtype.startswith("float"):
        ops.append("premul")
    return ops

def op_arg(op):
    return chorus.PreMulSum(0.5) if op == "premul" else op

def expect_reduce(op, dtype, n=N):
    xs = np.array([values(r, n) for r in range(WORLD)], dtype=np.float64)
    out = REDUCE[op](xs)
    if not dtype.startswith(("float", "bfloat")):
        out = np.trunc(out)        # integer avg truncates toward zero
    return out

failures = []
checked = 0
def check(name, got, want):
    global checked
    checked += 1
    if not isinstance(got, np.ndarray) or got.dtype != np.float64:
        # the exact result rounded to the buffer's type (9 is 8 in fp8 e5m2)
        name_of = str(got.dtype).replace("torch.", "")
        want = host(make(np.asarray(want, dtype=np.float64), name_of))
    got = host(got)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-2, atol=1e-2):
        failures.append(f"{name}: got {got.tolist()} want {want.tolist()}")

R = comm.rank
for dtype in DTYPES:
    for op in ops_for(dtype):
        want = expect_reduce(op, dtype)
        # all_reduce, in place: the result lands in a's own memory
        a = make(values(R), dtype); p = ptr(a)
        comm.all_reduce(a, op=op_arg(op))
        check(f"all_reduce in place {dtype} {op}", a, want)
        if ptr(a) != p:
            failures.append(f"all_reduce moved {dtype}")
        # out of place
        a = make(values(R), dtype); out = empty(N, dtype); p = ptr(out)
        comm.all_reduce(a, out=out, op=op_arg(op))
        check(f"all_reduce out {dtype} {op}", out, want)
        check(f"all_reduce input untouched {dtype} {op}", a, values(R))
        if ptr(out) != p:
            failures.append(f"all_reduce out moved {dtype}")
        # reduce to the last rank
        root = WORLD - 1
        a = make(values(R), dtype); out = empty(N, dtype)
        comm.reduce(a, out=out, op=op_arg(op), root=root)
        if R == root:
            check(f"reduce {dtype} {op}", out, want)
        else:
            check(f"reduce non-root untouched {dtype} {op}", out, np.zeros(N))
        a = make(values(R), dtype)
        comm.reduce(a, op=op_arg(op), root=root)
        check(f"reduce in place {dtype} {op}", a, want if R == root else values(R))
        # reduce_scatter: block i of every rank's input
        big = make(values(R, N * WORLD), dtype); out = empty(N, dtype)
        comm.reduce_scatter(big, out=out, op=op_arg(op))
        full = expect_reduce(op, dtype, N * WORLD)
        check(f"reduce_scatter {dtype} {op}", out, full[R * N:(R + 1) * N])
        big = make(values(R, N * WORLD), dtype)
        comm.reduce_scatter(big, op=op_arg(op))
        check(f"reduce_scatter in place {dtype} {op}", big[R * N:(R + 1) * N], full[R * N:(R + 1) * N])

    # broadcast from rank 1, in place and out of place
    a = make(values(R), dtype)
    comm.broadcast(a, root=1)
    check(f"broadcast {dtype}", a, values(1))
    a = make(values(R), dtype); out = empty(N, dtype)
    comm.broadcast(a, root=1, out=out)
    check(f"broadcast out {dtype}", out, values(1))
    # all_gather
    out = empty(N * WORLD, dtype)
    comm.all_gather(make(values(R), dtype), out)
    check(f"all_gather {dtype}", out, sum((values(r) for r in range(WORLD)), []))
    buf = empty(N * WORLD, dtype)
    buf[R * N:(R + 1) * N] = make(values(R), dtype)
    comm.all_gather(buf)
    check(f"all_gather in place {dtype}", buf, sum((values(r) for r in range(WORLD)), []))
    # all_to_all: block j of rank i goes to rank j's block i
    # (block j of rank i is [i + 1, j + 1]: small values, exact in fp8 too)
    send = make([v for j in range(WORLD) for v in (R + 1, j + 1)], dtype)
    out = empty(2 * WORLD, dtype)
    comm.all_to_all(send, out)
    check(f"all_to_all {dtype}", out, [v for i in range(WORLD) for v in (i + 1, R + 1)])
    # gather to rank 0, scatter from rank 0
    out = empty(N * WORLD, dtype) if R == 0 else None
    comm.gather(make(values(R), dtype), out, root=0)
    if R == 0:
        check(f"gather {dtype}", out, sum((values(r) for r in range(WORLD)), []))
    src = make(list(range(2 * WORLD)), dtype) if R == 0 else None
    out = empty(2, dtype)
    comm.scatter(src, out, root=0)
    check(f"scatter {dtype}", out, [2 * R, 2 * R + 1])
    # send/recv around the ring, as one group
    got = empty(N, dtype)
    with comm.group():
        comm.send(make(values(R), dtype), (R + 1) % WORLD)
        comm.recv(got, (R - 1) % WORLD)
    check(f"send/recv {dtype}", got, values((R - 1) % WORLD))

# async: works complete in submission order, whatever order they are waited on
bufs = [make([R + k] * 1024, "float32") for k in range(8)]
works = [comm.all_reduce(b, async_op=True) for b in bufs]
works[-1].wait()
order_ok = all(w.is_completed() for w in works)
for w in reversed(works):
    assert w.wait() is True
for k, b in enumerate(bufs):
    check(f"async {k}", b, [sum(r + k for r in range(WORLD))] * 1024)
# a Work dropped unfinished, with the only other reference to its buffer: the operation
# still completes on memory it keeps alive, and later collectives are unaffected
comm.all_reduce(make([1] * 65536, "float32"), async_op=True)
a = make([R] * 8, "float32")
comm.all_reduce(a)
check("after a dropped work", a, [sum(range(WORLD))] * 8)
comm.barrier()
comm.destroy()
result(failures=failures, checked=checked, order_ok=order_ok)
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_matrix(world, kind):
    if kind == "torch" and not HAVE_TORCH:
        pytest.skip("torch is not installed: the matrix ran on numpy arrays only")
    results = harness.run(MATRIX, world, args={"kind": kind}, timeout=280,
                          config={"init_timeout": "120s"})
    for rank, r in enumerate(results):
        assert r is not None
        assert r["failures"] == [], f"rank {rank}: {r['failures'][:10]}"
        assert r["checked"] > 100
        assert r["order_ok"], f"rank {rank}: the last work completed before an earlier one"
