//! Event-stream decoding.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use super::EventsError;

/// Decodes an event-stream message into `[(kind, job_id, worker_id, result, error, token), ...]`.
#[pyfunction]
pub(super) fn decode_events<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
    let events = crate::events::decode(data).map_err(|e| EventsError::new_err(e.to_string()))?;
    let text = |f: Option<&[u8]>, what: &str| -> PyResult<Bound<'py, PyAny>> {
        match f {
            None => Ok(py.None().into_bound(py)),
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) => Ok(match s {
                    "enqueued" => intern!(py, "enqueued").clone().into_any(),
                    "completed" => intern!(py, "completed").clone().into_any(),
                    "failed" => intern!(py, "failed").clone().into_any(),
                    "failing" => intern!(py, "failing").clone().into_any(),
                    "requeued" => intern!(py, "requeued").clone().into_any(),
                    _ => PyString::new(py, s).into_any(),
                }),
                Err(_) => Err(EventsError::new_err(format!("event {what} is not UTF-8"))),
            },
        }
    };
    let bytes = |f: Option<&[u8]>| match f {
        None => py.None().into_bound(py),
        Some(b) => PyBytes::new(py, b).into_any(),
    };
    let list = PyList::empty(py);
    for [kind, id, worker, result, error, token] in events {
        let kind = match kind {
            None => intern!(py, "").clone().into_any(),
            k => text(k, "kind")?,
        };
        let id = match id {
            None => intern!(py, "").clone().into_any(),
            i => text(i, "job id")?,
        };
        let items: [Bound<'py, PyAny>; 6] = [
            kind,
            id,
            text(worker, "worker id")?,
            bytes(result),
            bytes(error),
            text(token, "token")?,
        ];
        list.append(PyTuple::new(py, items)?)?;
    }
    Ok(list)
}
