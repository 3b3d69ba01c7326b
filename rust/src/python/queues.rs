//! Lock-free queues of Python objects: `MpmcQueue` (bytes) and `ObjectQueue` (any object).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::args::{for_each_item, type_name};
use crate::mpmc::Mpmc;

/// Lock-free multi-producer multi-consumer FIFO of `bytes` objects.
///
/// Stores the very objects pushed (no copies), so `q.pop() is item`.
#[pyclass(frozen, module = "trioqueue._core")]
pub(super) struct MpmcQueue {
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

/// Lock-free multi-producer multi-consumer FIFO of any Python objects: the
/// batch half of `MpmcQueue` without its `bytes` check, for a store that
/// queues its own records (MemoryStorage's ready lanes) rather than bytes.
///
/// Stores the very objects pushed (no copies), so `q.pop_many(1)[0] is item`.
#[pyclass(frozen, module = "trioqueue._core")]
pub(super) struct ObjectQueue {
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
