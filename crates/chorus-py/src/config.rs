//! Keyword arguments to `chorus::Config`: keyword `heartbeat_deadline` is the variable
//! `CHORUS_HEARTBEAT_DEADLINE`, with the same units and the same parser
//! (`Config::with_overrides`), so Python and the environment cannot drift apart.

use std::cell::RefCell;
use std::collections::HashMap;

use chorus::Config;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

const PREFIX: &str = "CHORUS_";

/// The configuration keywords, sorted: every variable `Config::with_overrides` reads, in
/// lowercase without the prefix.
#[pyfunction]
pub(crate) fn config_keys() -> Vec<String> {
    let asked = RefCell::new(Vec::new());
    // Defaults are consistent, so this reads every variable and succeeds; the names are
    // what it asked for either way.
    let _ = Config::default().with_overrides(|var| {
        asked.borrow_mut().push(keyword(var));
        None
    });
    let mut keys = asked.into_inner();
    keys.sort();
    keys.dedup();
    keys
}

/// `base` with `kwargs` applied as their variables would be. An unknown keyword is a
/// `TypeError` naming it; a value the variable would refuse is a `ValueError`.
pub(crate) fn with_kwargs(base: Config, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let Some(kwargs) = kwargs else {
        return Ok(base);
    };
    let known = config_keys();
    let mut values = HashMap::new();
    for (key, value) in kwargs.iter() {
        let key: String = key.extract()?;
        if !known.contains(&key) {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument '{key}' (configuration keywords: {})",
                known.join(", ")
            )));
        }
        values.insert(
            format!("{PREFIX}{}", key.to_ascii_uppercase()),
            text(&key, &value)?,
        );
    }
    base.with_overrides(|var| values.get(var).cloned())
        .map_err(|e| {
            let key = keyword(e.var);
            PyValueError::new_err(format!("{key}={:?}: {}", e.value, e.reason))
        })
}

/// A keyword's value as the variable's text: strings as they are, booleans as
/// `true`/`false`, integers in decimal.
fn text(key: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if value.is_instance_of::<PyString>() {
        value.extract()
    } else if value.is_instance_of::<PyBool>() {
        Ok(if value.extract::<bool>()? {
            "true"
        } else {
            "false"
        }
        .to_owned())
    } else if value.is_instance_of::<PyInt>() {
        Ok(value.str()?.to_string())
    } else {
        Err(PyTypeError::new_err(format!(
            "{key}: expected a str (as CHORUS_{} takes it), bool or int, got {}",
            key.to_ascii_uppercase(),
            value.get_type().name()?
        )))
    }
}

fn keyword(var: &str) -> String {
    var.strip_prefix(PREFIX).unwrap_or(var).to_ascii_lowercase()
}
