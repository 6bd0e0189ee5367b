//! The kernels compile, without a GPU: NVRTC (a toolkit's, or the `nvidia-cuda-nvrtc` wheel's,
//! found by `probe::nvrtc`) compiles the translation unit chorus loads at run time for sm_80,
//! sm_90 and sm_100, with the options chorus uses at run time (`compile::options`, the one
//! source of truth), fp8 instructions included where the run time asks for them, and every
//! kernel the device loads is in each image. A kernel that stops compiling fails this test.
//!
//! Without NVRTC it prints one line and passes, unless `CHORUS_REQUIRE_NVRTC=1` (CI sets it
//! where it has put the wheel in place), which turns the absence into a failure.

use chorus_cuda::compile::{self, Target};
use chorus_cuda::{probe, source};
use chorus_engine::testkit::skip;

/// The architectures checked: Ampere, Hopper, Blackwell.
const ARCHS: [u32; 3] = [80, 90, 100];

#[test]
fn every_kernel_compiles_for_sm_80_sm_90_and_sm_100_with_the_run_time_options() {
    let found = match probe::nvrtc() {
        Ok(found) => found,
        Err(e) if std::env::var("CHORUS_REQUIRE_NVRTC").as_deref() != Ok("1") => {
            skip(&format!("the NVRTC compile check: {e}"));
            return;
        }
        Err(e) => panic!("CHORUS_REQUIRE_NVRTC=1 but {e}"),
    };
    let version = compile::nvrtc_version().unwrap();
    let supported = compile::supported_archs().unwrap();
    eprintln!("NVRTC {}.{} at {found}", version.0, version.1);
    let unit = source::unit();
    let kernels = source::all_kernels();
    let mut failures = Vec::new();
    for arch in ARCHS {
        assert!(
            supported.contains(&arch),
            "NVRTC {}.{} at {found} cannot compile for sm_{arch} (it has {supported:?})",
            version.0,
            version.1
        );
        let target = Target { arch, cubin: true };
        // Exactly what `Gpu::open` asks for on such a device (no fallback here: a rejected
        // fp8 instruction is a failure, not a slower kernel).
        let fp8 = compile::fp8_hardware(target);
        let opts = compile::options(target, fp8);
        match compile::compile_with(&unit, target, &opts) {
            Ok(image) => {
                assert!(image.is_well_formed(), "sm_{arch}: not a CUBIN");
                let missing: Vec<&String> = kernels
                    .iter()
                    .filter(|k| !contains(&image.bytes, k.as_bytes()))
                    .collect();
                assert!(missing.is_empty(), "sm_{arch} lacks {missing:?}");
                eprintln!(
                    "sm_{arch}: {} kernels, {} bytes, {}",
                    kernels.len(),
                    image.bytes.len(),
                    opts.join(" ")
                );
            }
            Err(e) => failures.push(format!("sm_{arch} ({}): {e}", opts.join(" "))),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_kernel_that_does_not_compile_is_reported_with_nvrtc_s_log() {
    if let Err(e) = probe::nvrtc() {
        skip(&format!("the NVRTC compile check: {e}"));
        return;
    }
    let target = Target {
        arch: 90,
        cubin: true,
    };
    let opts = compile::options(target, true);
    let bad = format!(
        "{}\nextern \"C\" __global__ void chorus_broken() {{ undeclared_name(); }}\n",
        source::unit()
    );
    let err = compile::compile_with(&bad, target, &opts).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("undeclared_name"), "{text}");
}

/// Whether `needle` occurs in `hay` (a kernel's name in the CUBIN's string table).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
