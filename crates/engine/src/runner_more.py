# The rest of airlock's runner (see runner.py): compiled into the runner's own module the
# first time something needs it, so everything here sees runner.py's names (REQUEST, OUTPUTS,
# to_json, ...) and they see these. Function mode, the types JSON lacks, rich outputs, files
# and sessions live here; a `print(1)` never compiles this file.

import os
import stat


# Arrays and tables with more cells than this cross as a marked repr (numpy and pandas
# summarise their own), not as a list the host would refuse as too large anyway.
MAX_CELLS = 100_000



def to_json_more(value, depth, cap):
    """to_json for the types JSON lacks (README: "What comes back"): objects marked "$airlock",
    anything else a marked repr. Only types the code already imported are looked for."""
    kind = type(value)
    inner = depth - 1
    if isinstance(value, dict):
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
            # The dtypes too: records alone cannot tell int64 from object, or a date from a string.
            return {MARK: "dataframe", "columns": to_json(list(value.columns), inner, cap),
                    "index": to_json(list(value.index), inner, cap),
                    "dtypes": [str(dtype) for dtype in value.dtypes],
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



MIMES = ("text/plain", "text/html", "image/png", "image/svg+xml", "application/json")

def b64(data):
    import binascii

    return binascii.b2a_base64(data, newline=False).decode("ascii")



# The host takes at most 1000 outputs: the last place is kept for the note.
MAX_OUTPUTS = 1000


def emit(kind, data):
    size = len(data) if type(data) is str else len("".join(ENCODE(data, 0)))
    if budget[0] < 0:
        return
    budget[0] -= size + 32
    if budget[0] < 0 or len(OUTPUTS) >= MAX_OUTPUTS - 1:
        budget[0] = -1
        note = "[airlock: outputs past %d bytes or %d outputs were dropped]" % (
            REQUEST["result_limit"] // 2, MAX_OUTPUTS - 1)
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



def show(*objects, mime=None):
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



def describe(exc, filename):
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next  # the runner's own frames
    # A tool's error points at the code's line, not at the tools package inside airlock.
    last, inner = None, tb
    while inner is not None:
        if inner.tb_frame.f_code.co_filename.startswith("<tools."):
            if last is not None:
                last.tb_next = None
            break
        last, inner = inner, inner.tb_next
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



def answer_frame(payload, limit):
    data = encode(payload, limit)
    if data is None:
        return False
    write_frame(CHANNEL, data)
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
        # Refused before it is opened: a link, a FIFO, a device (and checked again after, in
        # case it was swapped in between).
        try:
            mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            raise ValueError("%r is a symbolic link: not followed" % path)
        if mode is not None and not stat.S_ISREG(mode):
            raise ValueError("%r is not a regular file" % path)
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


def finish_more(collect):
    """Figures left open at the end become outputs; with `collect`, the files in ./outputs."""
    if "matplotlib.pyplot" in sys.modules:
        try:
            show_figures()
        except BaseException as exc:  # a figure that cannot be drawn loses only itself
            emit("text/plain", "[airlock: a figure could not be drawn: %s]" % type_name(exc))
    if collect:
        FILES[:] = collect_files()


def session(request):
    """Runs cells and file operations until the host closes the channel. A cell that calls
    sys.exit() ends the session, as it would end the interpreter."""
    namespace = setup(request)
    limit = request["result_limit"]
    answer_frame({"result": None}, limit)
    while True:
        op = read_frame(CHANNEL)
        if op is None:
            return
        if op["op"] in ("snapshot", "restore"):
            snapshot_op(op, namespace, limit)
            continue
        if op["op"] == "exec":
            if "tools" in op:
                install_tools(op["tools"])
            # Packages an earlier cell installed (pip's target is on sys.path from the start,
            # and a directory that did not exist then is remembered as empty until this).
            import importlib
            importlib.invalidate_caches()
            run(namespace, op["filename"], op["code"], op["entrypoint"], op["inputs"],
                lambda payload: answer_frame(payload, limit), False)
            continue
        try:
            reply = session_op(op, limit)
        except Exception as exc:
            message, _ = capped_text(lambda: str(exc), "str()", 8192)
            reply = {"error": {"type": type_name(exc), "message": message, "traceback": None}}
        if not answer_frame(reply, limit):
            answer_frame({"error": {"type": "ValueError", "message": "the answer is over the limit", "traceback": None}}, limit)


# Snapshots: a session's state written out (`snapshot`) for the host to keep as opaque bytes,
# and read back into a fresh session (`restore`). Both run here, inside a sandbox of the
# session's own key; the host never parses them. The stream: a magic line, then records (a
# tag byte, an 8-byte little-endian length, the payload): `T` the files of the scratch file
# system (/work, /tmp, /dev/shm, volumes left out) as one tar stream cut into records, `P`
# the variables as one cloudpickle (protocol 5), `B` each out-of-band buffer it took (numpy's
# and pandas' data, never copied), `M` what was left out and why. Sent to the host as binary
# frames ended by an empty one; received as marshal byte frames ended by an empty one.
SNAPSHOT_MAGIC = b"airlock-snapshot-1\n"
SNAPSHOT_CHUNK = 1 << 20
SCRATCH = ("/work", "/tmp", "/dev/shm")


class FrameSink:
    """A file to write the snapshot to: binary frames of SNAPSHOT_CHUNK bytes on the channel."""

    def __init__(self):
        self.buffer = bytearray()

    def write(self, data):
        data = memoryview(data).cast("B")
        if len(self.buffer) + len(data) < SNAPSHOT_CHUNK:
            self.buffer += data
            return len(data)
        if self.buffer:
            self.flush()
        for start in range(0, len(data), SNAPSHOT_CHUNK):
            write_frame_view(data[start:start + SNAPSHOT_CHUNK])
        return len(data)

    def record(self, tag, payload):
        payload = memoryview(payload).cast("B")
        self.write(tag + len(payload).to_bytes(8, "little"))
        self.write(payload)

    def flush(self):
        if self.buffer:
            write_frame(CHANNEL, bytes(self.buffer))
            self.buffer = bytearray()

    def end(self):
        self.flush()
        write_frame(CHANNEL, b"")


def write_frame_view(view):
    """A frame of `view`'s bytes, written from where they are (an array's data, uncopied)."""
    head = len(view).to_bytes(4, "little")
    done = posix.writev(CHANNEL, [head, view])
    if done < 4:
        write_all(CHANNEL, head[done:])
        done = 4
    write_all(CHANNEL, view[done - 4:])


class TarRecords:
    """What tarfile writes, as `T` records."""

    def __init__(self, sink):
        self.sink = sink

    def write(self, data):
        self.sink.record(b"T", data)
        return len(data)


class FrameSource:
    """The snapshot as the host sends it: frames each holding one marshalled bytes object,
    until an empty one; read straight from the channel into where the bytes go."""

    def __init__(self):
        self.left = 0  # bytes of the current frame not read yet
        self.done = False

    def next_frame(self):
        head = read_exact(CHANNEL, 4)
        if head is None:
            raise EOFError("the host closed the channel in the middle of a snapshot")
        length = int.from_bytes(head, "little")
        prefix = read_exact(CHANNEL, 5) if length >= 5 else None
        # marshal's bytes: a type byte ('s', with or without its reference flag), a length.
        if prefix is None or prefix[0] & 0x7F != ord("s") or int.from_bytes(prefix[1:], "little") != length - 5:
            raise ValueError("the host sent something else than the snapshot's bytes")
        self.left = length - 5
        if not self.left:
            self.done = True

    def read(self, n):
        out = bytearray()
        while len(out) < n and not self.done:
            if not self.left:
                self.next_frame()
                continue
            chunk = read_exact(CHANNEL, min(self.left, n - len(out)))
            self.left -= len(chunk)
            out += chunk
        return out

    def exactly(self, n):
        data = self.read(n)
        if len(data) != n:
            raise ValueError("the snapshot ends early")
        return data

    def buffer(self, n):
        """`n` bytes into a new bytearray, read into it in place (an array's data)."""
        out = bytearray(n)
        view = memoryview(out)
        filled = 0
        while filled < n:
            if self.done:
                raise ValueError("the snapshot ends early")
            if not self.left:
                self.next_frame()
                continue
            got = posix.readv(CHANNEL, [view[filled:filled + min(self.left, n - filled)]])
            if not got:
                raise EOFError("the host closed the channel in the middle of a snapshot")
            filled += got
            self.left -= got
        return out

    def drain(self):
        while not self.done:
            if not self.left:
                self.next_frame()
                continue
            self.left -= len(read_exact(CHANNEL, min(self.left, SNAPSHOT_CHUNK)))


class Records:
    """The records of a snapshot, one at a time (`peek` looks at the next tag)."""

    def __init__(self, source):
        self.source = source
        self.head = None

    def peek(self):
        if self.head is None:
            tag = self.source.read(1)
            length = int.from_bytes(self.source.exactly(8), "little") if tag else 0
            self.head = (tag, length)
        return self.head[0]

    def take(self):
        self.peek()
        tag, length = self.head
        self.head = None
        return tag, self.source.exactly(length) if length else b""

    def take_buffer(self):
        """The next record's payload as a bytearray of its own (an out-of-band buffer)."""
        self.peek()
        _, length = self.head
        self.head = None
        return self.source.buffer(length)


class TarSource:
    """The `T` records, read as one file by tarfile."""

    def __init__(self, records):
        self.records = records
        self.pending = b""

    def read(self, n=-1):
        out = bytearray()
        while n < 0 or len(out) < n:
            if not self.pending:
                if self.records.peek() != b"T":
                    break
                self.pending = self.records.take()[1]
            take = self.pending if n < 0 else self.pending[:n - len(out)]
            out += take
            self.pending = self.pending[len(take):]
        return bytes(out)


def scratch_files(tar):
    """Adds the scratch file system's files to `tar`: below each scratch mount, never crossing
    into another file system (a volume), never following a link."""
    device = os.lstat(WORKDIR).st_dev
    for top in SCRATCH:
        try:
            if os.lstat(top).st_dev != device:
                continue
        except OSError:
            continue
        for root, dirs, files in os.walk(top):
            kept = []
            for name in sorted(dirs):
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) and st.st_dev != device:
                    continue  # a volume's mount: kept apart, mounted again on resume
                tar.add(path, arcname=path.lstrip("/"), recursive=False)
                if stat.S_ISDIR(st.st_mode):
                    kept.append(name)
            dirs[:] = kept
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        tar.add(path, arcname=path.lstrip("/"), recursive=False)
                except OSError:
                    continue


def why_not(exc):
    message, _ = capped_text(lambda: str(exc), "str()", 512)
    return "%s: %s" % (type_name(exc), message)


def dump_variables(values):
    """The variables as one pickle and its out-of-band buffers."""
    import cloudpickle

    buffers = []
    data = cloudpickle.dumps(values, protocol=5, buffer_callback=buffers.append)
    return data, buffers


def take_snapshot(namespace, sink):
    import tarfile

    sink.write(SNAPSHOT_MAGIC)
    with tarfile.open(fileobj=TarRecords(sink), mode="w|", format=tarfile.PAX_FORMAT,
                      bufsize=SNAPSHOT_CHUNK) as tar:
        scratch_files(tar)
    names = [n for n in namespace if not (n.startswith("__") and n.endswith("__"))]
    values = {n: namespace[n] for n in names}
    not_kept = {}
    try:
        data, buffers = dump_variables(values)
    except Exception:
        # Find the ones that cannot be kept, one by one; the others go in one pickle, so
        # that what refers to the same object still does when it comes back.
        for name in names:
            try:
                dump_variables({name: values[name]})
            except Exception as exc:
                not_kept[name] = why_not(exc)
                del values[name]
        try:
            data, buffers = dump_variables(values)
        except Exception as exc:
            for name in list(values):
                not_kept[name] = why_not(exc)
            values = {}
            data, buffers = dump_variables(values)
    sink.record(b"P", data)
    for buffer in buffers:
        sink.record(b"B", buffer.raw())
    import json

    manifest = {"variables": sorted(values), "not_kept": not_kept}
    sink.record(b"M", json.dumps(manifest).encode())
    return sorted(values), not_kept


def rebind(value, namespace, foreign):
    """A function the snapshot made with a globals dict of its own (cloudpickle's), made again
    on the session's namespace, so that it sees what later cells define."""
    import types

    if isinstance(value, types.FunctionType) and value.__globals__ is foreign:
        fresh = types.FunctionType(value.__code__, namespace, value.__name__,
                                   value.__defaults__, value.__closure__)
        fresh.__kwdefaults__ = value.__kwdefaults__
        fresh.__qualname__ = value.__qualname__
        fresh.__dict__.update(value.__dict__)
        fresh.__annotations__ = value.__annotations__
        fresh.__doc__ = value.__doc__
        fresh.__module__ = value.__module__
        return fresh
    if isinstance(value, type) and value.__module__ == "__main__":
        for key, member in list(vars(value).items()):
            if isinstance(member, (staticmethod, classmethod)):
                inner = rebind(member.__func__, namespace, foreign)
                if inner is not member.__func__:
                    setattr(value, key, type(member)(inner))
            elif isinstance(member, property):
                parts = [rebind(f, namespace, foreign) if f is not None else None
                         for f in (member.fget, member.fset, member.fdel)]
                setattr(value, key, property(*parts, member.__doc__))
            else:
                fresh = rebind(member, namespace, foreign)
                if fresh is not member:
                    setattr(value, key, fresh)
    return value


def load_variables(data, buffers):
    """The variables of a snapshot's pickle, and those that could not be made again, each
    with why. The pickle is read whole; only if that fails is it read again forgivingly
    (`ForgivingReader`), so that one value that cannot be made again (an exception whose
    `__init__` wants other arguments, a module gone) loses only the variables that hold it."""
    import pickle

    try:
        return pickle.loads(data, buffers=buffers), {}
    except Exception:
        pass
    reader = forgiving_reader(data, buffers)
    values = reader.load()
    failed = {}
    for name, value in list(values.items()):
        why = reader.spoiled.get(id(value))
        if why is not None:
            failed[name] = why
            del values[name]
    return values, failed


def forgiving_reader(data, buffers):
    """An unpickler that goes on where making a value fails: in its place a marker, and the
    marker, whatever it went into and whatever was made with that are spoiled (`spoiled`:
    id to why), whichever way they were reached (the memo lets one variable hold another's
    objects, and a container is made before what it holds)."""
    import io
    import pickle
    import pickletools

    atoms = (int, float, complex, str, bytes, bool, type(None))

    class Unrestorable:
        __slots__ = ("why",)

        def __init__(self, why):
            self.why = why

    base = pickle._Unpickler
    # Ops that put what they take into what is below it, which stays on the stack.
    into = {"BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"}
    guarded_ops = into | {"REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST", "FROZENSET",
                          "DICT", "GLOBAL", "STACK_GLOBAL", "EXT1", "EXT2", "EXT4",
                          "READONLY_BUFFER", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST"}

    class Forgiving(base):
        dispatch = dict(base.dispatch)

        def __init__(self):
            super().__init__(io.BytesIO(data), buffers=buffers)
            self.spoiled = {}
            self.made_with = {}  # id of an object: what was made with it, or holds it
            self.kept = []  # what those ids name, alive until the end (ids are not reused)

        def spoil(self, obj, why):
            todo = [obj]
            while todo:
                o = todo.pop()
                if isinstance(o, atoms) or id(o) in self.spoiled:
                    continue
                self.spoiled[id(o)] = why
                self.kept.append(o)
                todo.extend(self.made_with.get(id(o), ()))

    def guarded(handler, op):
        """`handler`, noting what its result was made with; where it raises, the stack is
        left as the op would have left it (a marker for what it would have made, or its
        target as it is), and that is spoiled. These handlers fail, if they do, only once
        they have taken their operands (all but a target or REDUCE's callable) off the stack."""
        before, after = op.stack_before, op.stack_after
        marked = pickletools.markobject in before
        below = before.index(pickletools.markobject) if marked else len(before)
        makes_new = op.name not in into

        def run(self):
            if marked:
                target = self.metastack[-1]
                taken = target[len(target) - below:] + self.stack
            else:
                target = self.stack
                taken = target[len(target) - below:] if below else []
            depth = len(target) - below + len(after)
            try:
                handler(self)
            except BaseException as exc:
                if self.stack is not target:  # failed before the mark was taken off
                    self.pop_mark()
                marker = Unrestorable(why_not(exc))
                del target[depth:]
                target.extend([marker] * (depth - len(target)))
                if makes_new:
                    target[-1] = marker
                self.spoil(target[-1], marker.why)
            made = target[-1]
            for o in taken:
                if o is made or isinstance(o, atoms):
                    continue
                self.made_with.setdefault(id(o), []).append(made)
                self.kept.append(o)
                why = self.spoiled.get(id(o))
                if why is not None:
                    self.spoil(made, why)
        return run

    for code, handler in base.dispatch.items():
        op = pickletools.code2op.get(chr(code))
        if op is not None and op.name in guarded_ops:
            Forgiving.dispatch[code] = guarded(handler, op)
    return Forgiving()


def restore_snapshot(namespace, source):
    import importlib
    import json
    import tarfile

    if source.exactly(len(SNAPSHOT_MAGIC)) != SNAPSHOT_MAGIC:
        raise ValueError("not a snapshot")
    records = Records(source)
    if records.peek() == b"T":
        with tarfile.open(fileobj=TarSource(records), mode="r|") as tar:
            tar.extractall("/")
    importlib.invalidate_caches()
    tag, data = records.take()
    if tag != b"P":
        raise ValueError("a snapshot without its variables")
    buffers = []
    while records.peek() == b"B":
        buffers.append(records.take_buffer())
    tag, meta = records.take()
    if tag != b"M":
        raise ValueError("a snapshot without its manifest")
    meta = json.loads(meta)
    values, failed = load_variables(data, buffers)
    foreign = None
    for value in values.values():
        glob = getattr(value, "__globals__", None)
        if isinstance(glob, dict) and glob is not namespace and getattr(value, "__module__", None) == "__main__":
            foreign = glob
            break
    for name, value in values.items():
        namespace[name] = rebind(value, namespace, foreign) if foreign is not None else value
    return sorted(values), {**meta["not_kept"], **failed}


def bounded_report(kept, not_kept):
    """What the answer says of a snapshot, within what the host takes: names of at most 200
    characters, 5000 of each kind, 150,000 characters of each kind in all."""
    def short(text, most):
        return text if len(text) <= most else text[:most - 3] + "..."

    names, size = [], 0
    for name in kept:
        name = short(name, 200)
        size += len(name)
        if size > 150_000 or len(names) >= 5000:
            names.append("... and %d more" % (len(kept) - len(names)))
            break
        names.append(name)
    failed, size = {}, 0
    for name, why in not_kept.items():
        name, why = short(name, 200), short(why, 600)
        size += len(name) + len(why)
        if size > 150_000 or len(failed) >= 5000:
            failed["..."] = "and %d more" % (len(not_kept) - len(failed))
            break
        failed[name] = why
    return {"variables": names, "not_kept": failed}


def snapshot_op(op, namespace, limit):
    """`snapshot`: the state out as binary frames, an empty one, then the answer. `restore`:
    the state in, then the answer. A failure is the answer's error; the session lives on."""
    if op["op"] == "snapshot":
        sink = FrameSink()
        try:
            kept, not_kept = take_snapshot(namespace, sink)
            reply = {"result": bounded_report(kept, not_kept)}
        except BaseException as exc:
            reply = {"error": {"type": type_name(exc), "message": why_not(exc), "traceback": None}}
        sink.end()
    else:
        source = FrameSource()
        try:
            kept, not_kept = restore_snapshot(namespace, source)
            reply = {"result": bounded_report(kept, not_kept)}
        except BaseException as exc:
            reply = {"error": {"type": type_name(exc), "message": why_not(exc), "traceback": None}}
        try:
            source.drain()
        except BaseException:
            # The channel no longer makes sense: the session ends, and the host says so.
            posix._exit(1)
    answer_frame(reply, limit)


# Code mode: `import tools` gives the operator's tools this execution may call, built from the
# package the host sent (data: servers, functions, parameters, docs). A call is one JSON frame
# on descriptor 4; the host checks it again (grant, schema, budgets), calls the tool server,
# and answers with one marshal frame. A reader thread hands each answer to its caller, so calls
# from several threads or asyncio tasks run at once.
TOOLS_FD = 4
TOOLS = {"package": None, "next_id": 0, "pending": {}, "reader": False}


class ToolError(Exception):
    """A tool call that did not give an answer: the tool's own error, or airlock's refusal
    (not granted, arguments against the schema, a limit, the server unavailable, a timeout).
    `kind` says which: "tool", "denied", "schema", "limit", "unavailable", "timeout"."""

    def __init__(self, message, kind="tool"):
        Exception.__init__(self, message)
        self.kind = kind


ToolError.__module__ = "tools"


def install_tools(package):
    """Makes `import tools` give this package (again, in a session whose grants changed)."""
    for name in [m for m in sys.modules if m == "tools" or m.startswith("tools.")]:
        del sys.modules[name]
    TOOLS["package"] = package
    if not any(isinstance(f, ToolsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ToolsFinder())


class ToolsFinder:
    def find_spec(self, name, path=None, target=None):
        if name != "tools" or TOOLS["package"] is None:
            return None
        return type(sys.__spec__)(name, self, origin="airlock", is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        build_tools(module, TOOLS["package"])


UNSET = type("Unset", (), {"__repr__": lambda self: "<unset>", "__slots__": ()})()


def build_tools(root, package):
    root.__doc__ = package["doc"]
    root.ToolError = ToolError
    index = []
    servers = []
    for server in package["servers"]:
        name = server["name"]
        module = type(sys)("tools." + name, server["doc"])
        module.__package__ = "tools"
        functions = []
        for spec in server["functions"]:
            try:
                fn = make_tool_function(name, spec)
            except Exception as exc:  # one odd tool loses only itself
                sys.stderr.write("[airlock: tools.%s.%s is unavailable: %s]\n" % (name, spec["function"], exc))
                continue
            setattr(module, spec["function"], fn)
            functions.append(spec["function"])
            index.append(("%s.%s" % (name, spec["function"]), spec["summary"]))
        module.__all__ = functions
        module.__getattr__ = no_such_tool("tools." + name, functions)
        module.__dir__ = (lambda names: lambda: list(names))(functions)
        sys.modules[module.__name__] = module
        setattr(root, name, module)
        servers.append(name)

    def search(query="", limit=20):
        """Tools whose name or description holds every word of `query` (any case), as
        [{"name": "server.function", "description": one line}], best matches first."""
        words = str(query).lower().split()
        found = []
        for qualified, summary in index:
            name, text = qualified.lower(), summary.lower()
            if all(w in name or w in text for w in words):
                found.append((-sum(w in name for w in words), qualified, summary))
        found.sort()
        return [{"name": q, "description": s} for _, q, s in found[: max(0, int(limit))]]

    root.search = search
    root.__all__ = servers + ["search", "ToolError"]
    root.__getattr__ = no_such_tool("tools", servers)
    root.__path__ = []


def no_such_tool(module, names):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError("module %r has no attribute %r" % (module, name))
        import difflib

        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = "; did you mean %s?" % " or ".join(repr(c) for c in close) if close else ""
        raise AttributeError("module %r has no tool %r%s (tools.search() finds the tools this "
                             "execution may call)" % (module, name, hint))

    return __getattr__


def make_tool_function(server, spec):
    """One tool as a function with keyword parameters (the names, types and defaults of its
    input schema) and its description as docstring. The host made every name an identifier."""
    named, pairs, defaults = [], [], []
    for py, key, annotation, required, default in spec["params"]:
        text = py + (": " + annotation if annotation else "")
        if not required:
            text += " = _airlock_defaults[%d]" % len(defaults)
            defaults.append(UNSET if default is None else default[0])
        named.append(text)
        pairs.append("(%r, %s)" % (key, py))
    more = spec["more"]
    signature = ", ".join(named)
    if named:
        signature = "*, " + signature + (", **arguments" if more else "")
    elif more:
        signature = "**arguments"
    pairs = "(%s,)" % ", ".join(pairs) if pairs else "()"
    rest = "arguments" if more else "None"
    # Fixed names inside, the tool's outside: no tool name can shadow what the code uses.
    source = ("def _airlock_fn({s}):\n    return _airlock_call(_airlock_target, {p}, {r})\n"
              "async def _airlock_afn({s}):\n    return await _airlock_acall(_airlock_target, {p}, {r})\n"
              ).format(s=signature, p=pairs, r=rest)
    namespace = {"_airlock_call": call_tool, "_airlock_acall": acall_tool, "_airlock_defaults": tuple(defaults),
                 "_airlock_target": (server, spec["tool"])}
    exec(compile(source, "<tools.%s>" % server, "exec"), namespace)
    fn, afn = namespace["_airlock_fn"], namespace["_airlock_afn"]
    name = spec["function"]
    fn.__name__ = fn.__qualname__ = afn.__name__ = name
    afn.__qualname__ = name + ".aio"
    fn.__doc__ = spec["doc"]
    afn.__doc__ = "The same call, awaitable: await %s.aio(...)." % name
    fn.__module__ = afn.__module__ = "tools." + server
    fn.aio = afn
    return fn


def tool_arguments(pairs, more):
    arguments = {k: v for k, v in pairs if v is not UNSET}
    if more:
        for key, value in more.items():
            if key in arguments:
                raise TypeError("argument %r given twice" % key)
            arguments[key] = value
    return arguments


def not_json(value):
    raise TypeError("tool arguments must be JSON data (dict, list, str, int, float, bool, None), "
                    "not %s" % type_name(value))


def code_line():
    """The line of the code (not the runner's, not the tools package's) that made this call,
    for the person asked to approve it; None when the code's frame is not on the stack."""
    filename = sys.argv[0] if sys.argv else None
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == filename and frame.f_globals is not globals():
            return frame.f_lineno
        frame = frame.f_back
    return None


def call_frame(target, pairs, more, reply):
    """Sends one call; `reply` gets its answer (from the reader thread)."""
    arguments = tool_arguments(pairs, more)
    encoder = _json.make_encoder({}, not_json, _json.encode_basestring, None, ":", ",", False, False, False)
    try:
        text = "".join(encoder(arguments, 0))
        data = text.encode("utf-8")
    except (ValueError, UnicodeEncodeError) as exc:
        raise TypeError("tool arguments must be JSON data: %s" % exc) from None
    package = TOOLS["package"]
    limit = package["max_argument_bytes"]
    if len(data) > limit:
        raise ToolError("the arguments are %d bytes, over the limit of %d bytes" % (len(data), limit), "limit")
    import _thread

    with TOOLS_LOCK:
        TOOLS["next_id"] += 1
        call_id = TOOLS["next_id"]
        TOOLS["pending"][call_id] = reply
        if not TOOLS["reader"]:
            TOOLS["reader"] = True
            _thread.start_new_thread(read_answers, ())
    line = code_line()
    head = '{"id":%d,"server":%s,"tool":%s,%s"arguments":' % (
        call_id, _json.encode_basestring(target[0]), _json.encode_basestring(target[1]),
        '"line":%d,' % line if line is not None else "")
    # Frames are written whole under a lock of their own: the reader thread never waits for
    # a write (the host may be waiting for it to take answers before it reads more calls).
    with WRITE_LOCK:
        try:
            write_frame(TOOLS_FD, head.encode("utf-8") + data + b"}")
        except OSError as exc:
            with TOOLS_LOCK:
                TOOLS["pending"].pop(call_id, None)
            raise ToolError("the tool channel is closed (%s)" % exc.strerror, "unavailable") from None


import _thread

TOOLS_LOCK = _thread.allocate_lock()
WRITE_LOCK = _thread.allocate_lock()


def read_answers():
    """The reader thread: hands each answer to the call waiting for it, until the channel
    ends (or breaks: a frame cut short, one that is not marshal)."""
    try:
        while True:
            answer = read_frame(TOOLS_FD)
            if answer is None:
                break
            with TOOLS_LOCK:
                reply = TOOLS["pending"].pop(answer["id"], None)
            if reply is not None:
                reply(answer)
    except BaseException:
        pass
    with TOOLS_LOCK:
        waiting = list(TOOLS["pending"].values())
        TOOLS["pending"].clear()
        TOOLS["reader"] = False
    for reply in waiting:
        reply({"error": "the tool channel closed", "kind": "unavailable"})


def tool_result(answer):
    if "error" in answer:
        raise ToolError(answer["error"], answer["kind"])
    return answer["value"]


def call_tool(target, pairs, more):
    done = _thread.allocate_lock()
    done.acquire()
    box = []

    def reply(answer):
        box.append(answer)
        done.release()

    call_frame(target, pairs, more, reply)
    done.acquire()
    return tool_result(box[0])


async def acall_tool(target, pairs, more):
    import asyncio

    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(answer):
        if not future.done():
            future.set_result(answer)

    def reply(answer):
        try:
            loop.call_soon_threadsafe(settle, answer)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this answer

    call_frame(target, pairs, more, reply)
    return tool_result(await future)
