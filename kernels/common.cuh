// chorus kernels, part 1 of 4: types and element conversions.
//
// The Rust side (crates/chorus-cuda/src/source.rs) hands NVRTC one translation unit made of
// common.cuh, reduce.cu, copy.cu and wait.cu, in that order, so the .cu files include
// nothing. NVRTC has no system headers here, hence the home-made fixed-width types.
//
// The same text also compiles as plain C++ with kernels/host_shim.h in front of it, which is
// how `cargo test -p chorus-cuda` checks the arithmetic below on a machine without a GPU.
// Anything guarded by __CUDA_ARCH__ is the device's own instruction for the same conversion
// and is checked only on a GPU (kernels/check.sh).

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define CHORUS_DEV __device__ __forceinline__

CHORUS_DEV u32 chorus_f32_bits(float f) { return __float_as_uint(f); }
CHORUS_DEV float chorus_bits_f32(u32 u) { return __uint_as_float(u); }

// ---- IEEE binary16 ------------------------------------------------------------------------

// Software conversions: exact, round-to-nearest-even, NaN payloads kept (quiet bit set), the
// same results as the `half` crate.
CHORUS_DEV float chorus_f16_to_f32_sw(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 exp = ((u32)h >> 10) & 0x1fu;
    u32 man = (u32)h & 0x3ffu;
    if (exp == 0x1fu) {
        return chorus_bits_f32(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0u) {
        // Subnormal: man * 2^-24, exact in f32.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return chorus_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

CHORUS_DEV u16 chorus_f32_to_f16_sw(float f) {
    u32 x = chorus_f32_bits(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (u16)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) {
        // At or past the midpoint between 65504 and 65536: rounds to infinity.
        return (u16)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {
        // Below the smallest normal half (2^-14): a subnormal in units of 2^-24.
        if (ax < 0x33000000u) {
            return (u16)sign;
        }
        u32 e = ax >> 23;
        u32 m = (ax & 0x7fffffu) | 0x800000u;
        u32 shift = 126u - e;
        u32 r = m >> shift;
        u32 rem = m & ((1u << shift) - 1u);
        u32 half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) {
            r += 1u;
        }
        return (u16)(sign | r);
    }
    u32 r = (ax >> 13) - (112u << 10);
    u32 rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
        r += 1u;
    }
    return (u16)(sign | r);
}

CHORUS_DEV float chorus_f16_to_f32(u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return chorus_f16_to_f32_sw(h);
#endif
}

CHORUS_DEV u16 chorus_f32_to_f16(float f) {
#if defined(__CUDA_ARCH__)
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return chorus_f32_to_f16_sw(f);
#endif
}

// ---- bfloat16 -----------------------------------------------------------------------------

CHORUS_DEV float chorus_bf16_to_f32(u16 h) { return chorus_bits_f32((u32)h << 16); }

CHORUS_DEV u16 chorus_f32_to_bf16(float f) {
    u32 x = chorus_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x0040u);
    }
    // Round to nearest even on the 16 bits that are dropped.
    u32 rounded = x + 0x7fffu + ((x >> 16) & 1u);
    return (u16)(rounded >> 16);
}

// ---- fp8 (OCP E4M3FN and E5M2) ------------------------------------------------------------

// Decode: every code maps exactly to an f32.
CHORUS_DEV float chorus_e4m3_to_f32_sw(u8 b) {
    u32 sign = ((u32)b & 0x80u) << 24;
    u32 e = ((u32)b >> 3) & 0xfu;
    u32 m = (u32)b & 0x7u;
    if (e == 0xfu && m == 0x7u) {
        return chorus_bits_f32(sign | 0x7fc00000u);
    }
    if (e == 0u) {
        float v = (float)m * 0.001953125f;  // m * 2^-9
        return sign ? -v : v;
    }
    return chorus_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

CHORUS_DEV float chorus_e5m2_to_f32_sw(u8 b) {
    u32 sign = ((u32)b & 0x80u) << 24;
    u32 e = ((u32)b >> 2) & 0x1fu;
    u32 m = (u32)b & 0x3u;
    if (e == 0x1fu) {
        return chorus_bits_f32(sign | 0x7f800000u | (m << 21) | (m ? 0x400000u : 0u));
    }
    if (e == 0u) {
        float v = (float)m * 1.52587890625e-05f;  // m * 2^-16
        return sign ? -v : v;
    }
    return chorus_bits_f32(sign | ((e + 112u) << 23) | (m << 21));
}

// Encode with round-to-nearest-even. Magnitudes from `max_bits` on (infinity included)
// become `max_code`: E4M3 has no infinity and saturates to +-448 (PTX's `.satfinite`);
// E5M2 rounds to +-infinity from 61440, the midpoint past its largest finite value, as
// IEEE rounding does and as the engine's host device does. NaN stays NaN (0x7f).
CHORUS_DEV u8 chorus_f32_to_f8_sw(float f, u32 mbits, u32 bias, u32 max_code, u32 max_bits) {
    u32 x = chorus_f32_bits(f);
    u32 sign = (x >> 24) & 0x80u;
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        return (u8)(sign | 0x7fu);
    }
    if (ax >= max_bits) {
        return (u8)(sign | max_code);
    }
    u32 e = ax >> 23;
    if (e == 0u) {
        return (u8)sign;
    }
    // Smallest normal exponent of the target, biased as in f32: 1 - bias + 127.
    u32 min_normal_e = 128u - bias;
    u32 r;
    u32 rem;
    u32 half;
    if (e >= min_normal_e) {
        u32 shift = 23u - mbits;
        r = ((e - min_normal_e + 1u) << mbits) | ((ax & 0x7fffffu) >> shift);
        rem = ax & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    } else {
        // Subnormal in units of 2^(1 - bias - mbits): value = m * 2^(e - 150).
        u32 m = (ax & 0x7fffffu) | 0x800000u;
        // At least 24 - mbits, since e < min_normal_e.
        u32 shift = 151u - bias - mbits - e;
        if (shift >= 25u) {
            return (u8)sign;
        }
        r = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1u);
    }
    if (rem > half || (rem == half && (r & 1u))) {
        r += 1u;
    }
    return (u8)(sign | r);
}

CHORUS_DEV u8 chorus_f32_to_e4m3_sw(float f) {
    // max 448 = 0x43e00000, code 0x7e
    return chorus_f32_to_f8_sw(f, 3u, 7u, 0x7eu, 0x43e00000u);
}

CHORUS_DEV u8 chorus_f32_to_e5m2_sw(float f) {
    // 61440 = 0x47700000 and up rounds to infinity, code 0x7c
    return chorus_f32_to_f8_sw(f, 2u, 15u, 0x7cu, 0x47700000u);
}

// The device's own fp8 conversions exist from sm_89 on; the Rust side defines
// CHORUS_FP8_HW there and retries without it if NVRTC rejects the instructions.
#if defined(__CUDA_ARCH__) && defined(CHORUS_FP8_HW) && (__CUDA_ARCH__ >= 890)
CHORUS_DEV float chorus_e4m3_to_f32(u8 b) {
    u32 h2;
    u16 in = (u16)b;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
    return chorus_f16_to_f32((u16)(h2 & 0xffffu));
}
CHORUS_DEV float chorus_e5m2_to_f32(u8 b) {
    u32 h2;
    u16 in = (u16)b;
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(in));
    return chorus_f16_to_f32((u16)(h2 & 0xffffu));
}
CHORUS_DEV u8 chorus_f32_to_e4m3(float f) {
    u16 out;
    float zero = 0.0f;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(zero), "f"(f));
    return (u8)(out & 0xffu);
}
CHORUS_DEV u8 chorus_f32_to_e5m2(float f) {
    // The instruction only saturates; IEEE rounding (the host's) overflows to infinity
    // from 61440 on, so those magnitudes are encoded here.
    u32 ax = chorus_f32_bits(f) & 0x7fffffffu;
    if (ax >= 0x47700000u && ax <= 0x7f800000u) {
        return (u8)(((chorus_f32_bits(f) >> 24) & 0x80u) | 0x7cu);
    }
    u16 out;
    float zero = 0.0f;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(zero), "f"(f));
    return (u8)(out & 0xffu);
}
#else
CHORUS_DEV float chorus_e4m3_to_f32(u8 b) { return chorus_e4m3_to_f32_sw(b); }
CHORUS_DEV float chorus_e5m2_to_f32(u8 b) { return chorus_e5m2_to_f32_sw(b); }
CHORUS_DEV u8 chorus_f32_to_e4m3(float f) { return chorus_f32_to_e4m3_sw(f); }
CHORUS_DEV u8 chorus_f32_to_e5m2(float f) { return chorus_f32_to_e5m2_sw(f); }
#endif

// ---- grid geometry ------------------------------------------------------------------------

CHORUS_DEV u64 chorus_thread_index() {
    return (u64)blockIdx.x * (u64)blockDim.x + (u64)threadIdx.x;
}

CHORUS_DEV u64 chorus_thread_count() { return (u64)gridDim.x * (u64)blockDim.x; }
