//! chorus-py: the Python extension `chorus._chorus`.
//!
//! Floor 5 of the house: a thin PyO3 layer (abi3, CPython 3.9 and later, one wheel for
//! every interpreter) over the `chorus` library. It adds no policy the Rust API lacks:
//! collectives run through `chorus::Comm::run`/`group`, configuration through
//! `chorus::Config::with_overrides`, errors keep `chorus::Error`'s token and fields. The
//! pure-Python package beside it (`python/chorus`) describes buffers, checks arguments and
//! defines the exception classes. Nothing below may depend on this crate.

// `chorus::Error` carries its structured fields inline; it is built only on failure paths.
#![allow(clippy::result_large_err)]

use pyo3::prelude::*;

mod comm;
mod config;
mod cuda;
mod done;
mod drive;
mod error;
mod host;
mod op;
mod order;
mod queue;
mod tensor;
mod unique_id;
mod view;
mod wait;
mod work;

#[pymodule]
fn _chorus(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<comm::PyComm>()?;
    m.add_class::<work::Work>()?;
    m.add_class::<cuda::PyCudaComm>()?;
    m.add_function(wrap_pyfunction!(cuda::cuda_unavailable, m)?)?;
    m.add_class::<unique_id::PyUniqueId>()?;
    m.add_function(wrap_pyfunction!(config::config_keys, m)?)?;
    m.add("DTYPES", op::dtype_table(m.py())?)?;
    Ok(())
}
