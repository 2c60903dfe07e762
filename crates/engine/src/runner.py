# airlock's runner: the first Python code of every sandbox, started with
# `python3 -I -S -B -c <this file>` (and the argument `warm` in a sandbox started ahead of its
# work, for the warm pool: it then says it is ready with one byte on descriptor 3 first).
#
# It reads one request (marshal, from the host) from descriptor 3 until EOF, runs the code in a
# fresh __main__, and writes one response (JSON) back on descriptor 3: {"result": ...} or
# {"error": ...}.
# Whatever the code prints goes to stdout/stderr and can never be taken for the response.
# The host treats the response as untrusted data: it parses it with size and depth limits,
# and takes the verdict (status, exit code, signal, limits) only from the kernel.
import os
import sys

# Everything the runner needs, imported before the request is read, so a warm sandbox has it
# ready and user code sees the same modules loaded either way. Kept lean, because every
# sandbox pays for each: `json` and `linecache` would each import `re` and compile patterns,
# more work together than starting the interpreter; `marshal` and `_json` are C.
import _ast
import _json
import marshal
import stat

CHANNEL = 3
MARK = "$airlock"
WORKDIR = "/work"


def read_request():
    chunks = []
    while True:
        chunk = os.read(CHANNEL, 1 << 16)
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


def send(payload, limit):
    data = encode(payload, limit)
    if data is None:
        return False
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(CHANNEL, view):]
        os.close(CHANNEL)
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


# Arrays and tables with more cells than this cross as a marked repr (numpy and pandas
# summarise their own), not as a list the host would refuse as too large anyway.
MAX_CELLS = 100_000


def to_json(value, depth, cap):
    """JSON-native values as they are (tuples as arrays); the types JSON lacks as objects
    marked "$airlock" (README: "What comes back"); anything else as a marked repr. Only
    types already imported by the code are looked for: nothing is imported here."""
    kind = type(value)
    if value is None or value is True or value is False or kind is str:
        return value
    if kind is int:
        if -(2**63) <= value < 2**64:
            return value
        return marked_repr(value, "integer outside the 64-bit range", cap)
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return marked_repr(value, "not a finite number", cap)
        return value
    if depth <= 0:
        return marked_repr(value, "nested too deeply", cap)
    inner = depth - 1
    if isinstance(value, (list, tuple)):
        return [to_json(item, inner, cap) for item in value]
    if isinstance(value, dict):
        if all(type(k) is str for k in value) and MARK not in value:
            return {k: to_json(v, inner, cap) for k, v in value.items()}
        return {MARK: "dict", "items": [[to_json(k, inner, cap), to_json(v, inner, cap)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        import binascii

        return {MARK: "bytes", "base64": binascii.b2a_base64(value, newline=False).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        try:
            items = sorted(value)
        except Exception:
            items = list(value)
        return {MARK: "set", "type": type_name(value), "items": [to_json(i, inner, cap) for i in items]}
    if kind is complex:
        return {MARK: "complex", "real": to_json(value.real, inner, cap), "imag": to_json(value.imag, inner, cap)}
    modules = sys.modules
    numpy = modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            if value.size > MAX_CELLS:
                return marked_repr(value, "array of more than %d cells" % MAX_CELLS, cap)
            return {MARK: "ndarray", "dtype": str(value.dtype), "shape": list(value.shape),
                    "data": to_json(value.tolist(), inner, cap)}
        if isinstance(value, numpy.generic):
            return to_json(value.item(), depth, cap)
    pandas = modules.get("pandas")
    if pandas is not None:
        if isinstance(value, pandas.DataFrame):
            if value.size > MAX_CELLS:
                return marked_repr(value, "table of more than %d cells" % MAX_CELLS, cap)
            return {MARK: "dataframe", "columns": to_json(list(value.columns), inner, cap),
                    "index": to_json(list(value.index), inner, cap),
                    "records": to_json(value.to_dict(orient="records"), inner, cap)}
        if isinstance(value, pandas.Series):
            if value.size > MAX_CELLS:
                return marked_repr(value, "series of more than %d cells" % MAX_CELLS, cap)
            return {MARK: "series", "name": to_json(value.name, inner, cap),
                    "index": to_json(list(value.index), inner, cap),
                    "data": to_json(value.tolist(), inner, cap)}
        if value is pandas.NaT:
            return None
    dt = modules.get("datetime")
    if dt is not None:
        if isinstance(value, (dt.datetime, dt.date, dt.time)):
            return {MARK: "datetime", "type": type_name(value), "iso": value.isoformat()}
        if isinstance(value, dt.timedelta):
            return {MARK: "timedelta", "seconds": value.total_seconds()}
    decimal = modules.get("decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        return {MARK: "decimal", "value": str(value)}
    return marked_repr(value, "not a JSON value", cap)


def call_entrypoint(namespace, name, inputs):
    """Function mode: `name` (or `Class.method`) from the code's namespace, called with the
    inputs (plain data from marshal) as keyword arguments; a coroutine is run to its end."""
    first, *rest = name.split(".")
    try:
        target = namespace[first]
    except KeyError:
        raise NameError("entrypoint %r: the code defines no %r" % (name, first)) from None
    for part in rest:
        target = getattr(target, part)
    if not callable(target):
        raise TypeError("entrypoint %r is %s, not a function" % (name, type_name(target)))
    value = target(**inputs)
    if type(value).__name__ == "coroutine" and type(value).__module__ == "builtins":
        import asyncio

        value = asyncio.run(value)
    return value


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
MIMES = ("text/plain", "text/html", "image/png", "image/svg+xml", "application/json")
budget = [0]


def b64(data):
    import binascii

    return binascii.b2a_base64(data, newline=False).decode("ascii")


def emit(kind, data):
    size = len(data) if type(data) is str else len("".join(ENCODE(data, 0)))
    if budget[0] < 0:
        return
    budget[0] -= size + 32
    if budget[0] < 0:
        note = "[airlock: outputs past %d bytes were dropped]" % (REQUEST["result_limit"] // 2)
        OUTPUTS.append({"type": "text/plain", "data": note})
        return
    OUTPUTS.append({"type": kind, "data": data})


def figure_png(figure):
    import io

    buf = io.BytesIO()
    figure.savefig(buf, format="png")
    return b64(buf.getvalue())


def show_figures(*args, **kwargs):
    """pyplot.show(): every open figure becomes a PNG output, and is closed."""
    pyplot = sys.modules["matplotlib.pyplot"]
    for number in pyplot.get_fignums():
        emit("image/png", figure_png(pyplot.figure(number)))
    pyplot.close("all")


def display(*objects, mime=None):
    """Shows each object as an output: a matplotlib figure or anything with `_repr_png_` as
    PNG, `_repr_svg_` as SVG, `_repr_html_` (a DataFrame) as HTML, a str as text, other data
    as JSON, anything else by its repr; `mime` forces a type for str or bytes data."""
    depth, cap = REQUEST["max_depth"], REQUEST["repr_limit"]
    for obj in objects:
        if mime is not None:
            if mime not in MIMES:
                raise ValueError("display: mime must be one of %s" % ", ".join(MIMES))
            if mime == "application/json":
                emit(mime, to_json(obj, depth, cap))
            elif mime == "image/png" and isinstance(obj, (bytes, bytearray)):
                emit(mime, b64(obj))
            elif mime != "image/png" and isinstance(obj, str):
                emit(mime, obj)
            else:
                raise TypeError("display: %s needs %s" % (mime, "bytes" if mime == "image/png" else "a str"))
            continue
        figures = sys.modules.get("matplotlib.figure")
        if figures is not None and isinstance(obj, figures.Figure):
            emit("image/png", figure_png(obj))
            continue
        shown = False
        for method, kind in (("_repr_png_", "image/png"), ("_repr_svg_", "image/svg+xml"), ("_repr_html_", "text/html")):
            make = getattr(obj, method, None)
            data = make() if callable(make) and not isinstance(obj, type) else None
            if kind == "image/png" and isinstance(data, (bytes, bytearray)):
                emit(kind, b64(data))
            elif kind != "image/png" and isinstance(data, str):
                emit(kind, data)
            else:
                continue
            shown = True
            break
        if shown:
            continue
        if isinstance(obj, str):
            emit("text/plain", obj)
        elif obj is None or isinstance(obj, (bool, int, float, list, tuple, dict)):
            emit("application/json", to_json(obj, depth, cap))
        else:
            emit("text/plain", capped_text(lambda: repr(obj), "repr()", cap)[0])


MAX_OUTPUT_FILES = 100


def collect_files():
    """Files the code left in ./outputs: regular files only, walked through directory
    descriptors without following a symbolic link (nor opening a FIFO or device) anywhere,
    each read whole if it fits what is left of the outputs' budget, else listed as skipped."""
    try:
        top = os.open("outputs", DIRECTORY)
    except OSError:
        return []
    found = []
    for dir_fd, name, path, st in walk(top, 16):
        if len(found) >= MAX_OUTPUT_FILES:
            found.append({"path": path, "size": 0, "skipped": "more than %d files" % MAX_OUTPUT_FILES})
            break
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            found.append({"path": path, "size": 0, "skipped": kind})
            continue
        if st.st_size * 4 // 3 + 64 > budget[0]:
            found.append({"path": path, "size": st.st_size, "skipped": "over the size limit"})
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue  # swapped since the stat: not what was listed
            chunks, left = [], st.st_size + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        if len(data) > st.st_size:
            found.append({"path": path, "size": len(data), "skipped": "still growing"})
            continue
        encoded = b64(data)
        budget[0] -= len(encoded) + 64
        found.append({"path": path, "size": len(data), "base64": encoded})
    return found


DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk(top, depth):
    """(dir_fd, name, path, stat) of everything below the directory descriptor `top`, depth
    first by sorted name, `depth` levels at most, never following a link. At most one
    descriptor per level is open at a time; all are closed, also when the caller stops early."""

    def names(fd):
        try:
            return iter(sorted(os.listdir(fd)))
        except OSError:
            return iter(())

    stack = [(top, "", names(top))]
    try:
        while stack:
            dir_fd, prefix, left = stack[-1]
            name = next(left, None)
            if name is None:
                os.close(dir_fd)
                stack.pop()
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            yield dir_fd, name, prefix + name, st
            if stat.S_ISDIR(st.st_mode) and len(stack) <= depth:
                try:
                    inner = os.open(name, DIRECTORY, dir_fd=dir_fd)
                except OSError:
                    continue
                stack.append((inner, prefix + name + "/", names(inner)))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def finish_outputs(collect):
    """Figures left open at the end are shown too, files in ./outputs collected; the outputs
    go with the answer."""
    if "matplotlib.pyplot" in sys.modules:
        try:
            show_figures()
        except BaseException as exc:  # a figure that cannot be drawn loses only itself
            emit("text/plain", "[airlock: a figure could not be drawn: %s]" % type_name(exc))
    if collect:
        FILES[:] = collect_files()
    return OUTPUTS


def describe(exc, filename):
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next  # the runner's own frames
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        text = "%s (traceback unavailable)\n" % type_name(exc)
    message, _ = capped_text(lambda: str(exc), "str()", 8192)
    if len(text) > 65536:
        text = text[:32768] + "\n... traceback truncated ...\n" + text[-32768:]
    return {"type": type_name(exc), "message": message, "traceback": text}


def write_files(files):
    """Writes files below the working directory without ever following a symbolic link (or
    opening a FIFO or device) that something in the sandbox may have planted."""
    for item in files:
        fd = open_below_workdir(item["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            data = memoryview(item["data"])
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def setup(request):
    """Applies what the request sets for the whole interpreter; returns the code's namespace."""
    global REQUEST
    REQUEST = request
    # The job's environment, over the sandbox's base one (os.environ also calls putenv, so
    # child processes inherit it).
    os.environ.update(request["env"])
    write_files(request["files"])
    sys.path[:0] = [os.getcwd()]
    sys.path.extend(request["sys_path"])
    sys.argv = [request["filename"]]
    if request["stream"]:
        sys.stdout.reconfigure(line_buffering=True)

    def seed_linecache(module):
        module.cache.update(LINES)

    def patch_pyplot(module):
        module.show = show_figures

    sys.meta_path.insert(0, AfterImport({"linecache": seed_linecache, "matplotlib.pyplot": patch_pyplot}))
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


def run(namespace, filename, code, entrypoint, inputs, deliver, collect):
    """Runs code in `namespace` and hands the answer to `deliver`; False if it raised."""
    limit, cap, depth = REQUEST["result_limit"], REQUEST["repr_limit"], REQUEST["max_depth"]
    OUTPUTS.clear()
    FILES.clear()
    budget[0] = limit // 2
    seed_lines(filename, code)
    try:
        tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
        last = None
        if entrypoint is None and tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec")
        tail = compile(last, filename, "eval") if last is not None else None
        del tree, last
        exec(body, namespace)
        if entrypoint is not None:
            value = call_entrypoint(namespace, entrypoint, inputs)
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
        error = describe(exc, filename)
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


# Sessions: one interpreter, many requests. Each travels as a frame (4-byte little-endian
# length, then marshal from the host or JSON from here) on the same descriptor.


def read_exact(n):
    chunks, left = [], n
    while left:
        chunk = os.read(CHANNEL, left)
        if not chunk:
            if left == n:
                return None
            raise EOFError("the host closed the channel mid-request")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame():
    head = read_exact(4)
    if head is None:
        return None
    return marshal.loads(read_exact(int.from_bytes(head, "little")) or b"")


def write_frame(payload, limit):
    data = encode(payload, limit)
    if data is None:
        return False
    view = memoryview(len(data).to_bytes(4, "little") + data)
    while view:
        view = view[os.write(CHANNEL, view):]
    return True


def open_below_workdir(path, flags):
    """Opens `path` below the working directory one component at a time, following no
    symbolic link; with O_CREAT, missing directories are made."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("invalid file path %r" % path)
    dirs = DIRECTORY
    fd = os.open(WORKDIR, dirs)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, dirs, dir_fd=fd)
            except FileNotFoundError:
                if not flags & os.O_CREAT:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                inner = os.open(part, dirs, dir_fd=fd)
            except OSError as exc:
                raise NotADirectoryError("%r: %r is not a directory" % (path, part)) from exc
            os.close(fd)
            fd = inner
        try:
            opened = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=fd)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: the last component is a symbolic link
                raise ValueError("%r is a symbolic link: not followed" % path) from None
            raise
        if not stat.S_ISREG(os.fstat(opened).st_mode):
            os.close(opened)
            raise ValueError("%r is not a regular file" % path)
        return opened
    finally:
        os.close(fd)


def session_op(op, limit):
    """One file operation of a session: its answer."""
    kind = op["op"]
    if kind == "put":
        write_files([{"path": op["path"], "data": op["data"]}])
        return {"result": None}
    if kind == "get":
        fd = open_below_workdir(op["path"], os.O_RDONLY)
        try:
            data = os.read(fd, op["max_bytes"] + 1)
            while len(data) <= op["max_bytes"]:
                more = os.read(fd, op["max_bytes"] + 1 - len(data))
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
        if len(data) > op["max_bytes"]:
            raise ValueError("%r is larger than %d bytes" % (op["path"], op["max_bytes"]))
        return {"result": {"size": len(data), "base64": b64(data)}}
    if kind == "list":
        return {"result": list_workdir(op["max_entries"])}
    raise ValueError("unknown operation %r" % kind)


def list_workdir(most):
    """Every entry below the working directory, without following a link: path, type, size."""
    found = []
    for _, _, path, st in walk(os.open(WORKDIR, DIRECTORY), 32):
        if len(found) >= most:
            break
        mode = st.st_mode
        kind = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else "other"
        found.append({"path": path, "type": kind, "size": st.st_size if kind == "file" else 0})
    found.sort(key=lambda e: e["path"])
    return found


def session():
    """Runs cells and file operations until the host closes the channel. A cell that calls
    sys.exit() ends the session, as it would end the interpreter."""
    request = read_frame()
    namespace = setup(request)
    limit = request["result_limit"]
    write_frame({"result": None}, limit)
    while True:
        op = read_frame()
        if op is None:
            return
        if op["op"] == "exec":
            run(namespace, op["filename"], op["code"], op["entrypoint"], op["inputs"],
                lambda payload: write_frame(payload, limit), False)
            continue
        try:
            reply = session_op(op, limit)
        except Exception as exc:
            message, _ = capped_text(lambda: str(exc), "str()", 8192)
            reply = {"error": {"type": type_name(exc), "message": message, "traceback": None}}
        if not write_frame(reply, limit):
            write_frame({"error": {"type": "ValueError", "message": "the answer is over the limit", "traceback": None}}, limit)


# What is loaded so far lives until the end: kept out of every collection, including the one
# at exit, which otherwise costs more than the rest of the interpreter's shutdown.
import gc

gc.freeze()
if sys.argv[1:] == ["warm"]:
    os.write(CHANNEL, b"R")
if sys.argv[1:] == ["session"]:
    session()
else:
    main()
