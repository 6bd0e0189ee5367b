// chorus kernels, part 4 of 4: waiting for a peer, and telling a peer.
//
// Ranks that share a GPU hand each other data through slots in device memory. A sender
// copies into a slot and then raises a counter (chorus_signal); the receiver's stream runs
// chorus_wait until the counter reaches the value it needs, then copies the slot out.
//
// A peer that never arrives would leave chorus_wait spinning forever, and with it every
// kernel queued behind it on that stream: aborting could not retire them and the context
// would be lost (seed 002). So chorus_wait also polls an abort word that lives in mapped
// pinned host memory (cuMemHostAlloc with DEVICEMAP): the host sets it with a plain store,
// and the kernel returns within a poll interval. It then records the first retired
// `generation` twice: in `retired` (mapped host memory: the host learns which data is not
// the peer's) and in `retired_dev` (device memory: later kernels on the stream read it
// cheaply). The abort word is one-way, so every later wait on that link retires too, and
// "the first retired generation" says exactly which messages are suspect.

extern "C" __global__ void chorus_wait(const u64* flag, u64 target, const u32* abort_word,
                                       u64* retired, u64 generation, u64* retired_dev) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const volatile u64* f = (const volatile u64*)flag;
    const volatile u32* a = (const volatile u32*)abort_word;
    for (;;) {
        // The flag first: data that has arrived is good even if an abort came after it.
        if (*f >= target) {
            // Order the reads of the slot that follow (in later kernels) after the flag.
            __threadfence();
            return;
        }
        if (*a != 0u) {
            volatile u64* r = (volatile u64*)retired;
            if (*r == 0ull) {
                *r = generation;
            }
            volatile u64* d = (volatile u64*)retired_dev;
            if (*d == 0ull) {
                *d = generation;
            }
            __threadfence_system();
            return;
        }
        // Leave the memory system to the copies; the abort word is across PCIe anyway.
        __nanosleep(256);
    }
}

// A sender's guard. Once a send-side wait has retired, the slot it waited for may still be
// unread by the peer: overwriting it, or raising `ready` past it, would hand the peer
// garbage it cannot tell from data. So the puts and signals of a link's send stream are
// skipped once `skip` (that link's retired_dev for sends) is set, and the peer's waits
// retire in turn when it learns of the abort. chorus_gate sets `skip` before forwarding a
// payload that came in through a link whose receive waits retired (`taint`, that link's
// retired_dev for receives) at or before the payload's last message `taint_gen`.

extern "C" __global__ void chorus_gate(u64* skip, const u64* taint, u64 taint_gen) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    u64 t = *(const volatile u64*)taint;
    volatile u64* s = (volatile u64*)skip;
    if (t != 0ull && t <= taint_gen && *s == 0ull) {
        *s = taint_gen;
        __threadfence();
    }
}

// Raise a peer-visible counter after the copies queued before it on this stream, unless
// `skip` (null for never) is set. Kernels on one stream run in order, so everything they
// wrote is complete; the fence makes it visible before the counter is.
extern "C" __global__ void chorus_signal(u64* flag, u64 value, const u64* skip) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    if (skip != 0 && *(const volatile u64*)skip != 0ull) {
        return;
    }
    __threadfence_system();
    *(volatile u64*)flag = value;
    __threadfence_system();
}
