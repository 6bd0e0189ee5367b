//! Keyword arguments to `chorus::Config`: keyword `heartbeat_deadline` is the variable
//! `CHORUS_HEARTBEAT_DEADLINE`, with the same units and the same parser
//! (`Config::with_overrides`), so Python and the environment cannot drift apart.
//!
//! Both apply, to every constructor (`Comm`, `Comm.from_env`, `Comm.join`,
//! `UniqueId.new`): a keyword beats its variable, a variable beats the default. A variable
//! a keyword overrides is not read at all, so a bad value there does not matter.

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

/// The configuration: `kwargs`, else the `CHORUS_*` environment, else the defaults. An
/// unknown keyword is a `TypeError` naming it; a value the variable would refuse is a
/// `ValueError` naming the keyword or the variable it came from.
pub(crate) fn resolve(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    resolve_with(kwargs, |var| std::env::var(var).ok())
}

fn resolve_with(
    kwargs: Option<&Bound<'_, PyDict>>,
    env: impl Fn(&str) -> Option<String>,
) -> PyResult<Config> {
    let mut values = HashMap::new();
    if let Some(kwargs) = kwargs {
        let known = config_keys();
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
    }
    Config::default()
        .with_overrides(|var| values.get(var).cloned().or_else(|| env(var)))
        .map_err(|e| {
            let name = if values.contains_key(e.var) {
                keyword(e.var)
            } else {
                e.var.to_owned()
            };
            PyValueError::new_err(format!("{name}={:?}: {}", e.value, e.reason))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_keyword_beats_its_variable_and_a_variable_beats_the_default() {
        Python::initialize();
        Python::attach(|py| {
            let kwargs = PyDict::new(py);
            kwargs.set_item("op_timeout", "7s").unwrap();
            let vars = env(&[("CHORUS_OP_TIMEOUT", "9s"), ("CHORUS_INIT_TIMEOUT", "11s")]);
            let c = resolve_with(Some(&kwargs), vars).unwrap();
            assert_eq!(c.op_timeout, std::time::Duration::from_secs(7));
            assert_eq!(c.init_timeout, std::time::Duration::from_secs(11));
            assert_eq!(c.agree_timeout, Config::default().agree_timeout);
        });
    }

    #[test]
    fn a_bad_variable_is_named_unless_a_keyword_overrides_it() {
        Python::initialize();
        Python::attach(|py| {
            let vars = env(&[("CHORUS_OP_TIMEOUT", "soon")]);
            let e = resolve_with(None, &vars).unwrap_err();
            assert!(e.to_string().contains("CHORUS_OP_TIMEOUT=\"soon\""), "{e}");
            let kwargs = PyDict::new(py);
            kwargs.set_item("op_timeout", "7s").unwrap();
            assert!(resolve_with(Some(&kwargs), &vars).is_ok());
            kwargs.set_item("op_timeout", "later").unwrap();
            let e = resolve_with(Some(&kwargs), &vars).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("ValueError: op_timeout=\"later\""),
                "{e}"
            );
        });
    }
}
