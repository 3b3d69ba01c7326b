//! Job state strings: parse and format.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString, PyTuple};

use super::args::int_arg_error;
use super::StateError;
use crate::state::{self, Extra, State};

/// Parses a job state string into `(kind, ms, extra)`.
#[pyfunction]
pub(super) fn parse_state<'py>(py: Python<'py>, s: &str) -> PyResult<Bound<'py, PyTuple>> {
    let st = state::parse(s)?;
    let ms = st.ms().into_pyobject(py)?.into_any();
    let (kind, extra) = match st {
        State::Queued { .. } => (intern!(py, "queued"), py.None().into_bound(py)),
        State::Completed { .. } => (intern!(py, "completed"), py.None().into_bound(py)),
        State::Failed { .. } => (intern!(py, "failed"), py.None().into_bound(py)),
        State::Cancelled { .. } => (intern!(py, "cancelled"), py.None().into_bound(py)),
        State::Processing { worker_id, .. } => (
            intern!(py, "processing"),
            PyString::new(py, worker_id).into_any(),
        ),
        State::Failing { attempts, .. } => (
            intern!(py, "failing"),
            attempts.into_pyobject(py)?.into_any(),
        ),
        State::Delayed { due_ms, .. } => {
            (intern!(py, "delayed"), due_ms.into_pyobject(py)?.into_any())
        }
    };
    PyTuple::new(py, [kind.clone().into_any(), ms, extra])
}

/// Formats a job state string from `(kind, ms, extra)`, validating the parts.
#[pyfunction]
#[pyo3(signature = (kind, ms, extra=None))]
pub(super) fn format_state<'py>(
    py: Python<'py>,
    kind: &str,
    ms: &Bound<'py, PyAny>,
    extra: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyString>> {
    let ms = match ms.extract::<u64>() {
        Ok(v) => v,
        Err(_) if ms.is_instance_of::<PyInt>() => {
            return Err(StateError::new_err(format!(
                "state timestamp must be a non-negative int that fits in 64 bits, got {ms}"
            )))
        }
        Err(_) => return Err(int_arg_error(ms, "ms", 64)),
    };
    let extra = match extra {
        None => Extra::None,
        Some(obj) if obj.is_none() => Extra::None,
        Some(obj) => {
            if let Ok(s) = obj.cast::<PyString>() {
                Extra::Str(s.to_str()?)
            } else if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
                match obj.extract::<u64>() {
                    Ok(v) => Extra::Int(v),
                    Err(_) => {
                        return Err(StateError::new_err(format!(
                            "state attempts must be a non-negative int, got {obj}"
                        )))
                    }
                }
            } else {
                return Err(StateError::new_err(format!(
                    "state extra field must be None, a str worker id or an int attempts \
                     count, got {}",
                    obj.repr().map(|r| r.to_string()).unwrap_or_default()
                )));
            }
        }
    };
    let st = state::from_parts(kind, ms, extra)?;
    let text = state::StateText::new(&st);
    let mut stack = [0u8; 128];
    if let Some(s) = text.write_into(&mut stack) {
        return Ok(PyString::new(py, s));
    }
    Ok(PyString::new(py, &text.to_text()))
}
