// Lets the kernel sources compile as plain C++ on a machine without a GPU, so that
// `cargo test -p chorus-cuda` can run their arithmetic (conversions, reductions, scaling,
// copies) against the Rust reference. Each "thread" of a launch runs to completion in turn
// (kernels/host_harness.cpp), which is faithful for kernels whose threads share nothing:
// every kernel here. chorus_wait runs here only when it returns at once (its flag reached,
// or its abort word set); its spinning is exercised on the GPU only.
#pragma once
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline

struct chorus_dim3 {
    unsigned x, y, z;
};
static chorus_dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline void __threadfence() {}
inline void __threadfence_system() {}
inline void __nanosleep(unsigned) {}
