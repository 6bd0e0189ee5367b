//! `chorus::Error` to a Python exception: the class `chorus._errors` defines for the
//! error's kind (found by its `[chorus:<kind>]` token), with the structured fields as
//! attributes.

use chorus::error::EvidenceText;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The Python exception for `e`.
pub(crate) fn to_py(py: Python<'_>, e: &chorus::Error) -> PyErr {
    match build(py, e) {
        Ok(exc) => PyErr::from_value(exc),
        // The pure-Python package is missing or broken: keep at least the token and text.
        Err(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// The exception instance for `e` (for `Work.exception()` and `health()`).
pub(crate) fn instance<'py>(py: Python<'py>, e: &chorus::Error) -> Bound<'py, PyAny> {
    to_py(py, e).into_value(py).into_bound(py).into_any()
}

fn build<'py>(py: Python<'py>, e: &chorus::Error) -> PyResult<Bound<'py, PyAny>> {
    let token = e.kind.token();
    let kind = token
        .strip_prefix("[chorus:")
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(token);
    let attrs = PyDict::new(py);
    attrs.set_item("kind", kind)?;
    attrs.set_item("detail", &e.detail)?;
    attrs.set_item("rank", e.rank.map(|r| r.get()))?;
    attrs.set_item("peer", e.peer.map(|r| r.get()))?;
    attrs.set_item("epoch", e.epoch.map(|x| x.get()))?;
    attrs.set_item("collective", e.collective.map(|c| c.to_string()))?;
    attrs.set_item("op", e.op.map(|o| o.get()))?;
    attrs.set_item("step", e.step)?;
    attrs.set_item(
        "evidence",
        e.evidence.as_ref().map(|ev| EvidenceText(ev).to_string()),
    )?;
    attrs.set_item("partial", e.partial_output)?;
    attrs.set_item("waiting_on", e.waiting_on.map(|r| r.get()))?;
    py.import("chorus._errors")?
        .getattr("_from_rust")?
        .call1((e.to_string(), attrs))
}

/// The error for a call on a destroyed communicator.
pub(crate) fn to_py_destroyed() -> PyErr {
    Python::attach(|py| {
        to_py(
            py,
            &chorus::Error::new(
                chorus::ErrorKind::Destroyed,
                "the communicator was destroyed",
            ),
        )
    })
}
