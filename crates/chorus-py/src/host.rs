//! numpy arrays described from Rust in one attribute read: numpy's C-struct array
//! interface (`__array_struct__`, a capsule holding a `PyArrayInterface`), which costs a
//! fraction of what building the `__array_interface__` dict does. It serves the blocking
//! collectives' fast path ([`crate::comm`]); anything it does not take (another type, a
//! dtype chorus lacks, strides, the wrong byte order, read-only memory to write) goes back
//! to the pure-Python description, which accepts it or names what is wrong.
//!
//! The extension is built for the limited API of CPython 3.9, which has no buffer protocol
//! (`PyObject_GetBuffer` joined it in 3.11); capsules it has.

use std::ffi::{c_char, c_int, c_void};

use chorus::DType;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyType};
use pyo3::{ffi, intern};

/// `PyArrayInterface`, as numpy's array interface protocol defines it (its layout has not
/// changed since the protocol's first version).
#[repr(C)]
struct ArrayInterface {
    /// Always 2: a sanity check.
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *const isize,
    /// Unread: C-contiguity is what `flags` says.
    #[allow(dead_code)]
    strides: *const isize,
    data: *mut c_void,
    /// Unread: `typekind` and `itemsize` name every dtype taken here.
    #[allow(dead_code)]
    descr: *mut ffi::PyObject,
}

const C_CONTIGUOUS: c_int = 0x0001;
const NOTSWAPPED: c_int = 0x0200;
const WRITEABLE: c_int = 0x0400;

/// One array's memory as a collective names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    pub(crate) addr: usize,
    pub(crate) nbytes: usize,
    pub(crate) dtype: DType,
    pub(crate) numel: usize,
}

/// numpy's `ndarray` type, once numpy has been imported by someone (chorus never imports
/// it).
static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn ndarray(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    NDARRAY
        .get_or_try_init(py, || -> PyResult<Py<PyType>> {
            let modules = py
                .import(intern!(py, "sys"))?
                .getattr(intern!(py, "modules"))?;
            let numpy = modules.get_item(intern!(py, "numpy"))?;
            Ok(numpy
                .getattr(intern!(py, "ndarray"))?
                .cast_into::<PyType>()?
                .unbind())
        })
        .ok()
        .map(|t| t.bind(py))
}

/// `obj` as host memory, when it is a numpy `ndarray` (exactly; subclasses go the general
/// way) that is C-contiguous, in native byte order, of a dtype chorus carries, and
/// writable when `writable`. `None` for anything else.
pub(crate) fn describe(obj: &Bound<'_, PyAny>, writable: bool) -> Option<Host> {
    let py = obj.py();
    if !obj.get_type().is(ndarray(py)?) {
        return None;
    }
    let capsule = obj
        .getattr(intern!(py, "__array_struct__"))
        .ok()?
        .cast_into::<PyCapsule>()
        .ok()?;
    let ptr = capsule.pointer_checked(None).ok()?;
    // SAFETY: numpy's `__array_struct__` capsule (unnamed) points at a `PyArrayInterface`
    // that lives as long as the capsule, which this frame holds; `two == 2` is checked
    // before any other field is trusted.
    let ai = unsafe { &*ptr.as_ptr().cast::<ArrayInterface>() };
    if ai.two != 2 || ai.nd < 0 || ai.flags & C_CONTIGUOUS == 0 {
        return None;
    }
    if writable && ai.flags & WRITEABLE == 0 {
        return None;
    }
    let itemsize = usize::try_from(ai.itemsize).ok()?;
    if itemsize > 1 && ai.flags & NOTSWAPPED == 0 {
        return None;
    }
    let dtype = dtype(ai.typekind as u8, itemsize)?;
    let mut numel: usize = 1;
    for i in 0..ai.nd as usize {
        // SAFETY: `shape` holds `nd` entries (the protocol's contract).
        let n = unsafe { *ai.shape.add(i) };
        numel = numel.checked_mul(usize::try_from(n).ok()?)?;
    }
    Some(Host {
        addr: ai.data as usize,
        nbytes: numel.checked_mul(itemsize)?,
        dtype,
        numel,
    })
}

/// The dtype of numpy's type kind and item size, for those chorus carries and numpy has
/// natively (bfloat16 and fp8 come from ml_dtypes, as kind `V`: the general path).
fn dtype(kind: u8, itemsize: usize) -> Option<DType> {
    Some(match (kind, itemsize) {
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'i', 1) => DType::I8,
        (b'u', 1) => DType::U8,
        (b'i', 4) => DType::I32,
        (b'u', 4) => DType::U32,
        (b'i', 8) => DType::I64,
        (b'u', 8) => DType::U64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_dtypes_numpy_has_natively() {
        assert_eq!(dtype(b'f', 4), Some(DType::F32));
        assert_eq!(dtype(b'u', 8), Some(DType::U64));
        assert_eq!(dtype(b'i', 2), None, "int16 is not carried");
        assert_eq!(dtype(b'b', 1), None, "bool goes the general way");
        assert_eq!(dtype(b'V', 2), None, "ml_dtypes' bfloat16 too");
        assert_eq!(dtype(b'c', 8), None);
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn the_struct_has_the_protocols_layout() {
        // int two, nd; char typekind; int itemsize, flags; then four pointers.
        assert_eq!(std::mem::offset_of!(ArrayInterface, itemsize), 12);
        assert_eq!(std::mem::offset_of!(ArrayInterface, flags), 16);
        assert_eq!(std::mem::offset_of!(ArrayInterface, shape), 24);
        assert_eq!(std::mem::offset_of!(ArrayInterface, data), 40);
        assert_eq!(std::mem::size_of::<ArrayInterface>(), 56);
    }
}
