// chorus kernels, part 2 of 4: elementwise reductions and scaling.
//
// One kernel per (operator, type): chorus_reduce_<op>_<type>(dst, src, n) computes
// dst[i] = op(dst[i], src[i]) for i < n elements; chorus_scale_<type>(mem, n, factor,
// multiplier, exact) computes mem[i] = mem[i] * factor (integers: a wrapping multiply by
// `multiplier` when `exact` is set, which the host sets for integral factors below 2^63);
// chorus_divide_<type>(mem, n, divisor) computes mem[i] = mem[i] / divisor, the last step
// of an average (integers truncate toward zero, exactly; floats divide in their compute
// type). The engine composes Avg and PreMulSum from Sum, scale and divide, so those two
// operators have no kernels of their own. The arithmetic is the engine's host device's.
//
// Narrow floats (f16, bf16, fp8) compute in f32 and round once, back to their own type.
// Integer sums and products wrap (two's complement), as NCCL's do. Min and max ignore a NaN
// operand, like fminf/fmaxf.

// ---- element traits: storage type S, compute type C, load, store ---------------------------

#define CHORUS_FLOAT_TRAIT(NAME, S_, C_, LOAD, STORE)                                  \
    struct NAME {                                                                      \
        typedef S_ S;                                                                  \
        typedef C_ C;                                                                  \
        static CHORUS_DEV C load(S v) { return LOAD(v); }                              \
        static CHORUS_DEV S store(C v) { return STORE(v); }                            \
        static CHORUS_DEV C add(C a, C b) { return a + b; }                            \
        static CHORUS_DEV C mul(C a, C b) { return a * b; }                            \
        static CHORUS_DEV C min(C a, C b) { return (b != b) ? a : ((a < b) ? a : b); } \
        static CHORUS_DEV C max(C a, C b) { return (b != b) ? a : ((a > b) ? a : b); } \
        static CHORUS_DEV C scale(C a, double factor, u64 multiplier, u64 exact) {     \
            (void)multiplier;                                                          \
            (void)exact;                                                               \
            return a * (C)factor;                                                      \
        }                                                                              \
        static CHORUS_DEV C div(C a, u64 divisor) { return a / (C)divisor; }           \
    };

CHORUS_DEV float chorus_id_f32(float v) { return v; }
CHORUS_DEV double chorus_id_f64(double v) { return v; }

CHORUS_FLOAT_TRAIT(ElemF32, float, float, chorus_id_f32, chorus_id_f32)
CHORUS_FLOAT_TRAIT(ElemF64, double, double, chorus_id_f64, chorus_id_f64)
CHORUS_FLOAT_TRAIT(ElemF16, u16, float, chorus_f16_to_f32, chorus_f32_to_f16)
CHORUS_FLOAT_TRAIT(ElemBF16, u16, float, chorus_bf16_to_f32, chorus_f32_to_bf16)
CHORUS_FLOAT_TRAIT(ElemE4M3, u8, float, chorus_e4m3_to_f32, chorus_f32_to_e4m3)
CHORUS_FLOAT_TRAIT(ElemE5M2, u8, float, chorus_e5m2_to_f32, chorus_f32_to_e5m2)

// Integers: arithmetic in the unsigned type of the same width, so overflow wraps instead of
// being undefined. Scaling by an integral factor multiplies exactly (wrapping, like the
// sums); by any other factor it multiplies in f64 and converts the way Rust's `as` does:
// toward zero, saturating at the type's bounds, NaN to zero (out of range is undefined in
// C++). LO_D/HI_D are the first doubles that saturate.
#define CHORUS_INT_TRAIT(NAME, S_, U_, LO_D, LO, HI_D, HI)                              \
    struct NAME {                                                                      \
        typedef S_ S;                                                                  \
        typedef S_ C;                                                                  \
        static CHORUS_DEV C load(S v) { return v; }                                    \
        static CHORUS_DEV S store(C v) { return v; }                                   \
        static CHORUS_DEV C add(C a, C b) { return (C)((U_)a + (U_)b); }               \
        static CHORUS_DEV C mul(C a, C b) { return (C)((U_)a * (U_)b); }               \
        static CHORUS_DEV C min(C a, C b) { return (a < b) ? a : b; }                  \
        static CHORUS_DEV C max(C a, C b) { return (a > b) ? a : b; }                  \
        static CHORUS_DEV C scale(C a, double factor, u64 multiplier, u64 exact) {     \
            if (exact != 0ull) {                                                       \
                return (C)((U_)a * (U_)multiplier);                                    \
            }                                                                          \
            double v = (double)a * factor;                                             \
            if (v != v) {                                                              \
                return (C)0;                                                           \
            }                                                                          \
            if (v <= (LO_D)) {                                                         \
                return (C)(LO);                                                        \
            }                                                                          \
            if (v >= (HI_D)) {                                                         \
                return (C)(HI);                                                        \
            }                                                                          \
            return (C)v;                                                               \
        }                                                                              \
        static CHORUS_DEV C div(C a, u64 divisor) { return chorus_int_div(a, divisor); } \
    };

// Division truncating toward zero (C++'s own rule), by a positive divisor below 2^32.
CHORUS_DEV i8 chorus_int_div(i8 a, u64 d) { return (i8)((i64)a / (i64)d); }
CHORUS_DEV u8 chorus_int_div(u8 a, u64 d) { return (u8)((u64)a / d); }
CHORUS_DEV i32 chorus_int_div(i32 a, u64 d) { return (i32)((i64)a / (i64)d); }
CHORUS_DEV u32 chorus_int_div(u32 a, u64 d) { return (u32)((u64)a / d); }
CHORUS_DEV i64 chorus_int_div(i64 a, u64 d) {
    // d is a world size, far below 2^63, so the conversion is exact.
    return a / (i64)d;
}
CHORUS_DEV u64 chorus_int_div(u64 a, u64 d) { return a / d; }

CHORUS_INT_TRAIT(ElemI8, i8, u8, -129.0, -128, 128.0, 127)
CHORUS_INT_TRAIT(ElemU8, u8, u8, -1.0, 0, 256.0, 255)
CHORUS_INT_TRAIT(ElemI32, i32, u32, -2147483649.0, (-2147483647 - 1), 2147483648.0, 2147483647)
CHORUS_INT_TRAIT(ElemU32, u32, u32, -1.0, 0u, 4294967296.0, 4294967295u)
CHORUS_INT_TRAIT(ElemI64, i64, u64, -9223372036854775808.0, (-9223372036854775807ll - 1),
                 9223372036854775808.0, 9223372036854775807ll)
CHORUS_INT_TRAIT(ElemU64, u64, u64, -1.0, 0ull, 18446744073709551616.0, 18446744073709551615ull)

// ---- operators ----------------------------------------------------------------------------

struct OpSum {
    template <class E>
    static CHORUS_DEV typename E::C apply(typename E::C a, typename E::C b) { return E::add(a, b); }
};
struct OpProd {
    template <class E>
    static CHORUS_DEV typename E::C apply(typename E::C a, typename E::C b) { return E::mul(a, b); }
};
struct OpMin {
    template <class E>
    static CHORUS_DEV typename E::C apply(typename E::C a, typename E::C b) { return E::min(a, b); }
};
struct OpMax {
    template <class E>
    static CHORUS_DEV typename E::C apply(typename E::C a, typename E::C b) { return E::max(a, b); }
};

// ---- bodies -------------------------------------------------------------------------------

// 16-byte vectors when both pointers allow it (the common case: allocations are 256-byte
// aligned and the engine's chunks are large powers of two), elements otherwise.
template <class E, class Op>
CHORUS_DEV void chorus_reduce_body(void* dst_, const void* src_, u64 n) {
    typedef typename E::S S;
    S* dst = (S*)dst_;
    const S* src = (const S*)src_;
    const u64 first = chorus_thread_index();
    const u64 stride = chorus_thread_count();
    u64 done = 0;
    if ((((u64)dst_ | (u64)src_) & 15ull) == 0ull) {
        const u64 per = 16ull / sizeof(S);
        const u64 nv = n / per;
        uint4* dv = (uint4*)dst_;
        const uint4* sv = (const uint4*)src_;
        for (u64 i = first; i < nv; i += stride) {
            uint4 a = dv[i];
            uint4 b = sv[i];
            S* ae = (S*)&a;
            const S* be = (const S*)&b;
#pragma unroll
            for (u64 k = 0; k < 16ull / sizeof(S); ++k) {
                ae[k] = E::store(Op::template apply<E>(E::load(ae[k]), E::load(be[k])));
            }
            dv[i] = a;
        }
        done = nv * per;
    }
    for (u64 i = done + first; i < n; i += stride) {
        dst[i] = E::store(Op::template apply<E>(E::load(dst[i]), E::load(src[i])));
    }
}

template <class E>
CHORUS_DEV void chorus_scale_body(void* mem_, u64 n, double factor, u64 multiplier, u64 exact) {
    typedef typename E::S S;
    S* mem = (S*)mem_;
    const u64 first = chorus_thread_index();
    const u64 stride = chorus_thread_count();
    for (u64 i = first; i < n; i += stride) {
        mem[i] = E::store(E::scale(E::load(mem[i]), factor, multiplier, exact));
    }
}

template <class E>
CHORUS_DEV void chorus_divide_body(void* mem_, u64 n, u64 divisor) {
    typedef typename E::S S;
    S* mem = (S*)mem_;
    const u64 first = chorus_thread_index();
    const u64 stride = chorus_thread_count();
    for (u64 i = first; i < n; i += stride) {
        mem[i] = E::store(E::div(E::load(mem[i]), divisor));
    }
}

// ---- the kernels: chorus_reduce_<op>_<type>, chorus_scale_<type>, chorus_divide_<type> -------

#define CHORUS_REDUCE(OPNAME, OP, TNAME, E)                                                 \
    extern "C" __global__ void chorus_reduce_##OPNAME##_##TNAME(void* dst, const void* src,  \
                                                                u64 n) {                    \
        chorus_reduce_body<E, OP>(dst, src, n);                                             \
    }

#define CHORUS_TYPE_KERNELS(TNAME, E)                                                        \
    CHORUS_REDUCE(sum, OpSum, TNAME, E)                                                      \
    CHORUS_REDUCE(prod, OpProd, TNAME, E)                                                    \
    CHORUS_REDUCE(min, OpMin, TNAME, E)                                                      \
    CHORUS_REDUCE(max, OpMax, TNAME, E)                                                      \
    extern "C" __global__ void chorus_scale_##TNAME(void* mem, u64 n, double factor,         \
                                                    u64 multiplier, u64 exact) {             \
        chorus_scale_body<E>(mem, n, factor, multiplier, exact);                             \
    }                                                                                        \
    extern "C" __global__ void chorus_divide_##TNAME(void* mem, u64 n, u64 divisor) {        \
        chorus_divide_body<E>(mem, n, divisor);                                              \
    }

CHORUS_TYPE_KERNELS(f32, ElemF32)
CHORUS_TYPE_KERNELS(f64, ElemF64)
CHORUS_TYPE_KERNELS(f16, ElemF16)
CHORUS_TYPE_KERNELS(bf16, ElemBF16)
CHORUS_TYPE_KERNELS(i8, ElemI8)
CHORUS_TYPE_KERNELS(u8, ElemU8)
CHORUS_TYPE_KERNELS(i32, ElemI32)
CHORUS_TYPE_KERNELS(u32, ElemU32)
CHORUS_TYPE_KERNELS(i64, ElemI64)
CHORUS_TYPE_KERNELS(u64, ElemU64)
CHORUS_TYPE_KERNELS(f8e4m3, ElemE4M3)
CHORUS_TYPE_KERNELS(f8e5m2, ElemE5M2)
