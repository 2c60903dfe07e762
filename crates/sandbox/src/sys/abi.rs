//! The C ABI a zygote's Python calls through `ctypes.PyDLL` (which keeps the GIL held, so no
//! other Python thread runs meanwhile). The code itself is the zygote's, [`crate::zygote::state`],
//! and its child's, [`crate::zygote::child`].

use std::os::raw::c_int;

use crate::zygote::{child, state};

/// Takes the zygote's descriptors, compiles the seccomp profile and installs what its
/// children inherit. 0 on success.
#[no_mangle]
pub extern "C" fn airlock_zygote_start() -> c_int {
    state::start()
}

/// Says the zygote is ready (its modules are loaded). 0 on success.
#[no_mangle]
pub extern "C" fn airlock_zygote_ready() -> c_int {
    state::ready()
}

/// Waits for each next child and forks it, with the interpreter's fork hooks, until one is
/// born: 1 in that child (which then calls [`airlock_zygote_child`]); 0, the host is gone and
/// the last child ended; -1, a fatal error.
#[no_mangle]
pub extern "C" fn airlock_zygote_serve() -> c_int {
    state::serve()
}

/// In a fork of the zygote that did what a child does: stops it, for [`airlock_zygote_survey`].
#[no_mangle]
pub extern "C" fn airlock_zygote_surveyed() {
    state::surveyed()
}

/// In the zygote: records which of its pages `pid` (stopped by [`airlock_zygote_surveyed`])
/// wrote, then kills and reaps it.
#[no_mangle]
pub extern "C" fn airlock_zygote_survey(pid: c_int) {
    state::survey(pid)
}

/// In a child, once [`airlock_zygote_serve`] returned 1: enters the jail and confines the
/// process; writes the program's arguments and environment into `out` and returns their
/// length. Never returns on failure.
#[no_mangle]
pub extern "C" fn airlock_zygote_child(out: *mut u8, len: usize) -> usize {
    if out.is_null() {
        crate::sys::exit_immediately(127)
    }
    // SAFETY: the caller (the zygote's Python) passes a writable buffer of `len` bytes that
    // it owns and does not touch during the call.
    let buf = unsafe { std::slice::from_raw_parts_mut(out, len) };
    child::child(buf)
}
