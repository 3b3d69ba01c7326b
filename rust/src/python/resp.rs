//! RESP2 (the Redis protocol): command encoding and the incremental reply reader.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};

use super::args::{for_each_item, type_name};
use super::{ReplyError, RespProtocolError};
use crate::resp;

#[cold]
#[inline(never)]
fn bad_arg(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "a Redis command argument must be bytes, str or int, got {}",
        type_name(obj)
    ))
}

/// Appends one argument (`bytes`, `str` or `int`) as a RESP bulk string.
/// Appends one command argument (bytes, str or int) to `body` as a RESP bulk string.
fn push_arg(obj: &Bound<'_, PyAny>, body: &mut Vec<u8>) -> PyResult<()> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        resp::push_bulk(b.as_bytes(), body);
    } else if let Ok(s) = obj.cast::<PyString>() {
        resp::push_bulk(s.to_str()?.as_bytes(), body);
    } else if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        resp::push_bulk(obj.extract::<i64>()?.to_string().as_bytes(), body);
    } else {
        return Err(bad_arg(obj));
    }
    Ok(())
}

/// The RESP encoding of one command: every argument of every sequence given, in order.
/// The arguments are written straight into one buffer (no copy of each first).
#[pyfunction]
#[pyo3(signature = (*parts))]
pub(super) fn encode_command<'py>(
    py: Python<'py>,
    parts: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut body: Vec<u8> = Vec::with_capacity(512);
    let mut count = 0usize;
    for part in parts.iter() {
        if part.is_instance_of::<PyBytes>() || part.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "expected a sequence of Redis command arguments, got a single bytes/str",
            ));
        }
        for_each_item(&part, |obj| {
            count += 1;
            push_arg(&obj, &mut body)
        })?;
    }
    let mut head: Vec<u8> = Vec::with_capacity(24);
    resp::push_array_header(count, &mut head);
    PyBytes::new_with(py, head.len() + body.len(), |buf| {
        let (h, b) = buf.split_at_mut(head.len());
        h.copy_from_slice(&head);
        b.copy_from_slice(&body);
        Ok(())
    })
}

fn reply_to_py<'py>(py: Python<'py>, value: resp::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        resp::Value::Simple(s) => PyString::new(py, &s).into_any(),
        resp::Value::Error(s) => py.get_type::<ReplyError>().call1((s,))?,
        resp::Value::Int(n) => n.into_pyobject(py)?.into_any(),
        resp::Value::Bulk(Some(b)) => PyBytes::new(py, &b).into_any(),
        resp::Value::Bulk(None) | resp::Value::Array(None) => py.None().into_bound(py),
        resp::Value::Array(Some(items)) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(reply_to_py(py, item)?)?;
            }
            list.into_any()
        }
    })
}

/// Incremental RESP2 reply parser: ``feed()`` bytes as they arrive, ``pop_all()`` the
/// complete replies (bulk strings as ``bytes``, simple strings as ``str``, integers as
/// ``int``, nulls as ``None``, arrays as ``list``, error replies as ``ReplyError``
/// values).
#[pyclass(module = "trioqueue._core")]
pub(super) struct RespReader {
    inner: resp::Reader,
}

#[pymethods]
impl RespReader {
    #[new]
    fn new() -> Self {
        RespReader {
            inner: resp::Reader::new(),
        }
    }

    /// Appends bytes received from the server (``bytes`` or ``bytearray``).
    fn feed(&mut self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(b) = data.cast::<PyBytes>() {
            self.inner.feed(b.as_bytes());
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            self.inner.feed(&b.to_vec());
        } else {
            return Err(PyTypeError::new_err(
                "RespReader.feed() expects bytes or bytearray",
            ));
        }
        Ok(())
    }

    /// Every complete reply fed so far, oldest first; raises ``RespProtocolError`` if
    /// the bytes are not RESP2.
    fn pop_all<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        loop {
            match self.inner.next_reply() {
                Ok(Some(v)) => out.append(reply_to_py(py, v)?)?,
                Ok(None) => return Ok(out),
                Err(e) => return Err(RespProtocolError::new_err(e.to_string())),
            }
        }
    }

    /// Bytes fed that are not part of a complete reply yet.
    fn buffered(&self) -> usize {
        self.inner.buffered()
    }
}
