// chorus kernels, part 4 of 4: waiting for a peer, and telling a peer.
//
// Ranks that share a GPU hand each other data through slots in device memory. A sender
// copies into a slot and then raises a counter (chorus_signal); the receiver's stream runs
// chorus_wait until the counter reaches the value it needs, then copies the slot out.
//
// A peer that never arrives would leave chorus_wait spinning forever, and with it every
// kernel queued behind it on that stream: aborting could not retire them and the context
// would be lost (seeds/002). So chorus_wait also polls an abort word that lives in mapped
// pinned host memory (cuMemHostAlloc with DEVICEMAP): the host sets it with a plain store,
// and the kernel returns within a poll interval. It then records the abort in `retired`
// (mapped host memory too), so the host knows the data that follows is not the peer's.

extern "C" __global__ void chorus_wait(const u64* flag, u64 target, const u32* abort_word,
                                       u64* retired, u64 generation) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const volatile u64* f = (const volatile u64*)flag;
    const volatile u32* a = (const volatile u32*)abort_word;
    for (;;) {
        if (*f >= target) {
            // Order the reads of the slot that follow (in later kernels) after the flag.
            __threadfence();
            return;
        }
        if (*a != 0u) {
            *(volatile u64*)retired = generation;
            __threadfence_system();
            return;
        }
        // Leave the memory system to the copies; the abort word is across PCIe anyway.
        __nanosleep(256);
    }
}

// Raise a peer-visible counter after the copies queued before it on this stream. Kernels on
// one stream run in order, so everything they wrote is complete; the fence makes it visible
// before the counter is.
extern "C" __global__ void chorus_signal(u64* flag, u64 value) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    __threadfence_system();
    *(volatile u64*)flag = value;
    __threadfence_system();
}
