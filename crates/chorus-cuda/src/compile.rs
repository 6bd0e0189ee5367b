//! NVRTC: choosing the target for a device, building the options, compiling.
//!
//! The kernels are compiled at first use for the device's own architecture (`sm_XY`, a
//! CUBIN the driver loads as is). A device newer than this NVRTC knows gets PTX for the
//! newest architecture NVRTC has that the device can run (`compute_XY`), which the driver
//! compiles when it loads the module. fp8 conversions use the device's instructions from
//! sm_89 on; if NVRTC rejects them the sources are compiled again without.

use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;

use cudarc::nvrtc::sys;

use crate::error::CudaError;

/// What NVRTC is asked to produce.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Target {
    /// Architecture as NVRTC numbers it (`90` for sm_90).
    pub arch: u32,
    /// `true`: a CUBIN for exactly this architecture; `false`: PTX the driver compiles.
    pub cubin: bool,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cubin {
            write!(f, "sm_{}", self.arch)
        } else {
            write!(f, "compute_{}", self.arch)
        }
    }
}

/// The target for a device of compute capability `major.minor`, given the architectures this
/// NVRTC supports.
pub fn choose_target(major: u32, minor: u32, supported: &[u32]) -> Result<Target, CudaError> {
    let arch = major * 10 + minor;
    if supported.contains(&arch) {
        return Ok(Target { arch, cubin: true });
    }
    // PTX runs on any later architecture, so the newest one not past the device will do.
    match supported.iter().copied().filter(|&a| a <= arch).max() {
        Some(best) => Ok(Target {
            arch: best,
            cubin: false,
        }),
        None => Err(CudaError::DeviceUnavailable(format!(
            "this NVRTC compiles for {} but the device is sm_{arch}",
            describe(supported)
        ))),
    }
}

/// Whether fp8 conversions can use the device's own instructions (sm_89 and later).
pub fn fp8_hardware(target: Target) -> bool {
    target.arch >= 89
}

/// The NVRTC options for `target`.
pub fn options(target: Target, fp8_hw: bool) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={target}"),
        "--std=c++17".to_string(),
        // The kernels' float semantics are the reference's: no flush-to-zero, no fused
        // multiply-adds that would round differently from the host.
        "--ftz=false".to_string(),
        "--fmad=false".to_string(),
        // Averages divide: IEEE division, as the host's.
        "--prec-div=true".to_string(),
    ];
    if fp8_hw {
        opts.push("-DCHORUS_FP8_HW=1".to_string());
    }
    opts
}

/// A compiled module image: a CUBIN, or NUL-terminated PTX text.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Image {
    pub bytes: Vec<u8>,
    pub cubin: bool,
}

impl Image {
    /// Whether `bytes` look like an image of this kind (used to reject a damaged cache file).
    pub fn is_well_formed(&self) -> bool {
        if self.cubin {
            self.bytes.starts_with(b"\x7fELF")
        } else {
            self.bytes.last() == Some(&0) && self.bytes.windows(8).any(|w| w == b".version")
        }
    }
}

/// NVRTC's version, `(major, minor)`. Requires [`crate::probe::libraries`] to have succeeded.
pub fn nvrtc_version() -> Result<(u32, u32), CudaError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid for writes; the library was checked by the probe.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major.max(0) as u32, minor.max(0) as u32))
}

/// The architectures this NVRTC can compile for (`[75, 80, 86, 89, 90, ...]`).
pub fn supported_archs() -> Result<Vec<u32>, CudaError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is valid for writes.
    check(
        unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) },
        "nvrtcGetNumSupportedArchs",
    )?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    if !archs.is_empty() {
        // SAFETY: `archs` has room for the `n` entries NVRTC just said it will write.
        check(
            unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) },
            "nvrtcGetSupportedArchs",
        )?;
    }
    Ok(archs
        .into_iter()
        .filter(|&a| a > 0)
        .map(|a| a as u32)
        .collect())
}

/// Compile `source` for `target` with `opts` (from [`options`]: the run time and the CI
/// compile check share them), once: a rejection is a [`CudaError::Compile`] with NVRTC's log.
pub fn compile_with(source: &str, target: Target, opts: &[String]) -> Result<Image, CudaError> {
    let src = CString::new(source)
        .map_err(|_| CudaError::Invalid("kernel source contains a NUL byte".into()))?;
    let name = c"chorus_kernels.cu";
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: `prog` is valid for writes; `src` and `name` are NUL-terminated and outlive the
    // program (it is destroyed at the end of this function); no headers are passed.
    check(
        unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let program = Program(prog);
    let opts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|_| CudaError::Invalid("an NVRTC option contains a NUL byte".into()))?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `program` is live; `ptrs` holds `ptrs.len()` NUL-terminated strings that
    // outlive the call.
    let compiled =
        unsafe { sys::nvrtcCompileProgram(program.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            target: target.to_string(),
            log: program.log().unwrap_or_else(|e| format!("(no log: {e})")),
        });
    }
    let bytes = if target.cubin {
        program.output(sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN, "nvrtcGetCUBIN")?
    } else {
        program.output(sys::nvrtcGetPTXSize, sys::nvrtcGetPTX, "nvrtcGetPTX")?
    };
    Ok(Image {
        bytes,
        cubin: target.cubin,
    })
}

/// Owns an `nvrtcProgram` and destroys it.
struct Program(sys::nvrtcProgram);

type SizeFn = unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult;
type GetFn = unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult;

impl Program {
    fn log(&self) -> Result<String, CudaError> {
        let bytes = self.output(
            sys::nvrtcGetProgramLogSize,
            sys::nvrtcGetProgramLog,
            "nvrtcGetProgramLog",
        )?;
        let text = CStr::from_bytes_until_nul(&bytes)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        Ok(text.trim().to_string())
    }

    fn output(&self, size: SizeFn, get: GetFn, call: &'static str) -> Result<Vec<u8>, CudaError> {
        let mut n = 0usize;
        // SAFETY: the program is live and `n` is valid for writes.
        check(unsafe { size(self.0, &mut n) }, call)?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            // SAFETY: `buf` has the `n` bytes NVRTC said it will write.
            check(unsafe { get(self.0, buf.as_mut_ptr().cast()) }, call)?;
        }
        Ok(buf)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        let r = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            tracing::warn!(?r, "nvrtcDestroyProgram failed");
        }
    }
}

fn check(r: sys::nvrtcResult, call: &'static str) -> Result<(), CudaError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            call,
            detail: format!("{r:?}"),
        })
    }
}

fn describe(archs: &[u32]) -> String {
    if archs.is_empty() {
        return "no architecture".to_string();
    }
    archs
        .iter()
        .map(|a| format!("sm_{a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVRTC_13: &[u32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

    #[test]
    fn an_h200_gets_a_cubin_for_sm_90() {
        let t = choose_target(9, 0, NVRTC_13).unwrap();
        assert_eq!(
            t,
            Target {
                arch: 90,
                cubin: true
            }
        );
        assert_eq!(t.to_string(), "sm_90");
        assert!(fp8_hardware(t));
        let opts = options(t, true);
        assert_eq!(opts[0], "--gpu-architecture=sm_90");
        assert!(opts.contains(&"-DCHORUS_FP8_HW=1".to_string()));
        assert!(opts.contains(&"--fmad=false".to_string()));
        assert!(opts.contains(&"--prec-div=true".to_string()));
    }

    #[test]
    fn a_device_newer_than_nvrtc_gets_ptx_for_the_newest_arch_it_can_run() {
        let t = choose_target(13, 0, NVRTC_13).unwrap();
        assert_eq!(
            t,
            Target {
                arch: 121,
                cubin: false
            }
        );
        assert_eq!(options(t, false)[0], "--gpu-architecture=compute_121");
        // 8.5 is not a real architecture, but the rule holds: the newest supported below.
        assert_eq!(
            choose_target(8, 5, NVRTC_13).unwrap(),
            Target {
                arch: 80,
                cubin: false
            }
        );
    }

    #[test]
    fn a_device_older_than_nvrtc_supports_is_unavailable() {
        let err = choose_target(7, 0, NVRTC_13).unwrap_err();
        let CudaError::DeviceUnavailable(text) = err else {
            panic!("wrong error");
        };
        assert!(text.contains("sm_70"), "{text}");
        assert!(text.contains("sm_75"), "{text}");
    }

    #[test]
    fn ampere_has_no_fp8_instructions() {
        let t = choose_target(8, 0, NVRTC_13).unwrap();
        assert!(!fp8_hardware(t));
        assert!(!options(t, false).iter().any(|o| o.contains("FP8")));
    }

    #[test]
    fn images_are_checked_before_use() {
        assert!(
            Image {
                bytes: b"\x7fELF....".to_vec(),
                cubin: true
            }
            .is_well_formed()
        );
        assert!(
            !Image {
                bytes: b"garbage".to_vec(),
                cubin: true
            }
            .is_well_formed()
        );
        assert!(
            Image {
                bytes: b"// ptx\n.version 9.0\n\0".to_vec(),
                cubin: false
            }
            .is_well_formed()
        );
        assert!(
            !Image {
                bytes: b".version 9.0".to_vec(),
                cubin: false
            }
            .is_well_formed()
        );
    }
}
