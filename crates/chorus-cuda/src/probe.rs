//! Finding the CUDA driver and NVRTC before cudarc does.
//!
//! cudarc (dynamic loading) opens `libcuda` and `libnvrtc` on first use and panics if they are
//! missing, and it resolves each symbol lazily, panicking again on one the library does not have. A
//! machine without a GPU is normal for chorus (`docs/ARCHITECTURE.md`, "The GPU path"), so this
//! module opens both libraries itself, under the names cudarc will ask for, checks every symbol the
//! crate calls, and turns any absence into [`CudaError::DeviceUnavailable`]. The libraries it opens
//! stay loaded for the life of the process, so when cudarc asks for the same names the dynamic
//! loader hands back the same objects.
//!
//! NVRTC often lives outside the loader's path (a toolkit's `lib64`, a Python wheel), so
//! the usual directories are tried by absolute path as well; once loaded that way, cudarc's
//! later lookup by soname finds it. The places, in order: `$CHORUS_NVRTC` (the library or its
//! directory), the toolkit roots (`$CUDA_HOME` and its kin, `/usr/local/cuda*`), and the
//! `nvidia-cuda-nvrtc` wheel in the Python environments in sight (`$VIRTUAL_ENV`,
//! `$CONDA_PREFIX`, and the prefix of the interpreter this process was started as): its
//! CUDA 13 wheels put the library in `site-packages/nvidia/cu13/lib`, its CUDA 12 ones in
//! `site-packages/nvidia/cuda_nvrtc/lib`. NVRTC is found on its own ([`nvrtc`]) as well, so
//! the kernels can be compile-checked on a machine with no driver.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::CudaError;

/// The libraries this process found and keeps loaded.
#[derive(Debug)]
pub struct Libraries {
    /// What the driver library was opened as.
    pub driver: String,
    /// What NVRTC was opened as (a name or an absolute path).
    pub nvrtc: String,
    _handles: Vec<libloading::Library>,
}

/// Every driver entry point this crate calls (directly or through cudarc's safe layer).
pub const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventElapsedTime_v2",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemAllocFromPoolAsync",
    "cuMemsetD8Async",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGetErrorName",
    "cuGetErrorString",
];

/// Every NVRTC entry point this crate calls.
pub const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetErrorString",
];

/// Find and keep the driver and NVRTC, once per process; later calls return the first answer.
pub fn libraries() -> Result<&'static Libraries, CudaError> {
    static FOUND: OnceLock<Result<Libraries, CudaError>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let driver = open_first(
                "the CUDA driver (libcuda)",
                &cudarc::get_lib_name_candidates("cuda"),
                &[],
                DRIVER_SYMBOLS,
            )?;
            Ok(Libraries {
                driver: driver.0,
                nvrtc: nvrtc()?.to_string(),
                _handles: vec![driver.1],
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Find and keep NVRTC alone, once per process (no driver needed: compiling is all NVRTC
/// does); returns what it was opened as.
pub fn nvrtc() -> Result<&'static str, CudaError> {
    static FOUND: OnceLock<Result<(String, libloading::Library), CudaError>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            open_first(
                "NVRTC (libnvrtc)",
                &cudarc::get_lib_name_candidates("nvrtc"),
                &nvrtc_dirs(),
                NVRTC_SYMBOLS,
            )
        })
        .as_ref()
        .map(|(name, _)| name.as_str())
        .map_err(Clone::clone)
}

/// Open the first of `names` that loads, by name through the loader's path, then in each of
/// `dirs` by absolute path; check that it has every one of `symbols`.
pub(crate) fn open_first(
    what: &str,
    names: &[String],
    dirs: &[PathBuf],
    symbols: &[&str],
) -> Result<(String, libloading::Library), CudaError> {
    let mut tried: Vec<String> = Vec::new();
    let paths = names.iter().map(PathBuf::from).chain(
        dirs.iter()
            .flat_map(|d| names.iter().map(move |n| d.join(n))),
    );
    for path in paths {
        let shown = path.display().to_string();
        if path.is_absolute() && !path.exists() {
            tried.push(shown);
            continue;
        }
        // SAFETY: loading a shared library runs its initialisers; the CUDA driver and NVRTC
        // are built to be dlopen'ed (cudarc loads these very names), and nothing here
        // unloads them while symbols from them are in use (the handle lives in a static).
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => {
                let missing: Vec<&str> = symbols
                    .iter()
                    .copied()
                    .filter(|s| {
                        // SAFETY: only the symbol's presence is checked; the pointer is never
                        // called through this handle.
                        unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err()
                    })
                    .collect();
                if !missing.is_empty() {
                    return Err(CudaError::DeviceUnavailable(format!(
                        "{what} at {shown} lacks {} (too old?)",
                        missing.join(", ")
                    )));
                }
                return Ok((shown, lib));
            }
            Err(_) => tried.push(shown),
        }
    }
    Err(CudaError::DeviceUnavailable(format!(
        "{what} not found; searched {} (set LD_LIBRARY_PATH{})",
        summarize(&tried),
        if what.contains("NVRTC") {
            ", CUDA_HOME or CHORUS_NVRTC"
        } else {
            " or CUDA_HOME"
        }
    )))
}

/// Directories where NVRTC commonly lives outside the loader's path.
fn nvrtc_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(given) = std::env::var_os("CHORUS_NVRTC").map(PathBuf::from) {
        match given.parent() {
            Some(parent) if given.is_file() => dirs.push(parent.to_path_buf()),
            _ => dirs.push(given),
        }
    }
    let mut roots: Vec<PathBuf> = [
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_TOOLKIT_ROOT_DIR",
    ]
    .iter()
    .filter_map(std::env::var_os)
    .map(PathBuf::from)
    .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots.extend(sorted_children(Path::new("/usr/local"), "cuda-"));
    for root in roots {
        dirs.push(root.join("lib64"));
        dirs.push(root.join("lib"));
        dirs.push(root.join("targets/x86_64-linux/lib"));
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    prefixes.extend(interpreter_prefix(
        std::env::args_os().next().map(PathBuf::from),
    ));
    for prefix in prefixes {
        dirs.extend(wheel_dirs(&prefix));
    }
    dirs.retain(|d| d.is_dir());
    dirs
}

/// Where the `nvidia-cuda-nvrtc` wheels put the library in the Python environment at
/// `prefix` (`lib/python3.*/site-packages/nvidia/{cu13,cuda_nvrtc}/lib`), existing or not.
pub fn wheel_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for lib in ["lib", "lib64"] {
        for python in sorted_children(&prefix.join(lib), "python3") {
            let nvidia = python.join("site-packages/nvidia");
            dirs.push(nvidia.join("cu13/lib"));
            dirs.push(nvidia.join("cuda_nvrtc/lib"));
        }
    }
    dirs
}

/// The environment prefix of an interpreter started as `argv0` (`<prefix>/bin/python`): a
/// venv's `python` is a symlink, so the path it was started by is what names the venv.
fn interpreter_prefix(argv0: Option<PathBuf>) -> Option<PathBuf> {
    let argv0 = argv0?;
    let name = argv0.file_name()?.to_string_lossy();
    if !name.starts_with("python") {
        return None;
    }
    let bin = argv0.parent()?;
    (bin.file_name()? == "bin").then(|| bin.parent().map(Path::to_path_buf))?
}

/// The entries of `dir` whose names start with `prefix`, newest-sorting last.
fn sorted_children(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// The list of tried names, shortened for an error message.
fn summarize(tried: &[String]) -> String {
    const SHOWN: usize = 8;
    if tried.len() <= SHOWN {
        tried.join(", ")
    } else {
        format!(
            "{} and {} more",
            tried[..SHOWN].join(", "),
            tried.len() - SHOWN
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_unavailable_error() {
        let names = vec![
            "libchorus-no-such-lib.so".to_string(),
            "libchorus-no-such-lib.so.1".to_string(),
        ];
        let dirs = vec![std::env::temp_dir()];
        let err = open_first("the test library", &names, &dirs, &[]).unwrap_err();
        let CudaError::DeviceUnavailable(text) = &err else {
            panic!("wrong error {err:?}");
        };
        assert!(text.starts_with("the test library not found"), "{text}");
        assert!(text.contains("libchorus-no-such-lib.so.1"), "{text}");
        assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
    }

    #[test]
    fn a_library_without_a_needed_symbol_is_reported_by_symbol() {
        // libc is always there and has no CUDA entry points.
        let names = vec!["libc.so.6".to_string()];
        let err = open_first("libc", &names, &[], &["malloc", "cuInit"]).unwrap_err();
        let CudaError::DeviceUnavailable(text) = &err else {
            panic!("wrong error {err:?}");
        };
        assert!(text.contains("lacks cuInit"), "{text}");
        assert!(!text.contains("malloc"), "{text}");
        let (name, _lib) = open_first("libc", &names, &[], &["malloc"]).unwrap();
        assert_eq!(name, "libc.so.6");
    }

    #[test]
    fn cudarc_asks_for_the_cuda_13_sonames() {
        // The device machine has libcuda.so.1 (driver 580) and libnvrtc.so.13 (CUDA 13.0):
        // the names cudarc will dlopen must include both, or the probe and cudarc disagree.
        assert!(cudarc::get_lib_name_candidates("cuda").contains(&"libcuda.so.1".to_string()));
        assert!(cudarc::get_lib_name_candidates("nvrtc").contains(&"libnvrtc.so.13".to_string()));
    }

    #[test]
    fn the_wheel_layouts_of_cuda_12_and_13_are_searched() {
        let prefix = std::env::temp_dir().join(format!("chorus-wheel-{}", std::process::id()));
        let site = prefix.join("lib/python3.11/site-packages/nvidia");
        for sub in ["cu13/lib", "cuda_nvrtc/lib"] {
            std::fs::create_dir_all(site.join(sub)).unwrap();
        }
        let dirs = wheel_dirs(&prefix);
        assert!(dirs.contains(&site.join("cu13/lib")), "{dirs:?}");
        assert!(dirs.contains(&site.join("cuda_nvrtc/lib")), "{dirs:?}");
        assert!(wheel_dirs(&prefix.join("absent")).is_empty());
        std::fs::remove_dir_all(&prefix).unwrap();
    }

    #[test]
    fn a_venv_is_named_by_the_path_its_python_was_started_as() {
        let at = |p: &str| interpreter_prefix(Some(PathBuf::from(p)));
        assert_eq!(at("/w/venv/bin/python"), Some(PathBuf::from("/w/venv")));
        assert_eq!(at("/w/venv/bin/python3.11"), Some(PathBuf::from("/w/venv")));
        assert_eq!(at("/w/target/debug/deps/chorus_cuda-1234"), None);
        assert_eq!(at("python3"), None);
        assert_eq!(interpreter_prefix(None), None);
    }

    #[test]
    fn long_search_lists_are_shortened() {
        let tried: Vec<String> = (0..20).map(|i| format!("lib{i}.so")).collect();
        let s = summarize(&tried);
        assert!(s.ends_with("and 12 more"), "{s}");
    }
}
