// Runs the chorus kernels on the CPU for crates/chorus-cuda/tests/host_kernels.rs.
//
//   host_harness reduce <kernel> <elem_size> <n> <offset> <dst_in> <src_in> <dst_out>
//   host_harness scale  <kernel> <elem_size> <n> <factor> <multiplier> <exact> <in> <out>
//   host_harness divide <kernel> <elem_size> <n> <divisor> <in> <out>
//   host_harness copy   <bytes> <dst_off> <src_off> <src_in> <dst_out>
//   host_harness put    <bytes> <skip> <src_in> <dst_out>
//   host_harness conv   <name> <in> <out>
//   host_harness wait   <flag> <target> <abort> <retired> <retired_dev> <generation>
//   host_harness gate   <skip> <taint> <taint_gen>
//   host_harness signal <flag> <value> <skip, or "null">
//
// wait, gate and signal print the words they may write, space-separated, on stdout. wait
// refuses (exit 3) to run when it would spin: a CPU "thread" cannot be released by a peer.
//
// Files are raw little-endian arrays. `offset` shifts both buffers by that many elements
// from a 16-byte boundary, so the vector path, the scalar tail and the unaligned path all
// run. Launches use an odd geometry (3 blocks of 5 threads) so grid-stride loops wrap.
#include "host_shim.h"
// The kernel sources follow, as NVRTC sees them.
#include "common.cuh"
#include "reduce.cu"
#include "copy.cu"
#include "wait.cu"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

typedef void (*reduce_fn)(void*, const void*, u64);
typedef void (*scale_fn)(void*, u64, double, u64, u64);
typedef void (*divide_fn)(void*, u64, u64);

struct Named {
    const char* name;
    reduce_fn reduce;
    scale_fn scale;
    divide_fn divide;
};

#define R(OP, T) {"chorus_reduce_" #OP "_" #T, chorus_reduce_##OP##_##T, nullptr, nullptr},
#define S(T) {"chorus_scale_" #T, nullptr, chorus_scale_##T, nullptr},
#define D(T) {"chorus_divide_" #T, nullptr, nullptr, chorus_divide_##T},
#define ALL(T) R(sum, T) R(prod, T) R(min, T) R(max, T) S(T) D(T)
static const Named KERNELS[] = {ALL(f32) ALL(f64) ALL(f16) ALL(bf16) ALL(i8) ALL(u8) ALL(i32)
                                    ALL(u32) ALL(i64) ALL(u64) ALL(f8e4m3) ALL(f8e5m2)};

static std::vector<unsigned char> slurp(const char* path) {
    std::vector<unsigned char> out;
    FILE* f = std::fopen(path, "rb");
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path);
        std::exit(2);
    }
    unsigned char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
        out.insert(out.end(), buf, buf + n);
    }
    std::fclose(f);
    return out;
}

static void spit(const char* path, const unsigned char* data, size_t n) {
    FILE* f = std::fopen(path, "wb");
    if (!f || std::fwrite(data, 1, n, f) != n) {
        std::fprintf(stderr, "cannot write %s\n", path);
        std::exit(2);
    }
    std::fclose(f);
}

template <class F>
static void launch(F body) {
    gridDim = {3, 1, 1};
    blockDim = {5, 1, 1};
    for (unsigned b = 0; b < gridDim.x; ++b) {
        for (unsigned t = 0; t < blockDim.x; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            body();
        }
    }
}

static const Named* find(const char* name) {
    for (const Named& k : KERNELS) {
        if (std::string(k.name) == name) {
            return &k;
        }
    }
    std::fprintf(stderr, "no kernel %s\n", name);
    std::exit(2);
}

// A 16-byte-aligned scratch copy of `data` placed `shift` bytes past the boundary.
struct Placed {
    std::vector<uint4> store;
    unsigned char* ptr;
    Placed(const std::vector<unsigned char>& data, size_t shift) {
        store.resize((data.size() + shift) / 16 + 2);
        ptr = reinterpret_cast<unsigned char*>(store.data()) + shift;
        if (!data.empty()) {
            std::memcpy(ptr, data.data(), data.size());
        }
    }
};

int main(int argc, char** argv) {
    if (argc < 2) {
        return 2;
    }
    std::string mode = argv[1];
    if (mode == "reduce" && argc == 9 && find(argv[2])->reduce) {
        const Named* k = find(argv[2]);
        size_t esize = std::strtoull(argv[3], nullptr, 10);
        u64 n = std::strtoull(argv[4], nullptr, 10);
        size_t shift = std::strtoull(argv[5], nullptr, 10) * esize;
        Placed dst(slurp(argv[6]), shift);
        Placed src(slurp(argv[7]), shift);
        launch([&] { k->reduce(dst.ptr, src.ptr, n); });
        spit(argv[8], dst.ptr, n * esize);
        return 0;
    }
    if (mode == "scale" && argc == 10 && find(argv[2])->scale) {
        const Named* k = find(argv[2]);
        size_t esize = std::strtoull(argv[3], nullptr, 10);
        u64 n = std::strtoull(argv[4], nullptr, 10);
        double factor = std::strtod(argv[5], nullptr);
        u64 multiplier = std::strtoull(argv[6], nullptr, 10);
        u64 exact = std::strtoull(argv[7], nullptr, 10);
        Placed mem(slurp(argv[8]), 0);
        launch([&] { k->scale(mem.ptr, n, factor, multiplier, exact); });
        spit(argv[9], mem.ptr, n * esize);
        return 0;
    }
    if (mode == "divide" && argc == 8 && find(argv[2])->divide) {
        const Named* k = find(argv[2]);
        size_t esize = std::strtoull(argv[3], nullptr, 10);
        u64 n = std::strtoull(argv[4], nullptr, 10);
        u64 divisor = std::strtoull(argv[5], nullptr, 10);
        Placed mem(slurp(argv[6]), 0);
        launch([&] { k->divide(mem.ptr, n, divisor); });
        spit(argv[7], mem.ptr, n * esize);
        return 0;
    }
    if (mode == "copy" && argc == 7) {
        u64 bytes = std::strtoull(argv[2], nullptr, 10);
        size_t dst_off = std::strtoull(argv[3], nullptr, 10);
        size_t src_off = std::strtoull(argv[4], nullptr, 10);
        std::vector<unsigned char> zeros(bytes, 0);
        Placed src(slurp(argv[5]), src_off);
        Placed dst(zeros, dst_off);
        launch([&] { chorus_copy(dst.ptr, src.ptr, bytes); });
        spit(argv[6], dst.ptr, bytes);
        return 0;
    }
    if (mode == "put" && argc == 6) {
        u64 bytes = std::strtoull(argv[2], nullptr, 10);
        u64 skip = std::strtoull(argv[3], nullptr, 10);
        std::vector<unsigned char> zeros(bytes, 0);
        Placed src(slurp(argv[4]), 0);
        Placed dst(zeros, 0);
        launch([&] { chorus_put(dst.ptr, src.ptr, bytes, &skip); });
        spit(argv[5], dst.ptr, bytes);
        return 0;
    }
    if (mode == "wait" && argc == 8) {
        u64 flag = std::strtoull(argv[2], nullptr, 10);
        u64 target = std::strtoull(argv[3], nullptr, 10);
        u32 abort_word = (u32)std::strtoul(argv[4], nullptr, 10);
        u64 retired = std::strtoull(argv[5], nullptr, 10);
        u64 retired_dev = std::strtoull(argv[6], nullptr, 10);
        u64 generation = std::strtoull(argv[7], nullptr, 10);
        if (flag < target && abort_word == 0u) {
            return 3;
        }
        launch([&] { chorus_wait(&flag, target, &abort_word, &retired, generation, &retired_dev); });
        std::printf("%llu %llu\n", retired, retired_dev);
        return 0;
    }
    if (mode == "gate" && argc == 5) {
        u64 skip = std::strtoull(argv[2], nullptr, 10);
        u64 taint = std::strtoull(argv[3], nullptr, 10);
        u64 taint_gen = std::strtoull(argv[4], nullptr, 10);
        launch([&] { chorus_gate(&skip, &taint, taint_gen); });
        std::printf("%llu\n", skip);
        return 0;
    }
    if (mode == "signal" && argc == 5) {
        u64 flag = std::strtoull(argv[2], nullptr, 10);
        u64 value = std::strtoull(argv[3], nullptr, 10);
        bool null_skip = std::string(argv[4]) == "null";
        u64 skip = null_skip ? 0ull : std::strtoull(argv[4], nullptr, 10);
        launch([&] { chorus_signal(&flag, value, null_skip ? nullptr : &skip); });
        std::printf("%llu\n", flag);
        return 0;
    }
    if (mode == "conv" && argc == 5) {
        std::string name = argv[2];
        std::vector<unsigned char> in = slurp(argv[3]);
        std::vector<unsigned char> out;
        auto put32 = [&](float f) {
            u32 u = chorus_f32_bits(f);
            out.insert(out.end(), reinterpret_cast<unsigned char*>(&u),
                       reinterpret_cast<unsigned char*>(&u) + 4);
        };
        auto put16 = [&](u16 h) {
            out.insert(out.end(), reinterpret_cast<unsigned char*>(&h),
                       reinterpret_cast<unsigned char*>(&h) + 2);
        };
        auto get32 = [&](size_t i) {
            u32 u;
            std::memcpy(&u, &in[i * 4], 4);
            return chorus_bits_f32(u);
        };
        auto get16 = [&](size_t i) {
            u16 h;
            std::memcpy(&h, &in[i * 2], 2);
            return h;
        };
        if (name == "f16_to_f32") {
            for (size_t i = 0; i < in.size() / 2; ++i) put32(chorus_f16_to_f32(get16(i)));
        } else if (name == "f32_to_f16") {
            for (size_t i = 0; i < in.size() / 4; ++i) put16(chorus_f32_to_f16(get32(i)));
        } else if (name == "bf16_to_f32") {
            for (size_t i = 0; i < in.size() / 2; ++i) put32(chorus_bf16_to_f32(get16(i)));
        } else if (name == "f32_to_bf16") {
            for (size_t i = 0; i < in.size() / 4; ++i) put16(chorus_f32_to_bf16(get32(i)));
        } else if (name == "e4m3_to_f32") {
            for (size_t i = 0; i < in.size(); ++i) put32(chorus_e4m3_to_f32(in[i]));
        } else if (name == "e5m2_to_f32") {
            for (size_t i = 0; i < in.size(); ++i) put32(chorus_e5m2_to_f32(in[i]));
        } else if (name == "f32_to_e4m3") {
            for (size_t i = 0; i < in.size() / 4; ++i) out.push_back(chorus_f32_to_e4m3(get32(i)));
        } else if (name == "f32_to_e5m2") {
            for (size_t i = 0; i < in.size() / 4; ++i) out.push_back(chorus_f32_to_e5m2(get32(i)));
        } else {
            std::fprintf(stderr, "no conversion %s\n", name.c_str());
            return 2;
        }
        spit(argv[4], out.data(), out.size());
        return 0;
    }
    std::fprintf(stderr, "bad arguments\n");
    return 2;
}
