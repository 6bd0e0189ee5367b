//! The kernel sources of `kernels/`, embedded at build time, and the names of their kernels.
//!
//! NVRTC compiles one translation unit: the four files below, concatenated in order with
//! `#line` markers so its diagnostics point at the real files.

use std::fmt::Write as _;

use chorus_protocol::{DType, ReduceOp};
use sha2::{Digest, Sha256};

/// The kernel files, in the order they are compiled.
pub const FILES: [(&str, &str); 4] = [
    (
        "kernels/common.cuh",
        include_str!("../../../kernels/common.cuh"),
    ),
    (
        "kernels/reduce.cu",
        include_str!("../../../kernels/reduce.cu"),
    ),
    ("kernels/copy.cu", include_str!("../../../kernels/copy.cu")),
    ("kernels/wait.cu", include_str!("../../../kernels/wait.cu")),
];

/// The copy kernel.
pub const COPY: &str = "chorus_copy";
/// The kernel that polls a peer's counter and the abort word.
pub const WAIT: &str = "chorus_wait";
/// The kernel that raises a peer-visible counter.
pub const SIGNAL: &str = "chorus_signal";
/// The copy into a link's slot, skipped once the link's send stream has retired a wait.
pub const PUT: &str = "chorus_put";
/// The kernel that stops a link's sends before forwarding a payload that arrived partial.
pub const GATE: &str = "chorus_gate";

/// The translation unit NVRTC compiles.
pub fn unit() -> String {
    unit_of(&FILES)
}

/// The translation unit of `files`: each file's text after a `#line` marker naming it.
fn unit_of(files: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (name, text) in files {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "#line 1 \"{name}\"");
        out.push_str(text);
        out.push('\n');
    }
    out
}

/// Hex SHA-256 of the translation unit: part of the on-disk cache key.
pub fn hash() -> String {
    hash_of(&FILES)
}

/// Hex SHA-256 of the translation unit of `files`.
fn hash_of(files: &[(&str, &str)]) -> String {
    hex::encode(Sha256::digest(unit_of(files).as_bytes()))
}

/// The kernel's suffix for a type (`f32`, `bf16`, `f8e4m3`, ...).
pub const fn type_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I8 => "i8",
        DType::U8 => "u8",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::I64 => "i64",
        DType::U64 => "u64",
        DType::F8E4M3 => "f8e4m3",
        DType::F8E5M2 => "f8e5m2",
    }
}

/// The operators that have kernels; the engine composes `Avg` and `PreMulSum` from `Sum`
/// and a scale.
pub const KERNEL_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// The reduce kernel for `op` over `dtype`, or `None` for an operator without a kernel.
pub fn reduce_kernel(op: ReduceOp, dtype: DType) -> Option<String> {
    let op = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
        ReduceOp::Avg | ReduceOp::PreMulSum => return None,
    };
    Some(format!("chorus_reduce_{op}_{}", type_suffix(dtype)))
}

/// The scale kernel for `dtype`.
pub fn scale_kernel(dtype: DType) -> String {
    format!("chorus_scale_{}", type_suffix(dtype))
}

/// The divide kernel for `dtype` (the last step of an average).
pub fn divide_kernel(dtype: DType) -> String {
    format!("chorus_divide_{}", type_suffix(dtype))
}

/// Every kernel the device loads, in a fixed order.
pub fn all_kernels() -> Vec<String> {
    let mut names = Vec::new();
    for dtype in DType::ALL {
        for op in KERNEL_OPS {
            names.extend(reduce_kernel(op, dtype));
        }
        names.push(scale_kernel(dtype));
        names.push(divide_kernel(dtype));
    }
    names.extend([COPY, WAIT, SIGNAL, PUT, GATE].map(String::from));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_the_device_loads_is_defined_in_the_sources() {
        let unit = unit();
        for name in all_kernels() {
            let found = if let Some(rest) = name.strip_prefix("chorus_reduce_") {
                // Defined through CHORUS_REDUCE(op, ..., type, ...) inside CHORUS_TYPE_KERNELS.
                let (op, ty) = rest.split_once('_').unwrap();
                unit.contains(&format!("CHORUS_REDUCE({op}, "))
                    && unit.contains(&format!("CHORUS_TYPE_KERNELS({ty}, "))
            } else if let Some(ty) = name
                .strip_prefix("chorus_scale_")
                .or_else(|| name.strip_prefix("chorus_divide_"))
            {
                unit.contains(&format!("CHORUS_TYPE_KERNELS({ty}, "))
            } else {
                unit.contains(&format!("__global__ void {name}("))
            };
            assert!(found, "{name} is not defined in kernels/");
        }
        assert_eq!(all_kernels().len(), 12 * 6 + 5);
    }

    #[test]
    fn the_unit_has_every_file_in_order_with_line_markers() {
        let unit = unit();
        let mut at = 0;
        for (name, text) in FILES {
            let marker = format!("#line 1 \"{name}\"");
            let pos = unit[at..].find(&marker).expect("marker") + at;
            assert!(unit[pos..].contains(text.lines().next().unwrap()));
            at = pos + marker.len();
        }
        // NVRTC has no system headers here: the sources must not include any.
        assert!(!unit.contains("#include"), "kernels must not #include");
    }

    #[test]
    fn the_hash_is_stable_and_tracks_the_sources() {
        assert_eq!(hash(), hash());
        assert_eq!(hash().len(), 64);
        assert_eq!(
            hash(),
            hash_of(&FILES),
            "the key is the hash of the embedded files"
        );
        // The on-disk cache is keyed by this hash: any edit to a file, a renamed file (its
        // name is in the `#line` markers, so in the diagnostics) or a new order must give a
        // new key, or a stale image would be loaded for new sources.
        for (i, (name, text)) in FILES.iter().enumerate() {
            let edited = format!("{text}\n// edited\n");
            let mut files = FILES;
            files[i].1 = &edited;
            assert_ne!(hash_of(&files), hash(), "an edit to {name}");
            let renamed = format!("{name}.old");
            let mut files = FILES;
            files[i].0 = &renamed;
            assert_ne!(hash_of(&files), hash(), "renaming {name}");
        }
        let mut files = FILES;
        files.swap(0, 1);
        assert_ne!(hash_of(&files), hash(), "another order");
    }

    #[test]
    fn avg_and_premulsum_have_no_kernel() {
        assert_eq!(reduce_kernel(ReduceOp::Avg, DType::F32), None);
        assert_eq!(reduce_kernel(ReduceOp::PreMulSum, DType::F32), None);
        assert_eq!(
            reduce_kernel(ReduceOp::Max, DType::BF16).as_deref(),
            Some("chorus_reduce_max_bf16")
        );
    }
}
