//! `Element`: the Rust types a collective can carry, each with its wire `DType`. Typed calls
//! (`comm.all_reduce(&[f32], &mut [f32], ..)`) view buffers as bytes through bytemuck, so no
//! unsafe casting happens here; untyped calls take `&[u8]` and a `DType` (fp8, or memory a
//! framework holds without a Rust type).

use chorus_protocol::DType;
use half::{bf16, f16};

/// A plain-data element type with a wire dtype.
pub trait Element: bytemuck::Pod + Send + Sync {
    /// The dtype the wire and the engine know this type as.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DType = DType::$d;
        })*
    };
}

element!(
    f32 => F32,
    f64 => F64,
    f16 => F16,
    bf16 => BF16,
    i8 => I8,
    u8 => U8,
    i32 => I32,
    u32 => U32,
    i64 => I64,
    u64 => U64,
);

/// `slice` as bytes.
pub(crate) fn bytes<T: Element>(slice: &[T]) -> &[u8] {
    bytemuck::cast_slice(slice)
}

/// `slice` as mutable bytes.
pub(crate) fn bytes_mut<T: Element>(slice: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_agree_with_the_wire() {
        fn check<T: Element>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{}", T::DTYPE);
        }
        check::<f32>();
        check::<f64>();
        check::<f16>();
        check::<bf16>();
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        let v = [1.0f32, 2.0];
        assert_eq!(bytes(&v).len(), 8);
    }
}
