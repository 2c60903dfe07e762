# How a sandbox's Python ends without the interpreter's whole shutdown, which tears down every
# module and frees everything one object at a time (0.6-1 ms of a cold sandbox's start here, and
# about 100 ms for a zygote's child with pandas loaded) when the process is about to go anyway.
# What ending the interpreter does that a program can see is done, as the interpreter does it:
# its threads are waited for, atexit runs, the standard streams are flushed, and the modules of
# the program (its __main__, and what it imported itself: those after the first `loaded` of
# sys.modules) are torn down, so that their objects' finalizers run and the files it left open
# are flushed, and so is C's stdio when the caller can reach C's fflush (`flush_c`, the
# zygote's, through ctypes); C's own exit handlers do not run. Used by airlock's zygote (for its
# children) and its runner (for a cold sandbox, when the code loaded no native code of its own:
# otherwise the interpreter's whole shutdown, whose C exit() does both).
import atexit  # here, not at the end: a zygote's children find it loaded (its import is ~0.2 ms)
import posix
import sys


def _exit_status(code):
    # As the interpreter turns SystemExit into a status.
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _flush_std():
    # As the interpreter's exit flushes them: a closed stream is skipped, a failed flush makes
    # the status 120.
    failed = False
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:
            failed = True
    return failed


def _clear(module):
    # As the interpreter clears a module's globals at exit: names with one leading underscore
    # first, then the rest, never __builtins__ (finalizers still find print and friends).
    names = module.__dict__
    for first in (True, False):
        for name in list(names):
            if name == "__builtins__" or (name.startswith("_") and not name.startswith("__")) != first:
                continue
            try:
                names[name] = None
            except Exception:
                pass


def _finish(status, loaded, flush_c=None):
    # The modules before `loaded` are not torn down: that is what costs, and nothing of the
    # program's is in them unless it put it there.
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    failed = _flush_std()
    try:
        programs = []
        if len(sys.modules) > loaded:
            programs = [m for _, m in list(sys.modules.items())[loaded:]]
        main = sys.modules.get("__main__")
        if main is not None:
            programs.insert(0, main)
        for module in reversed(programs):
            _clear(module)
        import gc

        gc.collect()
    except BaseException:
        pass
    failed = _flush_std() or failed
    if flush_c is not None:
        try:
            flush_c(None)
        except BaseException:
            pass
    posix._exit(120 if failed else status)


