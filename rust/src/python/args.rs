//! Argument conversion helpers shared by the bindings.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

/// The name of `obj`'s type, for error messages.
#[cold]
pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Builds the error for an int argument that does not fit `bits` unsigned bits.
#[cold]
#[inline(never)]
pub(super) fn int_arg_error(obj: &Bound<'_, PyAny>, name: &str, bits: u32) -> PyErr {
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
pub(super) fn arg_u64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    obj.extract::<u64>()
        .map_err(|_| int_arg_error(obj, name, 64))
}

#[inline]
pub(super) fn arg_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    match obj
        .extract::<u64>()
        .ok()
        .and_then(|v| u32::try_from(v).ok())
    {
        Some(v) => Ok(v),
        None => Err(int_arg_error(obj, name, 32)),
    }
}

/// Calls `f` on every item of a list, a tuple (both without the iterator protocol) or
/// any other iterable, stopping at the first error.
pub(super) fn for_each_item<'py>(
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
