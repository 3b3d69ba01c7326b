//! Thin PyO3 binding layer: `trioqueue._core`.
//!
//! All logic lives in [`crate::codec`], [`crate::state`] and [`crate::mpmc`];
//! this module only converts arguments and results and maps errors to Python
//! exceptions. Hot paths avoid intermediate copies (envelopes are written
//! straight into the new `bytes` object) and never release the GIL, since
//! every operation is far shorter than a GIL hand-off.

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple};
use pyo3::{create_exception, intern};

use crate::codec::{self, Envelope};
use crate::mpmc::Mpmc;
use crate::resp;
use crate::state::{self, Extra, State};

create_exception!(
    trioqueue._core,
    CodecError,
    PyValueError,
    "Raised when envelope bytes cannot be decoded."
);
create_exception!(
    trioqueue._core,
    EventsError,
    PyValueError,
    "Raised when an event-stream message is malformed."
);
create_exception!(
    trioqueue._core,
    RespProtocolError,
    PyValueError,
    "Raised when bytes from a Redis server are not a RESP2 reply (the connection is out of sync)."
);
create_exception!(
    trioqueue._core,
    ReplyError,
    pyo3::exceptions::PyException,
    "An error reply from a Redis server (returned by RespReader as a value, not raised)."
);
create_exception!(
    trioqueue._core,
    StateError,
    PyValueError,
    "Raised for a malformed job state string or invalid state fields."
);

impl From<codec::CodecError> for PyErr {
    #[cold]
    fn from(e: codec::CodecError) -> PyErr {
        CodecError::new_err(e.to_string())
    }
}

impl From<state::StateError> for PyErr {
    #[cold]
    fn from(e: state::StateError) -> PyErr {
        StateError::new_err(e.to_string())
    }
}

#[cold]
fn internal_buffer_error(_: codec::BufferTooSmall) -> PyErr {
    PyRuntimeError::new_err("trioqueue internal error: envelope size miscomputed")
}

/// The name of `obj`'s type, for error messages.
#[cold]
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Builds the error for an int argument that does not fit `bits` unsigned bits.
#[cold]
#[inline(never)]
fn int_arg_error(obj: &Bound<'_, PyAny>, name: &str, bits: u32) -> PyErr {
    if obj.is_instance_of::<PyInt>() {
        if obj.lt(0i32).unwrap_or(false) {
            PyValueError::new_err(format!("{name} must be >= 0, got {obj}"))
        } else {
            PyOverflowError::new_err(format!(
                "{name} must fit in an unsigned {bits}-bit integer, got {obj}"
            ))
        }
    } else {
        PyTypeError::new_err(format!("{name} must be an int, got {}", type_name(obj)))
    }
}

#[inline]
fn arg_u64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    obj.extract::<u64>()
        .map_err(|_| int_arg_error(obj, name, 64))
}

#[inline]
fn arg_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    match obj
        .extract::<u64>()
        .ok()
        .and_then(|v| u32::try_from(v).ok())
    {
        Some(v) => Ok(v),
        None => Err(int_arg_error(obj, name, 32)),
    }
}

/// Encodes a job envelope (format version 1) to bytes.
#[pyfunction]
#[pyo3(signature = (id, payload, created_at_ms, attempts, max_attempts, result_ttl_ms, correlation_id=None, options=None))]
#[allow(clippy::too_many_arguments)]
fn encode_envelope<'py>(
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
fn decode_envelope<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
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
fn envelope_id<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyString>> {
    Ok(PyString::new(py, codec::envelope_id(data)?))
}

/// Returns a copy of the envelope with `attempts` replaced (other fields,
/// including unknown optional ones, are kept byte for byte).
#[pyfunction]
fn envelope_with_attempts<'py>(
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

/// Decodes an event-stream message into `[(kind, job_id, worker_id, result, error, token), ...]`.
#[pyfunction]
fn decode_events<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
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

/// Parses a job state string into `(kind, ms, extra)`.
#[pyfunction]
fn parse_state<'py>(py: Python<'py>, s: &str) -> PyResult<Bound<'py, PyTuple>> {
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
fn format_state<'py>(
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

/// Lock-free multi-producer multi-consumer FIFO of `bytes` objects.
///
/// Stores the very objects pushed (no copies), so `q.pop() is item`.
#[pyclass(frozen, module = "trioqueue._core")]
struct MpmcQueue {
    inner: Mpmc<Py<PyBytes>>,
}

#[cold]
#[inline(never)]
fn not_bytes(method: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "MpmcQueue.{method}() expects bytes items, got {}",
        type_name(obj)
    ))
}

/// Calls `f` on every item of a list, a tuple (both without the iterator protocol) or
/// any other iterable, stopping at the first error.
fn for_each_item<'py>(
    items: &Bound<'py, PyAny>,
    mut f: impl FnMut(Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if let Ok(list) = items.cast::<PyList>() {
        for obj in list.iter() {
            f(obj)?;
        }
    } else if let Ok(tuple) = items.cast::<PyTuple>() {
        for obj in tuple.iter() {
            f(obj)?;
        }
    } else {
        for obj in items.try_iter()? {
            f(obj?)?;
        }
    }
    Ok(())
}

#[inline]
fn as_bytes(method: &str, obj: Bound<'_, PyAny>) -> PyResult<Py<PyBytes>> {
    match obj.cast_into::<PyBytes>() {
        Ok(b) => Ok(b.unbind()),
        Err(e) => Err(not_bytes(method, &e.into_inner())),
    }
}

/// `pop_many(n)` of either queue class: up to `n` items, oldest first, as a list.
fn pop_list<'py, T>(py: Python<'py>, inner: &Mpmc<T>, n: isize) -> PyResult<Bound<'py, PyList>>
where
    T: IntoPyObject<'py>,
{
    let n = usize::try_from(n)
        .map_err(|_| PyValueError::new_err(format!("n must be >= 0, got {n}")))?;
    PyList::new(py, inner.pop_many(n))
}

#[pymethods]
impl MpmcQueue {
    #[new]
    fn new() -> Self {
        MpmcQueue { inner: Mpmc::new() }
    }

    /// Appends one bytes object.
    fn push(&self, item: &Bound<'_, PyAny>) -> PyResult<()> {
        match item.cast::<PyBytes>() {
            Ok(b) => {
                self.inner.push(b.clone().unbind());
                Ok(())
            }
            Err(_) => Err(not_bytes("push", item)),
        }
    }

    /// Appends every bytes object of an iterable, in order (all or nothing:
    /// nothing is pushed if one item is not bytes).
    fn push_many(&self, items: &Bound<'_, PyAny>) -> PyResult<()> {
        if items.is_instance_of::<PyBytes>() {
            return Err(PyTypeError::new_err(
                "MpmcQueue.push_many() expects an iterable of bytes, got a single bytes \
                 object (use push())",
            ));
        }
        let mut batch: Vec<Py<PyBytes>> = Vec::with_capacity(items.len().unwrap_or(0));
        for_each_item(items, |obj| {
            batch.push(as_bytes("push_many", obj)?);
            Ok(())
        })?;
        self.inner.push_many(batch);
        Ok(())
    }

    /// Removes and returns the oldest item, or None if empty.
    fn pop(&self) -> Option<Py<PyBytes>> {
        self.inner.pop()
    }

    /// Removes and returns up to `n` items, oldest first.
    fn pop_many<'py>(&self, py: Python<'py>, n: isize) -> PyResult<Bound<'py, PyList>> {
        pop_list(py, &self.inner, n)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

// -- RESP2 (the Redis protocol) ------------------------------------------------------

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
fn encode_command<'py>(
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
struct RespReader {
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

/// Lock-free multi-producer multi-consumer FIFO of any Python objects: the
/// batch half of `MpmcQueue` without its `bytes` check, for a store that
/// queues its own records (MemoryStorage's ready lanes) rather than bytes.
///
/// Stores the very objects pushed (no copies), so `q.pop_many(1)[0] is item`.
#[pyclass(frozen, module = "trioqueue._core")]
struct ObjectQueue {
    inner: Mpmc<Py<PyAny>>,
}

#[pymethods]
impl ObjectQueue {
    #[new]
    fn new() -> Self {
        ObjectQueue { inner: Mpmc::new() }
    }

    /// Appends every object of an iterable, in order (nothing is pushed if
    /// iterating fails part-way).
    fn push_many(&self, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut batch: Vec<Py<PyAny>> = Vec::with_capacity(items.len().unwrap_or(0));
        for_each_item(items, |obj| {
            batch.push(obj.unbind());
            Ok(())
        })?;
        self.inner.push_many(batch);
        Ok(())
    }

    /// Removes and returns up to `n` objects, oldest first.
    fn pop_many<'py>(&self, py: Python<'py>, n: isize) -> PyResult<Bound<'py, PyList>> {
        pop_list(py, &self.inner, n)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

#[pymodule(name = "_core")]
fn trioqueue_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ENVELOPE_VERSION", codec::ENVELOPE_VERSION)?;
    m.add("CodecError", py.get_type::<CodecError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("EventsError", py.get_type::<EventsError>())?;
    m.add_function(wrap_pyfunction!(encode_envelope, m)?)?;
    m.add_function(wrap_pyfunction!(decode_envelope, m)?)?;
    m.add_function(wrap_pyfunction!(envelope_id, m)?)?;
    m.add_function(wrap_pyfunction!(envelope_with_attempts, m)?)?;
    m.add_function(wrap_pyfunction!(parse_state, m)?)?;
    m.add_function(wrap_pyfunction!(decode_events, m)?)?;
    m.add_function(wrap_pyfunction!(format_state, m)?)?;
    m.add_class::<MpmcQueue>()?;
    m.add("RespProtocolError", py.get_type::<RespProtocolError>())?;
    m.add("ReplyError", py.get_type::<ReplyError>())?;
    m.add_function(wrap_pyfunction!(encode_command, m)?)?;
    m.add_class::<RespReader>()?;
    m.add_class::<ObjectQueue>()?;
    Ok(())
}
