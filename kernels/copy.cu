// chorus kernels, part 3 of 4: copy.
//
// chorus_copy(dst, src, bytes) copies non-overlapping regions: 16-byte vectors when both
// pointers and the length allow, bytes for the rest. The device uses it for copy, pack,
// unpack and taking data out of a link's slots, and chorus_put (the same copy behind a
// link's skip word) for putting data in, so every byte the engine moves goes through kernels
// launched on the rank's own streams; kernels/check.sh measures it beside cuMemcpyDtoD.

CHORUS_DEV void chorus_copy_body(void* dst_, const void* src_, u64 bytes) {
    u8* dst = (u8*)dst_;
    const u8* src = (const u8*)src_;
    const u64 first = chorus_thread_index();
    const u64 stride = chorus_thread_count();
    u64 done = 0;
    if ((((u64)dst_ | (u64)src_) & 15ull) == 0ull) {
        const u64 nv = bytes / 16ull;
        uint4* dv = (uint4*)dst_;
        const uint4* sv = (const uint4*)src_;
        for (u64 i = first; i < nv; i += stride) {
            dv[i] = sv[i];
        }
        done = nv * 16ull;
    }
    for (u64 i = done + first; i < bytes; i += stride) {
        dst[i] = src[i];
    }
}

extern "C" __global__ void chorus_copy(void* dst, const void* src, u64 bytes) {
    chorus_copy_body(dst, src, bytes);
}

// A link's copy into its slot: skipped once the send stream's `skip` word is set (wait.cu
// says why). `skip` is device memory written only by kernels earlier on the same stream.
extern "C" __global__ void chorus_put(void* dst, const void* src, u64 bytes, const u64* skip) {
    if (*(const volatile u64*)skip != 0ull) {
        return;
    }
    chorus_copy_body(dst, src, bytes);
}
