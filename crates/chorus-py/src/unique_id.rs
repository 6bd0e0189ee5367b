//! `UniqueId`: the token that lets ranks find and trust each other (`ncclUniqueId`).
//! `UniqueId.new(world)` starts a bootstrap root in this process (`chorus::RootHost`), which
//! lives as long as this object and every communicator made from it; `UniqueId(token)` is
//! the same id read back in another process.

use std::net::SocketAddr;
use std::sync::Arc;

use chorus::{RootHost, UniqueId};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{config, error};

#[pyclass(frozen, module = "chorus._chorus", name = "UniqueId")]
pub(crate) struct PyUniqueId {
    pub(crate) id: UniqueId,
    pub(crate) root: Option<Arc<RootHost>>,
}

#[pymethods]
impl PyUniqueId {
    /// The id a token (`str(uid)` in the process that made it) names.
    #[new]
    fn parse(token: &str) -> PyResult<Self> {
        let id =
            UniqueId::parse(token).map_err(|e| PyValueError::new_err(format!("token: {e}")))?;
        Ok(PyUniqueId { id, root: None })
    }

    /// A fresh id, with its bootstrap root running in this process for `world` ranks,
    /// listening on `bind` (port 0: any free port). The ranks must join within
    /// `init_timeout`; configuration keywords as for `Comm`.
    #[staticmethod]
    #[pyo3(name = "new", signature = (world, bind="127.0.0.1:0", **config))]
    fn create(
        py: Python<'_>,
        world: u32,
        bind: &str,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let addr: SocketAddr = bind.parse().map_err(|_| {
            PyValueError::new_err(format!("bind: expected an address ip:port, got {bind:?}"))
        })?;
        if world == 0 {
            return Err(PyValueError::new_err(
                "world: expected at least one rank, got 0",
            ));
        }
        let config = config::resolve(config)?;
        let root = py
            .detach(|| RootHost::start(addr, world, &config))
            .map_err(|e| error::to_py(py, &e))?;
        Ok(PyUniqueId {
            id: root.unique_id().clone(),
            root: Some(Arc::new(root)),
        })
    }

    fn __str__(&self) -> String {
        self.id.to_token()
    }

    fn __repr__(&self) -> String {
        // Never the secret: the token is as sensitive as a password.
        format!("UniqueId(root={}, comm={})", self.id.root, self.id.comm)
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.id == other.id
    }

    fn __hash__(&self) -> u64 {
        self.id.comm.get()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        Ok((slf.get_type().into_any(), (slf.get().id.to_token(),)))
    }
}
