//! The kernel sources of `kernels/`, compiled as plain C++ and run on the CPU, against the
//! host reference (`chorus_cuda::reference`) — bit for bit. This is how the arithmetic of the
//! kernels (conversions, every reduction, scale and divide, the copy's vector and tail paths)
//! and the device links' abort records and guards (what a retired wait writes, which puts,
//! signals and forwards it stops) are checked on machines without a GPU; `kernels/check.sh`
//! checks the same on the device.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use chorus_cuda::reference;
use chorus_cuda::source::{divide_kernel, reduce_kernel, scale_kernel};
use chorus_protocol::{DType, ReduceOp};
use half::{bf16, f16};

/// The harness binary, built once per test process; `None` (after one line) without a C++
/// compiler.
fn harness() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chorus_host_harness");
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
            let status = Command::new(&cxx)
                .args([
                    "-std=c++17",
                    "-O1",
                    "-fno-strict-aliasing",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                ])
                .arg("-Wno-unknown-pragmas")
                .arg("-I")
                .arg(&kernels)
                .arg("-o")
                .arg(&out)
                .arg(kernels.join("host_harness.cpp"))
                .status();
            match status {
                Ok(s) if s.success() => Some(out),
                Ok(s) => panic!("the kernel sources do not compile as C++ ({s})"),
                Err(e) => {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "skipped host kernel tests: no C++ compiler `{cxx}` ({e})"
                    );
                    None
                }
            }
        })
        .as_deref()
}

fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hk-{}-{name}", std::process::id()))
}

fn run(args: &[&str]) {
    words(args);
}

/// Run the harness; the numbers it prints.
fn words(args: &[&str]) -> Vec<u64> {
    let Some(h) = harness() else {
        return Vec::new();
    };
    let out = Command::new(h).args(args).output().expect("run harness");
    assert!(
        out.status.success(),
        "harness {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect()
}

/// A deterministic generator (the tests must fail the same way twice).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn small(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 100.0 - 10.0
    }
}

/// `n` random finite elements of `dtype`, as bytes.
fn data(dtype: DType, n: usize, rng: &mut Lcg) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        match dtype {
            DType::F32 => out.extend(rng.small().to_le_bytes()),
            DType::F64 => out.extend((rng.small() as f64 * 1.000001).to_le_bytes()),
            DType::F16 => out.extend(f16::from_f32(rng.small()).to_bits().to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f32(rng.small()).to_bits().to_le_bytes()),
            DType::F8E4M3 => out.push(reference::f32_to_e4m3(rng.small())),
            DType::F8E5M2 => out.push(reference::f32_to_e5m2(rng.small())),
            _ => {
                let v = rng.next().to_le_bytes();
                out.extend_from_slice(&v[..dtype.size()]);
            }
        }
    }
    out
}

fn conv(name: &str, input: &[u8]) -> Option<Vec<u8>> {
    harness()?;
    let (i, o) = (
        scratch(&format!("{name}.in")),
        scratch(&format!("{name}.out")),
    );
    std::fs::write(&i, input).unwrap();
    run(&["conv", name, i.to_str().unwrap(), o.to_str().unwrap()]);
    Some(std::fs::read(&o).unwrap())
}

fn same_float(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn half_conversions_match_the_half_crate_on_every_code() {
    let codes: Vec<u8> = (0..=u16::MAX).flat_map(|c| c.to_le_bytes()).collect();
    let Some(got) = conv("f16_to_f32", &codes) else {
        return;
    };
    for (c, w) in (0..=u16::MAX).zip(got.chunks_exact(4)) {
        let g = f32::from_le_bytes(w.try_into().unwrap());
        assert!(
            same_float(g, f16::from_bits(c).to_f32()),
            "f16 {c:#06x}: {g}"
        );
    }
    let got = conv("bf16_to_f32", &codes).unwrap();
    for (c, w) in (0..=u16::MAX).zip(got.chunks_exact(4)) {
        let g = f32::from_le_bytes(w.try_into().unwrap());
        assert!(
            same_float(g, bf16::from_bits(c).to_f32()),
            "bf16 {c:#06x}: {g}"
        );
    }
}

#[test]
fn rounding_to_half_and_bfloat_matches_the_half_crate() {
    let mut rng = Lcg(7);
    let mut values: Vec<f32> = (0..200_000)
        .map(|_| f32::from_bits(rng.next() as u32))
        .collect();
    // Ties, subnormals, overflow edges.
    values.extend([
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        1e-8,
        2.9802322e-8,
        5.9604645e-8,
        6.1035156e-5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        1.0 + 2f32.powi(-10),
        1.0 + 2f32.powi(-11),
    ]);
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let Some(got) = conv("f32_to_f16", &bytes) else {
        return;
    };
    for (v, w) in values.iter().zip(got.chunks_exact(2)) {
        let g = u16::from_le_bytes(w.try_into().unwrap());
        assert_eq!(
            g,
            f16::from_f32(*v).to_bits(),
            "f16 of {v:e} ({:#x})",
            v.to_bits()
        );
    }
    let got = conv("f32_to_bf16", &bytes).unwrap();
    for (v, w) in values.iter().zip(got.chunks_exact(2)) {
        let g = u16::from_le_bytes(w.try_into().unwrap());
        assert_eq!(
            g,
            bf16::from_f32(*v).to_bits(),
            "bf16 of {v:e} ({:#x})",
            v.to_bits()
        );
    }
}

#[test]
fn fp8_conversions_match_the_reference() {
    let codes: Vec<u8> = (0..=255).collect();
    let Some(got) = conv("e4m3_to_f32", &codes) else {
        return;
    };
    for (c, w) in codes.iter().zip(got.chunks_exact(4)) {
        let g = f32::from_le_bytes(w.try_into().unwrap());
        assert!(
            same_float(g, reference::e4m3_to_f32(*c)),
            "e4m3 {c:#x}: {g}"
        );
    }
    let got = conv("e5m2_to_f32", &codes).unwrap();
    for (c, w) in codes.iter().zip(got.chunks_exact(4)) {
        let g = f32::from_le_bytes(w.try_into().unwrap());
        assert!(
            same_float(g, reference::e5m2_to_f32(*c)),
            "e5m2 {c:#x}: {g}"
        );
    }
    let mut rng = Lcg(11);
    let mut values: Vec<f32> = (0..20_000).map(|_| rng.small() * 30.0).collect();
    values.extend(
        (0..20_000)
            .map(|_| f32::from_bits(rng.next() as u32))
            .filter(|v| !v.is_nan()),
    );
    // Every midpoint between neighbouring codes, where ties-to-even decides.
    for c in 0..126u8 {
        values.push((reference::e4m3_to_f32(c) + reference::e4m3_to_f32(c + 1)) / 2.0);
        values.push((reference::e5m2_to_f32(c) + reference::e5m2_to_f32(c + 1)) / 2.0);
    }
    values.extend([
        0.0,
        -0.0,
        448.0,
        464.0,
        1e6,
        -1e6,
        57344.0,
        61440.0,
        f32::INFINITY,
        1e-30,
    ]);
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let got = conv("f32_to_e4m3", &bytes).unwrap();
    for (v, g) in values.iter().zip(&got) {
        assert_eq!(*g, reference::f32_to_e4m3(*v), "e4m3 of {v:e}");
    }
    let got = conv("f32_to_e5m2", &bytes).unwrap();
    for (v, g) in values.iter().zip(&got) {
        assert_eq!(*g, reference::f32_to_e5m2(*v), "e5m2 of {v:e}");
    }
}

#[test]
fn every_reduction_matches_the_reference_on_aligned_and_unaligned_data() {
    if harness().is_none() {
        return;
    }
    let mut rng = Lcg(3);
    for dtype in DType::ALL {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
            for (n, shift) in [(1000usize, 0usize), (37, 0), (203, 1), (5, 3)] {
                let dst = data(dtype, n, &mut rng);
                let src = data(dtype, n, &mut rng);
                let name = reduce_kernel(op, dtype).unwrap();
                let (d, s, o) = (
                    scratch(&format!("{name}.d")),
                    scratch(&format!("{name}.s")),
                    scratch(&format!("{name}.o")),
                );
                std::fs::write(&d, &dst).unwrap();
                std::fs::write(&s, &src).unwrap();
                run(&[
                    "reduce",
                    &name,
                    &dtype.size().to_string(),
                    &n.to_string(),
                    &shift.to_string(),
                    d.to_str().unwrap(),
                    s.to_str().unwrap(),
                    o.to_str().unwrap(),
                ]);
                let got = std::fs::read(&o).unwrap();
                let mut want = dst.clone();
                reference::reduce(dtype, op, &mut want, &src);
                assert_eq!(got, want, "{name} n={n} shift={shift}");
            }
        }
    }
}

#[test]
fn every_scale_matches_the_reference() {
    if harness().is_none() {
        return;
    }
    let mut rng = Lcg(5);
    for dtype in DType::ALL {
        for factor in [0.25, 1.0 / 3.0, 1.0, 1.5, -2.0, 3.0, 1e30, 1e19, f64::NAN] {
            let n = 301;
            let mut mem = data(dtype, n, &mut rng);
            if !dtype.is_float() {
                // Whole-range integers, so exact multiplies wrap and fractional ones saturate.
                mem = (0..n * dtype.size()).map(|_| rng.next() as u8).collect();
            }
            let name = scale_kernel(dtype);
            let (i, o) = (scratch(&format!("{name}.i")), scratch(&format!("{name}.o")));
            std::fs::write(&i, &mem).unwrap();
            // As the device launches it (kernels.rs).
            let (multiplier, exact) = match chorus_engine::int_multiplier(factor) {
                Some(m) => (m as u64, 1),
                None => (0, 0),
            };
            run(&[
                "scale",
                &name,
                &dtype.size().to_string(),
                &n.to_string(),
                &format!("{factor:e}"),
                &multiplier.to_string(),
                &exact.to_string(),
                i.to_str().unwrap(),
                o.to_str().unwrap(),
            ]);
            let got = std::fs::read(&o).unwrap();
            let mut want = mem.clone();
            reference::scale(dtype, &mut want, factor);
            assert_eq!(got, want, "{name} by {factor}");
        }
    }
}

#[test]
fn every_divide_matches_the_reference() {
    if harness().is_none() {
        return;
    }
    let mut rng = Lcg(13);
    for dtype in DType::ALL {
        for divisor in [1u32, 2, 3, 4, 7, 8, 1000, u32::MAX] {
            let n = 301;
            let mem: Vec<u8> = if dtype.is_float() {
                data(dtype, n, &mut rng)
            } else {
                (0..n * dtype.size()).map(|_| rng.next() as u8).collect()
            };
            let name = divide_kernel(dtype);
            let (i, o) = (scratch(&format!("{name}.i")), scratch(&format!("{name}.o")));
            std::fs::write(&i, &mem).unwrap();
            run(&[
                "divide",
                &name,
                &dtype.size().to_string(),
                &n.to_string(),
                &divisor.to_string(),
                i.to_str().unwrap(),
                o.to_str().unwrap(),
            ]);
            let got = std::fs::read(&o).unwrap();
            let mut want = mem.clone();
            reference::divide(dtype, &mut want, divisor);
            assert_eq!(got, want, "{name} by {divisor}");
        }
    }
}

#[test]
fn copies_are_exact_for_every_alignment_and_tail() {
    if harness().is_none() {
        return;
    }
    let mut rng = Lcg(9);
    for (bytes, dst_off, src_off) in [
        (4096usize, 0usize, 0usize),
        (4099, 0, 0),
        (1000, 3, 3),
        (77, 1, 5),
        (1, 0, 0),
    ] {
        let src: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
        let (i, o) = (scratch("copy.i"), scratch("copy.o"));
        std::fs::write(&i, &src).unwrap();
        run(&[
            "copy",
            &bytes.to_string(),
            &dst_off.to_string(),
            &src_off.to_string(),
            i.to_str().unwrap(),
            o.to_str().unwrap(),
        ]);
        assert_eq!(
            std::fs::read(&o).unwrap(),
            src,
            "copy of {bytes} at {dst_off}/{src_off}"
        );
    }
}

#[test]
fn a_wait_lets_data_that_arrived_win_and_records_only_the_first_retirement() {
    if harness().is_none() {
        return;
    }
    // (flag, target, abort, retired, retired_dev, generation) -> (retired, retired_dev)
    let wait = |f: u64, t: u64, a: u64, r: u64, d: u64, g: u64| {
        words(&[
            "wait",
            &f.to_string(),
            &t.to_string(),
            &a.to_string(),
            &r.to_string(),
            &d.to_string(),
            &g.to_string(),
        ])
    };
    assert_eq!(wait(5, 5, 0, 0, 0, 5), [0, 0], "the data is there");
    assert_eq!(
        wait(9, 5, 1, 0, 0, 5),
        [0, 0],
        "there before the abort: data"
    );
    assert_eq!(wait(4, 5, 1, 0, 0, 5), [5, 5], "retired: recorded");
    assert_eq!(wait(4, 8, 1, 5, 5, 8), [5, 5], "only the first is kept");
}

#[test]
fn a_retired_send_stops_its_puts_and_signals() {
    if harness().is_none() {
        return;
    }
    let src: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8 | 1).collect();
    let (i, o) = (scratch("put.i"), scratch("put.o"));
    std::fs::write(&i, &src).unwrap();
    let put = |skip: u64| {
        run(&[
            "put",
            "1000",
            &skip.to_string(),
            i.to_str().unwrap(),
            o.to_str().unwrap(),
        ]);
        std::fs::read(&o).unwrap()
    };
    assert_eq!(put(0), src, "not skipped: copied");
    assert_eq!(put(3), vec![0u8; 1000], "skipped: the slot is left alone");
    assert_eq!(words(&["signal", "4", "5", "null"]), [5]);
    assert_eq!(words(&["signal", "4", "5", "0"]), [5]);
    assert_eq!(words(&["signal", "4", "5", "3"]), [4], "skipped");
}

#[test]
fn a_gate_stops_forwarding_only_payloads_an_abort_reached() {
    if harness().is_none() {
        return;
    }
    let gate = |skip: u64, taint: u64, last: u64| {
        words(&[
            "gate",
            &skip.to_string(),
            &taint.to_string(),
            &last.to_string(),
        ])
    };
    assert_eq!(gate(0, 0, 9), [0], "nothing retired on the way in");
    assert_eq!(
        gate(0, 5, 4),
        [0],
        "the payload arrived before the retirement"
    );
    assert_eq!(gate(0, 5, 5), [5], "spoiled: the link stops sending");
    assert_eq!(
        gate(2, 5, 9),
        [2],
        "already stopped: the first record stays"
    );
}
