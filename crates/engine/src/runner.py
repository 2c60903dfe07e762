# airlock's runner: the first Python code of every sandbox, started with
# `python3 -I -S -B -c <the sandbox crate's finish.py, then this file>` (and the argument `warm`
# in a sandbox started ahead of its work, for the warm pool: it then says it is ready with one
# byte on descriptor 3 first).
#
# It reads one request (marshal, from the host) from descriptor 3 until EOF, runs the code in a
# fresh __main__, and writes one response (JSON) back on descriptor 3: {"result": ...} or
# {"error": ...}.
# Whatever the code prints goes to stdout/stderr and can never be taken for the response.
# The host treats the response as untrusted data: it parses it with size and depth limits,
# and takes the verdict (status, exit code, signal, limits) only from the kernel.
import posix
import sys

# Everything the runner needs, imported before the request is read, so a warm sandbox has it
# ready. Kept lean, because every sandbox pays for each: `json` and `linecache` would each
# import `re` and compile patterns, more work together than starting the interpreter; even
# `os` (with `stat`, `posixpath` and `_collections_abc`) costs a cold start about 1.4 ms, so
# the runner uses `posix`, which the interpreter has loaded already, and imports `os` only
# where a sandbox waits for its work anyway (see the end); `marshal` and `_json` are C. Nor
# `_ast`: its first use makes the ~120 classes of the `ast` module (1-1.3 ms), and so does the
# first call of builtin compile(); see compile_code.
import _imp
import _json
import _warnings
import marshal

CHANNEL = 3
MARK = "$airlock"
WORKDIR = "/work"


def read_request():
    chunks = []
    while True:
        chunk = posix.read(CHANNEL, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return marshal.loads(b"".join(chunks))


# json.dumps(payload, ensure_ascii=False, separators=(",", ":")), from json's own C encoder.
# Payloads are built by to_json (or are errors made of strings): exact JSON types only, no
# cycles, no non-finite floats.
ENCODE = _json.make_encoder(None, None, _json.encode_basestring, None, ":", ",", False, False, False)


def encode(payload, limit):
    """The payload as UTF-8 JSON, or None when it is over `limit` bytes."""
    text = "".join(ENCODE(payload, 0))
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (os.fsdecode of odd bytes, for one) are not UTF-8: U+FFFD instead.
        data = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")
    return data if len(data) <= limit else None


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view):]


def send(payload, limit):
    data = encode(payload, limit)
    if data is None:
        return False
    try:
        write_all(CHANNEL, data)
        posix.close(CHANNEL)
    except OSError:
        pass  # the code closed or replaced the channel: there is no result to give
    return True


def answer(outputs, **fields):
    if outputs:
        fields["outputs"] = outputs
    if FILES:
        fields["files"] = FILES
    return fields


def type_name(value):
    cls = type(value)
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", None) or cls.__name__
    return name if module in (None, "builtins") else "%s.%s" % (module, name)


def capped_text(make, label, cap):
    try:
        text = make()
    except BaseException as exc:  # a hostile __repr__ or __str__ only hurts its own result
        text = "<%s raised %s>" % (label, type(exc).__name__)
    if not isinstance(text, str):
        text = "<%s returned %s>" % (label, type(text).__name__)
    if len(text) > cap:
        return text[:cap], True
    return text, False


def marked_repr(value, why, cap):
    text, truncated = capped_text(lambda: repr(value), "repr()", cap)
    return {MARK: "repr", "type": type_name(value), "repr": text, "truncated": truncated, "why": why}


# Integers past 64 bits cross as their decimal digits, up to CPython's default limit on
# converting an int to text (sys.int_info.default_max_str_digits): past it the conversion takes
# quadratic time, so such an int is a marked repr of its hexadecimal digits (linear), cut.
INT_DIGITS = 4300
# 10**INT_DIGITS, made the first time a big int needs it.
TEN_TO_DIGITS = []


def big_int(value, cap):
    if not TEN_TO_DIGITS:
        TEN_TO_DIGITS.append(10**INT_DIGITS)
    if -TEN_TO_DIGITS[0] < value < TEN_TO_DIGITS[0]:
        # The code may have lowered its own limit (sys.set_int_max_str_digits): ours is fixed.
        limit = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)
        try:
            return {MARK: "int", "value": int.__repr__(value)}
        finally:
            sys.set_int_max_str_digits(limit)
    text = hex(value)
    return {MARK: "repr", "type": "int", "repr": text[:cap], "truncated": len(text) > cap,
            "why": "an integer of more than %d digits" % INT_DIGITS}


def to_json(value, depth, cap):
    """JSON-native values as they are (tuples as arrays); everything else by to_json_more."""
    kind = type(value)
    if value is None or value is True or value is False or kind is str:
        return value
    if kind is int:
        if -(2**63) <= value < 2**64:
            return value
        return big_int(value, cap)
    if kind is float:
        if value != value:
            return {MARK: "float", "value": "nan"}
        if value in (float("inf"), float("-inf")):
            return {MARK: "float", "value": "inf" if value > 0 else "-inf"}
        return value
    if depth <= 0:
        return marked_repr(value, "nested too deeply", cap)
    inner = depth - 1
    if isinstance(value, (list, tuple)):
        return [to_json(item, inner, cap) for item in value]
    if isinstance(value, dict) and all(type(k) is str for k in value) and MARK not in value:
        return {k: to_json(v, inner, cap) for k, v in value.items()}
    return more()["to_json_more"](value, depth, cap)


# The rest of the runner (runner_more.py: function mode, the types JSON lacks, outputs, files,
# sessions) travels in the request and is compiled into this module the first time something
# needs it: most executions never do, and compiling it costs more than all of this file.
LOADED = []


def more():
    if not LOADED:
        exec(REQUEST["more"], globals())  # a string: see quick_compile
        LOADED.append(True)
    return globals()


class AfterImport:
    """Runs a hook on a module the moment the code (or a traceback, a warning) imports it,
    then steps aside: `linecache` gets the code's lines (importing it up front would cost every
    sandbox a regular-expression compiler), `matplotlib.pyplot` a `show()` that makes outputs."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        if not self.hooks:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


# Rich outputs (display(), charts), in the order they were made; they may take up to half of
# the result limit, and what comes past that is dropped with a note.
OUTPUTS = []
FILES = []
budget = [0]


def lexists(name):
    try:
        posix.lstat(name)
    except OSError:
        return False
    return True


def finish_outputs(collect):
    """Figures left open at the end are shown too, files in ./outputs collected; the outputs
    go with the answer."""
    if "matplotlib.pyplot" in sys.modules or (collect and lexists("outputs")):
        more()["finish_more"](collect)
    return OUTPUTS


def display(*objects, mime=None):
    """Shows each object as an output (see runner_more.py)."""
    return more()["show"](*objects, mime=mime)


def setup(request):
    """Applies what the request sets for the whole interpreter; returns the code's namespace."""
    global REQUEST
    REQUEST = request
    # The job's environment, over the sandbox's base one (os.environ also calls putenv, so
    # child processes inherit it, and code that imports os sees it).
    if request["env"]:
        import os

        os.environ.update(request["env"])
    if request["files"]:
        more()["write_files"](request["files"])
    if request["tools"] is not None:
        more()["install_tools"](request["tools"])
    sys.path[:0] = [posix.getcwd()]
    sys.path.extend(request["sys_path"])
    sys.argv = [request["filename"]]
    if request["stream"]:
        sys.stdout.reconfigure(line_buffering=True)

    def seed_linecache(module):
        module.cache.update(LINES)

    def patch_pyplot(module):
        module.show = more()["show_figures"]

    hooks = {"linecache": seed_linecache, "matplotlib.pyplot": patch_pyplot}
    for name in [n for n in hooks if n in sys.modules]:
        # Loaded before the request (a zygote's preloads): hooked now.
        hooks.pop(name)(sys.modules[name])
    if hooks:
        sys.meta_path.insert(0, AfterImport(hooks))
    import builtins

    builtins.display = display
    main_module = type(sys)("__main__")
    sys.modules["__main__"] = main_module
    return main_module.__dict__


# The code's lines, by file name, for tracebacks and warnings (never a file of the same name).
LINES = {}


def seed_lines(filename, code):
    LINES[filename] = (len(code), None, code.splitlines(True), filename)
    if "linecache" in sys.modules:
        sys.modules["linecache"].cache[filename] = LINES[filename]


def flush(stream):
    try:
        stream.flush()
    except Exception:
        pass  # the code closed or replaced it: nothing of ours is buffered there


class _Compiled(BaseException):
    pass


def _stop(frame, event, arg):
    raise _Compiled(frame.f_code)


_ERROR = ("error", None, Warning, None, 0)
_SETTRACE = sys.settrace
# How the C side of `warnings` learns that its filters changed; an interpreter without it (its
# filters kept otherwise, as from Python 3.14) compiles the usual way.
_FILTERS_MUTATED = getattr(_warnings, "_filters_mutated", None)


def quick_compile(source, mode):
    """`source` compiled in `mode` ("exec" or "eval") as "<string>", none of it run; None when
    it cannot be, or when compiling it warns.

    exec() and eval() of a string compile it without the `ast` module's classes, which builtin
    compile() makes on its first call, whatever it compiles; a trace function stops the code at
    its first event, before its first instruction. Warnings are made errors meanwhile: one the
    compiler gives would name "<string>", so the caller compiles such code the usual way."""
    filters = _warnings.filters
    filters.insert(0, _ERROR)
    _FILTERS_MUTATED()
    _SETTRACE(_stop)
    try:
        (exec if mode == "exec" else eval)(source, {})
    except _Compiled as stop:
        return stop.args[0]
    except Exception:
        return None
    finally:
        _SETTRACE(None)
        del filters[0]
        _FILTERS_MUTATED()
    return None


# How many lines the search for the last statement tries, and the longest code it is tried for:
# past them, code is compiled the usual way (whose first call costs less than compiling a long
# code several times).
QUICK_TRIES = 4
QUICK_MAX = 16 << 10


def _whole(code):
    body = quick_compile(code, "exec")
    return None if body is None else ([body], None)


def compile_quick(code, last):
    """(bodies, tail) as compile_code gives them, compiled with quick_compile; None when that
    cannot tell, and the caller compiles the usual way.

    The last statement is found from the end: the last line that starts at column 0 with
    something other than a comment where the code before it compiles as statements and the code
    from it compiles as an expression is where the final expression starts. Code before a line
    inside a string, brackets or a continued line does not compile, and code from a line that
    starts a statement compiles as one expression only if that statement is one. The first such
    line (from the end) where the code before it compiles but the rest is no expression shows
    that the last statement is not one, unless the rest holds a semicolon (a statement may start
    after it), a form feed (column 0 anywhere) or a lone carriage return (a line break
    str.rfind does not see)."""
    if _FILTERS_MUTATED is None or len(code) > QUICK_MAX:
        return None
    if "__future__" in code or "\r" in code or "\f" in code:
        return None  # a future import changes how every later line compiles
    if not last:
        return _whole(code)
    end, tried = len(code), 0
    while end > 0 and tried < QUICK_TRIES:
        start = code.rfind("\n", 0, end) + 1
        first = code[start:start + 1]
        end = start - 1
        if first in ("", " ", "\t", "\n", "#"):
            continue
        tried += 1
        head, tail = code[:start], code[start:]
        body = quick_compile(head, "exec")
        if body is None:
            continue
        # Blank lines before the tail, so that its line numbers are the code's.
        tail = "\n" * head.count("\n") + tail
        value = quick_compile(tail, "eval")
        if value is not None:
            return [body], value
        if ";" in tail:
            return None
        rest = quick_compile(tail, "exec")
        return ([body, rest], None) if rest is not None else _whole(code)
    # No line tried: nothing but blank lines, comments and indented ones (which do not compile).
    return _whole(code) if tried == 0 else None


def compile_code(code, filename, last, quick):
    """The code compiled as `filename`: (bodies, tail), the code objects to run in turn and,
    when `last` and the last statement is an expression, that expression apart (its value is
    the result). A one-shot sandbox's interpreter (`quick`) has run no code but ours, so
    quick_compile finds the trace function and the warning filters as the runner left them;
    a session's cells compile with the `ast` module."""
    compiled = compile_quick(code, last) if quick else None
    if compiled is not None:
        for part in compiled[0] + [compiled[1]]:
            if part is not None:
                _imp._fix_co_filename(part, filename)
        return compiled
    import _ast

    tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
    tail = None
    if last and tree.body and isinstance(tree.body[-1], _ast.Expr):
        tail = compile(_ast.Expression(tree.body.pop().value), filename, "eval")
    return [compile(tree, filename, "exec")], tail


def run(namespace, filename, code, entrypoint, inputs, deliver, collect):
    """Runs code in `namespace` and hands the answer to `deliver`; False if it raised."""
    limit, cap, depth = REQUEST["result_limit"], REQUEST["repr_limit"], REQUEST["max_depth"]
    OUTPUTS.clear()
    FILES.clear()
    budget[0] = limit // 2
    seed_lines(filename, code)
    try:
        # `collect`: a one-shot execution (a session's cells run without it).
        bodies, tail = compile_code(code, filename, entrypoint is None, collect)
        for body in bodies:
            exec(body, namespace)
        del bodies
        if entrypoint is not None:
            value = more()["call_entrypoint"](namespace, entrypoint, inputs)
        else:
            value = eval(tail, namespace) if tail is not None else None
    except SystemExit:
        outputs = finish_outputs(collect)
        flush(sys.stdout)
        # One-shot: the outputs go with the exit, whose code the kernel reports. A session's
        # answer would say the cell ended well: the session ends instead, by the exit.
        if outputs and collect:
            deliver(answer(result=None, outputs=outputs))
        raise
    except BaseException as exc:
        error = more()["describe"](exc, filename)
        flush(sys.stdout)
        if REQUEST["echo_traceback"]:
            sys.stderr.write(error["traceback"])
        sys.stderr.flush()
        outputs = finish_outputs(collect)
        if not deliver(answer(error=error, outputs=outputs)):
            error["traceback"] = error["traceback"][:1024]
            deliver({"error": error})
        return False
    outputs = finish_outputs(collect)
    # Before the answer, so that a session's cell owns its output.
    flush(sys.stdout)
    flush(sys.stderr)
    if not deliver(answer(result=to_json(value, depth, cap), outputs=outputs)):
        why = "result larger than %d bytes" % limit
        deliver(answer(result=marked_repr(value, why, min(cap, limit // 4)), outputs=outputs))
    return True


def main():
    request = read_request()
    namespace = setup(request)
    limit = request["result_limit"]
    ok = run(namespace, request["filename"], request["code"], request["entrypoint"], request["inputs"],
             lambda payload: send(payload, limit), True)
    if not ok:
        sys.exit(1)


# Frames: a session's requests and answers (descriptor 3) and code mode's tool calls and
# answers (descriptor 4), each a 4-byte little-endian length, then marshal from the host or
# JSON from here.


def read_exact(fd, n):
    chunks, left = [], n
    while left:
        chunk = posix.read(fd, left)
        if not chunk:
            if left == n:
                return None
            raise EOFError("the host closed the channel in the middle of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    """The host's next message on `fd`; None where the channel ends between frames."""
    head = read_exact(fd, 4)
    if head is None:
        return None
    return marshal.loads(read_exact(fd, int.from_bytes(head, "little")) or b"")


def write_frame(fd, data):
    write_all(fd, len(data).to_bytes(4, "little") + data)


# A sandbox that waits for its work (the warm pool, a session) loads `os` meanwhile, as a
# zygote does for its children (zygote.py uses it): code that imports it finds it loaded.
# Only a one-shot cold start, whose every millisecond is on the caller's clock, leaves it
# to the code that wants it.
if sys.argv[1:] in (["warm"], ["session"]):
    import os
# A session's cells compile with the `ast` module (see compile_code), whose classes the first
# call of compile() makes: made where a session waits for its first cell, or once in a zygote
# for its children's sessions (without loading `_ast`, which a one-shot does not load).
if sys.argv[1:] in (["session"], ["--zygote"]):
    compile("", "<string>", "exec")

# What is loaded so far lives until the end: kept out of every collection, including the one
# at exit, which otherwise costs more than the rest of the interpreter's shutdown.
import gc


def __zygote_start__():
    # A zygote runs this file once with `--zygote` (everything above is then defined once
    # for all its children) and each child calls this; a cold sandbox calls it right away.
    global REQUEST
    if sys.argv[1:] == ["warm"]:
        posix.write(CHANNEL, b"R")
    if sys.argv[1:] == ["session"]:
        REQUEST = read_frame(CHANNEL)
        more()["session"](REQUEST)
    else:
        main()


def __zygote_rehearse__():
    # In a fork of a zygote that is surveyed, never in a child: what a child does with a
    # request for `print(1)`, with nothing read or sent. The zygote records which of its pages
    # this writes, and each child copies those while it waits for its request instead of one
    # fault at a time once the request has come.
    request = {"code": "print(1)\n", "filename": "<string>", "env": {}, "files": [], "stream": False,
               "echo_traceback": False, "sys_path": [], "more": "", "result_limit": 1 << 20,
               "repr_limit": 4096, "max_depth": 64, "tools": None, "entrypoint": None, "inputs": None}
    namespace = setup(request)
    run(namespace, request["filename"], request["code"], None, None,
        lambda payload: encode(payload, request["result_limit"]) is not None, True)


def _end(status, loaded):
    # A cold sandbox's interpreter ends as a zygote's children do (finish.py), unless the code
    # loaded native code of its own (an extension module): what it buffered in C's stdio, and
    # the exit handlers it registered in C, only the interpreter's whole shutdown flushes and
    # runs (by C's exit()).
    try:
        native = any(str(getattr(m, "__file__", "")).endswith(".so") for m in list(sys.modules.values())[loaded:])
    except BaseException:
        native = True
    if native:
        sys.exit(status)
    _finish(status, loaded)


gc.freeze()
if sys.argv[1:] != ["--zygote"]:
    _loaded = len(sys.modules)
    try:
        __zygote_start__()
    except SystemExit as e:
        _end(_exit_status(e.code), _loaded)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        _end(1, _loaded)
    _end(0, _loaded)
