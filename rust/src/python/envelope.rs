//! Envelope functions: encode, decode, read the id, replace the attempts count.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use super::args::{arg_u32, arg_u64};
use super::internal_buffer_error;
use crate::codec::{self, Envelope};

/// Encodes a job envelope (format version 1) to bytes.
#[pyfunction]
#[pyo3(signature = (id, payload, created_at_ms, attempts, max_attempts, result_ttl_ms, correlation_id=None, options=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn encode_envelope<'py>(
    py: Python<'py>,
    id: &str,
    payload: &[u8],
    created_at_ms: &Bound<'py, PyAny>,
    attempts: &Bound<'py, PyAny>,
    max_attempts: &Bound<'py, PyAny>,
    result_ttl_ms: &Bound<'py, PyAny>,
    correlation_id: Option<&str>,
    options: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    let env = Envelope {
        id,
        payload,
        created_at_ms: arg_u64(created_at_ms, "created_at_ms")?,
        attempts: arg_u32(attempts, "attempts")?,
        max_attempts: arg_u32(max_attempts, "max_attempts")?,
        result_ttl_ms: arg_u64(result_ttl_ms, "result_ttl_ms")?,
        correlation_id,
        options,
    };
    let len = codec::encoded_len(&env);
    PyBytes::new_with(py, len, |buf| {
        codec::encode_into(&env, buf)
            .map(|_| ())
            .map_err(internal_buffer_error)
    })
}

/// Decodes an envelope into
/// `(id, payload, created_at_ms, attempts, max_attempts, result_ttl_ms, correlation_id, options)`.
#[pyfunction]
pub(super) fn decode_envelope<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
    let env = codec::decode(data)?;
    let cid = match env.correlation_id {
        Some(c) => PyString::new(py, c).into_any(),
        None => py.None().into_bound(py),
    };
    let options = match env.options {
        Some(o) => PyBytes::new(py, o).into_any(),
        None => py.None().into_bound(py),
    };
    let items: [Bound<'py, PyAny>; 8] = [
        PyString::new(py, env.id).into_any(),
        PyBytes::new(py, env.payload).into_any(),
        env.created_at_ms.into_pyobject(py)?.into_any(),
        env.attempts.into_pyobject(py)?.into_any(),
        env.max_attempts.into_pyobject(py)?.into_any(),
        env.result_ttl_ms.into_pyobject(py)?.into_any(),
        cid,
        options,
    ];
    PyTuple::new(py, items)
}

/// Returns the id of an envelope without copying its payload.
#[pyfunction]
pub(super) fn envelope_id<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyString>> {
    Ok(PyString::new(py, codec::envelope_id(data)?))
}

/// Returns a copy of the envelope with `attempts` replaced (other fields,
/// including unknown optional ones, are kept byte for byte).
#[pyfunction]
pub(super) fn envelope_with_attempts<'py>(
    py: Python<'py>,
    data: &[u8],
    attempts: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let attempts = arg_u32(attempts, "attempts")?;
    let w = codec::with_attempts(data, attempts)?;
    PyBytes::new_with(py, w.len(), |buf| {
        w.write_into(buf).map(|_| ()).map_err(internal_buffer_error)
    })
}
