//! The pickle guard ([`airlock_pickle`]) as a Python extension module, `airlock_client._pickle`,
//! so that the Python client checks pickles offline, with no server.
//!
//! ```python
//! from airlock_client import _pickle
//! _pickle.scan(data, [], 64 << 20)          # the report, as `airlock pickle scan --json`
//! _pickle.decode(data, [], 64 << 20, 200)   # the value, as `airlock pickle decode` prints it
//! ```
//!
//! Both answer JSON text: `airlock_client.pickle` (the public API) turns it into a report or
//! into Python values. Nothing here imports, calls or unpickles anything; the scan runs with
//! the interpreter released, on the caller's immutable `bytes`. `clients/python`'s
//! `pyproject.toml` builds it with maturin into an abi3 wheel (one for every CPython from
//! 3.11 on); its tests are `clients/python/tests/test_pickle.py`.

use airlock_pickle::{decode as decode_value, scan_file, DecodeError, Options};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    airlock_client._pickle,
    Unsafe,
    PyException,
    "Loading the pickle would call or import something not allowed: args[0] lists the reasons."
);
create_exception!(
    airlock_client._pickle,
    Malformed,
    PyException,
    "Not a pickle CPython could load: args are the offset and the reason."
);
create_exception!(
    airlock_client._pickle,
    Unrepresentable,
    PyException,
    "A safe pickle whose value the decoder cannot give (a container that contains itself, \
     nesting deeper than max_depth, shared parts repeated past the size bound): args[0] says why."
);

create_exception!(
    airlock_client._pickle,
    Failed,
    PyException,
    "The guard itself failed (a bug): args[0] says where. Never a verdict."
);

/// Runs the guard, a panic caught as [`Failed`]: pyo3 would raise its own `PanicException`, a
/// `BaseException` that callers' `except Exception` lets through.
fn guarded<T>(work: impl FnOnce() -> T + std::panic::UnwindSafe) -> PyResult<T> {
    std::panic::catch_unwind(work).map_err(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Failed::new_err((why,))
    })
}

/// The deepest nesting `decode` may be asked to follow. Python's JSON parser, bounded by the
/// recursion limit (1 000 levels), could not read its answer much deeper anyway.
const MAX_DEPTH: usize = 1_000;

/// The stack `decode` needs beyond what the guard grows for itself: serializing and dropping
/// its JSON recurse, up to three levels per level of the value (`{"$dict": [[k, v]]}`), about
/// 400 bytes each in a release build (1.5 MiB did at `MAX_DEPTH`, 1 MiB did not). Callers'
/// threads can have small stacks: what they lack is added (`stacker`), never overflowed.
fn json_stack(max_depth: usize) -> usize {
    (3 * max_depth + 64) * 1024
}

fn options(allow: Vec<String>, max_bytes: usize) -> Options {
    let mut opts = Options {
        max_bytes,
        ..Options::default()
    };
    opts.allow.extend(allow);
    opts
}

/// The report of a pickle or an archive of them (ZIP, tar) as JSON text: exactly what
/// `airlock pickle scan --json` prints for that file, without its `file` field.
#[pyfunction]
#[pyo3(signature = (data, allow, max_bytes))]
fn scan(py: Python<'_>, data: &[u8], allow: Vec<String>, max_bytes: usize) -> PyResult<String> {
    let opts = options(allow, max_bytes);
    py.detach(|| guarded(|| scan_file(data, &opts).to_json().to_string()))
}

/// The value of a safe pickle as JSON text, exactly what `airlock pickle decode` prints;
/// raises [`Unsafe`], [`Malformed`] or [`Unrepresentable`] otherwise.
#[pyfunction]
#[pyo3(signature = (data, allow, max_bytes, max_depth))]
fn decode(
    py: Python<'_>,
    data: &[u8],
    allow: Vec<String>,
    max_bytes: usize,
    max_depth: usize,
) -> PyResult<String> {
    if max_depth > MAX_DEPTH {
        return Err(PyValueError::new_err(format!(
            "max_depth is at most {MAX_DEPTH}"
        )));
    }
    let opts = Options {
        max_depth,
        ..options(allow, max_bytes)
    };
    // As `airlock pickle decode`: an archive holds pickles, it is none.
    if data.starts_with(b"PK\x03\x04") {
        return Err(Malformed::new_err((
            0usize,
            "a ZIP archive; decode takes one pickle (scan the archive instead)",
        )));
    }
    let stack = json_stack(max_depth);
    let decoded = py.detach(|| {
        guarded(|| {
            stacker::maybe_grow(stack, 2 * stack, || {
                decode_value(data, &opts).map(|v| v.to_string())
            })
        })
    })?;
    match decoded {
        Ok(text) => Ok(text),
        Err(DecodeError::Unsafe(reasons)) => Err(Unsafe::new_err((reasons,))),
        Err(DecodeError::Malformed { offset, reason }) => Err(Malformed::new_err((offset, reason))),
        Err(DecodeError::Unrepresentable(why)) => Err(Unrepresentable::new_err((why,))),
    }
}

/// The names CPython itself uses to pickle plain data, allowed by default.
#[pyfunction]
fn default_allow() -> Vec<&'static str> {
    airlock_pickle::DEFAULT_ALLOW.to_vec()
}

#[pymodule]
fn _pickle(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(default_allow, m)?)?;
    let py = m.py();
    m.add("Unsafe", py.get_type::<Unsafe>())?;
    m.add("Malformed", py.get_type::<Malformed>())?;
    m.add("Unrepresentable", py.get_type::<Unrepresentable>())?;
    m.add("Failed", py.get_type::<Failed>())?;
    Ok(())
}
