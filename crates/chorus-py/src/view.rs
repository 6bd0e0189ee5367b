//! The communicator's members and health as plain Python values (dicts and lists, which
//! the pure-Python layer turns into dataclasses). The only file that reads chorus's
//! peer-table and ledger types.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::error;

/// Every member: rank, host, pid, incarnation.
pub(crate) fn members<'py>(py: Python<'py>, comm: &chorus::Comm) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for m in comm.members() {
        let d = PyDict::new(py);
        d.set_item("rank", m.rank.get())?;
        d.set_item("host", &m.host)?;
        d.set_item("pid", m.pid)?;
        d.set_item("incarnation", m.incarnation)?;
        list.append(d)?;
    }
    Ok(list)
}

/// This member's ledger: rank, epoch, world, `peers` (rank, state, last-heard age in
/// seconds or None if never heard, evidence in words or None) and `async_error`.
pub(crate) fn health<'py>(py: Python<'py>, comm: &chorus::Comm) -> PyResult<Bound<'py, PyDict>> {
    let h = comm.health();
    let d = PyDict::new(py);
    d.set_item("rank", h.rank.get())?;
    d.set_item("epoch", h.epoch.get())?;
    d.set_item("world", h.world)?;
    let peers = PyList::empty(py);
    for p in &h.peers {
        let row = PyDict::new(py);
        row.set_item("rank", p.rank.get())?;
        row.set_item("state", format!("{:?}", p.state).to_ascii_lowercase())?;
        let heard = (p.last_heard_ms != u64::MAX).then(|| p.last_heard_ms as f64 / 1000.0);
        row.set_item("last_heard_s", heard)?;
        row.set_item(
            "evidence",
            p.evidence
                .as_ref()
                .map(|e| chorus::error::EvidenceText(e).to_string()),
        )?;
        peers.append(row)?;
    }
    d.set_item("peers", peers)?;
    d.set_item(
        "async_error",
        h.async_error.as_ref().map(|e| error::instance(py, e)),
    )?;
    Ok(d)
}
