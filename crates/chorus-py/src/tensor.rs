//! torch CPU tensors described from Rust, for the blocking collectives' fast path
//! ([`crate::comm`]), as [`crate::host`] describes numpy arrays: a plain tensor (not a
//! subclass), on the CPU, strided and contiguous, of a dtype chorus carries. Six attribute
//! reads, against the pure-Python description plus an op tuple to build and parse (about
//! 3 µs a call). Anything else goes back to the pure-Python description, which accepts it
//! or names what is wrong, so the two must take exactly the same tensors
//! (`_buffers._tensor_fast` is the Python twin, and the tests hold them together).

use chorus::DType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

use crate::host::Host;
use crate::op::dtype_name;

/// What the description needs from torch, read once torch has been imported by someone
/// (chorus never imports it).
struct Torch {
    tensor: Py<PyType>,
    strided: Py<PyAny>,
    /// `{torch dtype: chorus dtype code}` for the dtypes both have.
    dtypes: Py<PyDict>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

fn torch(py: Python<'_>) -> Option<&Torch> {
    TORCH
        .get_or_try_init(py, || -> PyResult<Torch> {
            let torch = py
                .import(intern!(py, "sys"))?
                .getattr(intern!(py, "modules"))?
                .get_item(intern!(py, "torch"))?;
            let dtype_type = torch.getattr(intern!(py, "dtype"))?;
            let dtypes = PyDict::new(py);
            for d in DType::ALL {
                let name = dtype_name(d);
                let Ok(dt) = torch.getattr(name) else {
                    continue; // an older torch without it (fp8, unsigned)
                };
                // An alias would name another dtype (`str` says which).
                if dt.is_instance(&dtype_type)? && dt.str()?.to_cow()? == format!("torch.{name}") {
                    dtypes.set_item(dt, d.code())?;
                }
            }
            Ok(Torch {
                tensor: torch
                    .getattr(intern!(py, "Tensor"))?
                    .cast_into::<PyType>()?
                    .unbind(),
                strided: torch.getattr(intern!(py, "strided"))?.unbind(),
                dtypes: dtypes.unbind(),
            })
        })
        .ok()
}

/// `obj` as host memory when it is a plain, contiguous, strided CPU tensor of a dtype
/// chorus carries; `None` for anything else (an error reading it included: the general
/// path then says what is wrong).
pub(crate) fn describe(obj: &Bound<'_, PyAny>) -> Option<Host> {
    let py = obj.py();
    let torch = torch(py)?;
    if !obj.get_type().is(torch.tensor.bind(py)) {
        return None;
    }
    let code: u8 = torch
        .dtypes
        .bind(py)
        .get_item(obj.getattr(intern!(py, "dtype")).ok()?)
        .ok()??
        .extract()
        .ok()?;
    let dtype = DType::from_code(code)?;
    let cpu = obj.getattr(intern!(py, "is_cpu")).ok()?.is_truthy().ok()?;
    if !cpu
        || !obj
            .getattr(intern!(py, "layout"))
            .ok()?
            .is(torch.strided.bind(py))
    {
        return None;
    }
    let contiguous = obj.call_method0(intern!(py, "is_contiguous")).ok()?;
    if !contiguous.is_truthy().ok()? {
        return None;
    }
    let numel: usize = obj
        .call_method0(intern!(py, "numel"))
        .ok()?
        .extract()
        .ok()?;
    let addr: usize = obj
        .call_method0(intern!(py, "data_ptr"))
        .ok()?
        .extract()
        .ok()?;
    Some(Host {
        addr,
        nbytes: numel.checked_mul(dtype.size())?,
        dtype,
        numel,
    })
}
