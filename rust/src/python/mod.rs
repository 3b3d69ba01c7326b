//! Thin PyO3 binding layer: `trioqueue._core`.
//!
//! All logic lives in [`crate::codec`], [`crate::state`] and [`crate::mpmc`];
//! this module only converts arguments and results and maps errors to Python
//! exceptions. Hot paths avoid intermediate copies (envelopes are written
//! straight into the new `bytes` object) and never release the GIL, since
//! every operation is far shorter than a GIL hand-off.
//!
//! Submodules, one concern each: `args` (argument conversion helpers),
//! `envelope` (envelope functions), `job_state` (state strings), `events`
//! (event-stream decoding), `queues` (`MpmcQueue`, `ObjectQueue`) and `resp`
//! (RESP2 command encoding and `RespReader`).

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::codec;
use crate::state;

mod args;
mod envelope;
mod events;
mod job_state;
mod queues;
mod resp;

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

#[pymodule(name = "_core")]
fn trioqueue_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ENVELOPE_VERSION", codec::ENVELOPE_VERSION)?;
    m.add("CodecError", py.get_type::<CodecError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("EventsError", py.get_type::<EventsError>())?;
    m.add_function(wrap_pyfunction!(envelope::encode_envelope, m)?)?;
    m.add_function(wrap_pyfunction!(envelope::decode_envelope, m)?)?;
    m.add_function(wrap_pyfunction!(envelope::envelope_id, m)?)?;
    m.add_function(wrap_pyfunction!(envelope::envelope_with_attempts, m)?)?;
    m.add_function(wrap_pyfunction!(job_state::parse_state, m)?)?;
    m.add_function(wrap_pyfunction!(events::decode_events, m)?)?;
    m.add_function(wrap_pyfunction!(job_state::format_state, m)?)?;
    m.add_class::<queues::MpmcQueue>()?;
    m.add("RespProtocolError", py.get_type::<RespProtocolError>())?;
    m.add("ReplyError", py.get_type::<ReplyError>())?;
    m.add_function(wrap_pyfunction!(resp::encode_command, m)?)?;
    m.add_class::<resp::RespReader>()?;
    m.add_class::<queues::ObjectQueue>()?;
    Ok(())
}
