//! Compiled kernels, kept so NVRTC runs once: in this process (per target), and on disk
//! keyed by source hash, target, NVRTC version and the NVRTC options (a build that changes an
//! option, `--fmad` say, must not load an image compiled without it).
//!
//! The disk cache lives in `$CHORUS_KERNEL_CACHE` if set (`off` turns it off), else
//! `$XDG_CACHE_HOME/chorus/kernels`, else `$HOME/.cache/chorus/kernels`. A file that is
//! missing, unreadable or malformed is simply compiled again; writes go through a temporary
//! file and a rename, so a concurrent reader never sees half an image.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::compile::{self, Image, Target};
use crate::error::CudaError;

/// What identifies one compiled image.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Key {
    /// Hex SHA-256 of the translation unit.
    pub source_hash: String,
    pub target: Target,
    pub nvrtc: (u32, u32),
    /// Whether the fp8 instructions were asked for.
    pub fp8_hw: bool,
    /// The NVRTC options the image is compiled with.
    pub options: Vec<String>,
}

impl Key {
    /// The key of the sources `source_hash` compiled for `target` by NVRTC `nvrtc`, with the
    /// options chorus uses at run time ([`compile::options`]).
    pub fn new(source_hash: String, target: Target, nvrtc: (u32, u32), fp8_hw: bool) -> Key {
        Key {
            source_hash,
            target,
            nvrtc,
            fp8_hw,
            options: compile::options(target, fp8_hw),
        }
    }

    /// The same key without the fp8 instructions (the fallback when NVRTC rejects them).
    fn without_fp8(&self) -> Key {
        Key::new(self.source_hash.clone(), self.target, self.nvrtc, false)
    }

    /// The cache file's name for this key.
    pub fn file_name(&self) -> String {
        let hash = &self.source_hash[..self.source_hash.len().min(16)];
        let opts = hex::encode(Sha256::digest(self.options.join("\0").as_bytes()));
        format!(
            "chorus-{hash}-{}-nvrtc{}.{}{}-o{}.{}",
            self.target,
            self.nvrtc.0,
            self.nvrtc.1,
            if self.fp8_hw { "-fp8" } else { "" },
            &opts[..8],
            if self.target.cubin { "cubin" } else { "ptx" }
        )
    }
}

/// The image for `key`: from this process's cache, the disk cache, or NVRTC (in that order).
/// Returns the image and whether the fp8 instructions are in it.
pub fn get_or_compile(key: &Key, source: &str) -> Result<(Arc<Image>, bool), CudaError> {
    type Compiled = HashMap<Key, (Arc<Image>, bool)>;
    static MEMORY: OnceLock<Mutex<Compiled>> = OnceLock::new();
    let memory = MEMORY.get_or_init(Default::default);
    // Held across the compile so two threads opening the same GPU compile once.
    let mut map = memory.lock();
    if let Some(hit) = map.get(key) {
        return Ok(hit.clone());
    }
    let dir = disk_dir(
        std::env::var("CHORUS_KERNEL_CACHE").ok().as_deref(),
        std::env::var("XDG_CACHE_HOME").ok().as_deref(),
        std::env::var("HOME").ok().as_deref(),
    );
    let found = dir.as_deref().and_then(|d| {
        // A cached image compiled without fp8 instructions (after a rejection) is stored
        // under the non-fp8 name; look for both.
        load(d, key).map(|i| (i, key.fp8_hw)).or_else(|| {
            (key.fp8_hw)
                .then(|| load(d, &key.without_fp8()).map(|i| (i, false)))
                .flatten()
        })
    });
    let (image, fp8) = match found {
        Some(hit) => hit,
        None => {
            let (image, stored) = compile(key, source)?;
            if let Some(d) = dir.as_deref()
                && let Err(e) = store(d, &stored, &image)
            {
                tracing::debug!(dir = %d.display(), error = %e, "kernel cache not written");
            }
            let fp8 = stored.fp8_hw;
            (image, fp8)
        }
    };
    let entry = (Arc::new(image), fp8);
    map.insert(key.clone(), entry.clone());
    Ok(entry)
}

/// Compile for `key`; with fp8 instructions, a rejection is retried without them. Returns
/// the image and the key it was compiled under.
fn compile(key: &Key, source: &str) -> Result<(Image, Key), CudaError> {
    match compile::compile_with(source, key.target, &key.options) {
        Ok(image) => Ok((image, key.clone())),
        Err(CudaError::Compile { log, .. }) if key.fp8_hw => {
            let target = key.target;
            tracing::warn!(%target, %log, "fp8 instructions rejected; compiling without them");
            let plain = key.without_fp8();
            compile::compile_with(source, target, &plain.options).map(|image| (image, plain))
        }
        Err(e) => Err(e),
    }
}

/// Where the disk cache is, from the three variables that decide it; `None` when off.
pub fn disk_dir(chorus: Option<&str>, xdg: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    match chorus {
        Some(v) if matches!(v.trim(), "off" | "0" | "false" | "none") => None,
        Some(v) if !v.trim().is_empty() => Some(PathBuf::from(v)),
        _ => match (xdg, home) {
            (Some(x), _) if !x.is_empty() => Some(Path::new(x).join("chorus/kernels")),
            (_, Some(h)) if !h.is_empty() => Some(Path::new(h).join(".cache/chorus/kernels")),
            _ => None,
        },
    }
}

/// The cached image for `key` in `dir`, if present and well formed.
pub fn load(dir: &Path, key: &Key) -> Option<Image> {
    let bytes = std::fs::read(dir.join(key.file_name())).ok()?;
    let image = Image {
        bytes,
        cubin: key.target.cubin,
    };
    if image.is_well_formed() {
        Some(image)
    } else {
        tracing::warn!(
            file = key.file_name(),
            "ignoring a malformed cached kernel image"
        );
        None
    }
}

/// Write `image` for `key` into `dir`, atomically.
pub fn store(dir: &Path, key: &Key, image: &Image) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}.tmp", key.file_name(), std::process::id()));
    std::fs::write(&tmp, &image.bytes)?;
    std::fs::rename(&tmp, dir.join(key.file_name())).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(fp8: bool) -> Key {
        Key::new(
            "0123456789abcdef0123456789abcdef".into(),
            Target {
                arch: 90,
                cubin: true,
            },
            (13, 0),
            fp8,
        )
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("chorus-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn file_names_carry_hash_target_nvrtc_fp8_and_options() {
        let name = key(true).file_name();
        assert!(
            name.starts_with("chorus-0123456789abcdef-sm_90-nvrtc13.0-fp8-o"),
            "{name}"
        );
        assert!(name.ends_with(".cubin"), "{name}");
        let ptx = Key::new(
            key(false).source_hash,
            Target {
                arch: 120,
                cubin: false,
            },
            (13, 0),
            false,
        );
        let name = ptx.file_name();
        assert!(
            name.starts_with("chorus-0123456789abcdef-compute_120-nvrtc13.0-o"),
            "{name}"
        );
        assert!(name.ends_with(".ptx"), "{name}");
    }

    #[test]
    fn keys_differing_only_in_options_name_different_files() {
        let k = key(false);
        assert_eq!(
            k.options,
            compile::options(k.target, false),
            "run-time options"
        );
        let mut other = k.clone();
        other.options.push("--use_fast_math".into());
        assert_ne!(k, other);
        assert_ne!(k.file_name(), other.file_name());
        // An image stored under one set of options is not found under another.
        let dir = scratch("options");
        let image = Image {
            bytes: b"\x7fELF-cubin-bytes".to_vec(),
            cubin: true,
        };
        store(&dir, &k, &image).unwrap();
        assert_eq!(load(&dir, &other), None);
        assert_eq!(load(&dir, &k), Some(image));
        std::fs::remove_dir_all(&dir).unwrap();
        // The fp8 fallback's key carries the fallback's options.
        let plain = key(true).without_fp8();
        assert_eq!(plain, key(false));
    }

    #[test]
    fn the_directory_follows_the_environment() {
        assert_eq!(disk_dir(Some("off"), Some("/x"), Some("/h")), None);
        assert_eq!(
            disk_dir(Some("/c"), Some("/x"), Some("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            disk_dir(None, Some("/x"), Some("/h")),
            Some(PathBuf::from("/x/chorus/kernels"))
        );
        assert_eq!(
            disk_dir(None, None, Some("/h")),
            Some(PathBuf::from("/h/.cache/chorus/kernels"))
        );
        assert_eq!(disk_dir(Some(""), Some(""), None), None);
    }

    #[test]
    fn stored_images_load_back_and_damaged_ones_are_ignored() {
        let dir = scratch("roundtrip");
        let k = key(false);
        assert_eq!(load(&dir, &k), None);
        let image = Image {
            bytes: b"\x7fELF-cubin-bytes".to_vec(),
            cubin: true,
        };
        store(&dir, &k, &image).unwrap();
        assert_eq!(load(&dir, &k), Some(image));
        std::fs::write(dir.join(k.file_name()), b"not an elf").unwrap();
        assert_eq!(load(&dir, &k), None);
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
