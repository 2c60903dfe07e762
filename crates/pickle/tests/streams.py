"""Hand-made pickle streams, random but seeded, and what CPython's unpickler does with each:
odd text arguments (INT, LONG, FLOAT, STRING, UNICODE, PUT, GET), surrogates, equal and
unhashable keys, items set on lists and bytearrays, marks, memo, allowed constructors, and
mutations of pickles CPython wrote. One JSON object per line:
{"pickle": base64, "outcome": "ok"|"error"|"forbidden"|"skip", "expected"?, "error"?,
"ambiguous"?}: the first load's outcome; "ambiguous" when another reader may read on
differently (bytes after STOP, frames crossed), so that only a verdict of safe is checked.
"forbidden": the stream names a global outside the default allow-list (the guard below
refuses it before anything is imported). Run with /usr/bin/python3 streams.py SEED COUNT.
"""
import base64
import io
import json
import pickle
import pickletools
import random
import resource
import struct
import sys
import warnings

from forms import form

# A stream CPython cannot load for want of memory is no verdict on the stream.
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
warnings.simplefilter("ignore")
sys.setrecursionlimit(10000)

ALLOWED = {("builtins", n) for n in ("set", "frozenset", "bytearray", "bytes", "complex")}
ALLOWED |= {("__builtin__", n) for n in ("set", "frozenset", "bytearray", "bytes", "complex")}
ALLOWED |= {("_codecs", "encode"), ("collections", "OrderedDict")}


class Forbidden(Exception):
    pass


class Guard(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise Forbidden(f"{module}.{name}")
        return super().find_class(module, name)


class PyGuard(pickle._Unpickler):
    """pickle.py's unpickler, which reads frames strictly."""

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise Forbidden(f"{module}.{name}")
        return super().find_class(module, name)


INTS = ["0", "1", "00", "01", "+0", "+1", "-0", "-1", " 1", "1 ", "\t5", "010", "0x10", "0X1f",
        "0o17", "0O17", "0b101", "1_000", "1__0", "_1", "1_", "0x", "08", "09", "-", "+", " ",
        "5\x00x", "0\x00", "99999999999999999999", "-9223372036854775808", "9223372036854775807",
        "9223372036854775808", "-9223372036854775809", "0" * 30 + "5", "0x" + "f" * 20,
        "1e5", "0_0", "00_0", "0x_1f", "0x__1", "0b", "0b2", "12a", "٣", "0L", "5L", "1" * 4301,
        "1" * 4300, "0x" + "1" * 5000, "0" * 5000 + "7", "1_" * 2200 + "1", "  -0x7f  "]
FLOATS = ["1.5", "-0.0", "1e500", "-1e500", "1e-500", "inf", "-inf", "Infinity", "INF", "nan",
          "-nan", "NaN", " 1.5", "1.5 ", "1.", ".", ".5", "+.5", "1e", "1e+", "1_0", "0x10",
          "1.5\x00junk", "infx", "+inf", "1E5", "infinit", "1e308", "1.8e308", "2.5e-324",
          "0e9999999999", "5", "-", "", "1.5\x00"]
STRINGS = ["'abc'", '"abc"', "'a\\'b'", "'\\x4'", "'\\x41'", "'\\x4g'", "'\\101'", "'\\777'",
           "'abc", "'", "'\\'", "'\\q'", "'\\\\'", "'\\n\\t\\a'", "'a\"", "''", "\"\"",
           "'\xe9'", "'\\xe9'", "'\\0'", "'x\\\nx'"]
UNICODES = ["abc", "\\u0041", "\\\\u0041", "\\\\\\u0041", "\\ud800", "\\udc80x", "\\U0001F600",
            "\\U00110000", "\\u12", "\\u12zz", "\\", "\\x41", "\xe9", "a\\", "\\U0000d83d",
            "\\ud83d\\ude00", "\\u", "\\U0001f60"]
UTF8 = [b"abc", "é日本😀".encode(), b"\xed\xa0\x80", b"a\xed\xb2\x80b", b"\xff", b"\xc0\x80",
        b"\xe6\x97", b"\xed\x9f\xbf", b"\xf4\x90\x80\x80", b""]
INDICES = ["0", " 0", "+0", "-1", "0_1", "1_0", "00", "x", "", "1 ", "0x1", "1"]


def enc(t):
    """Text as the bytes of a line: Latin-1 where it can be, so that bytes >= 0x80 appear raw."""
    return t.encode("latin1") if all(ord(c) < 256 for c in t) else t.encode("utf-8")


class Gen:
    def __init__(self, r):
        self.r = r
        self.memo = 0

    def pick(self, xs):
        return self.r.choice(xs)

    def text(self, chars, n=6):
        return "".join(self.r.choice(chars) for _ in range(self.r.randint(0, n)))

    def scalar(self):
        r = self.r
        k = r.randrange(24)
        if k == 0:
            t = self.pick(INTS) if r.random() < 0.7 else self.text("0123456789_+-xXoObB \t\x00aL")
            return b"I" + enc(t) + b"\n"
        if k == 1:
            t = self.pick(INTS) if r.random() < 0.7 else self.text("0123456789_+- xL")
            return b"L" + enc(t) + (b"L" if r.random() < 0.5 else b"") + b"\n"
        if k == 2:
            t = self.pick(FLOATS) if r.random() < 0.7 else self.text("0123456789.eE+-_ infa")
            return b"F" + enc(t) + b"\n"
        if k == 3:
            return b"S" + enc(self.pick(STRINGS)) + b"\n"
        if k == 4:
            return b"V" + enc(self.pick(UNICODES)) + b"\n"
        if k == 5:
            b = self.pick(UTF8)
            op = r.choice([b"X", b"\x8c", b"\x8d"])
            size = {b"X": "<I", b"\x8c": "<B", b"\x8d": "<Q"}[op]
            return op + struct.pack(size, len(b)) + b
        if k == 6:
            b = bytes(r.randrange(256) for _ in range(r.randrange(5)))
            return r.choice([b"C" + bytes([len(b)]), b"B" + struct.pack("<I", len(b)),
                             b"\x8e" + struct.pack("<Q", len(b)),
                             b"\x96" + struct.pack("<Q", len(b))]) + b
        if k == 7:
            return b"G" + struct.pack(">d", r.choice([1.5, -0.0, float("nan"), float("inf"), 1.0, 2.0]))
        if k == 8:
            return b"K" + bytes([r.choice([0, 1, 2, 255])])
        if k == 9:
            return b"J" + struct.pack("<i", r.choice([0, 1, -1, 2**31 - 1, -2**31]))
        if k == 10:
            n = r.choice([0, 1, 2**63, -2**63 - 1, 2**64, -1])
            b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True) if n else b""
            return b"\x8a" + bytes([len(b)]) + b
        if k == 11 and self.memo:
            i = r.randrange(self.memo + 1)
            return r.choice([b"g%d\n" % i, b"h" + bytes([i % 256]), b"j" + struct.pack("<I", i),
                             b"g" + self.pick(INDICES).encode() + b"\n"])
        return r.choice([b"N", b"\x88", b"\x89", b"K\x01", b"K\x02", b"G" + struct.pack(">d", 1.0),
                         b"V1\n", b"Va\n", b")", b"\x8c\x01b"])

    def value(self, depth=0):
        r = self.r
        if depth > 3 or r.random() < 0.45:
            out = self.scalar()
        else:
            out = self.container(depth)
        if r.random() < 0.15:
            put = r.choice([b"p%d\n" % self.memo, b"q" + bytes([self.memo % 256]), b"\x94",
                            b"p" + self.pick(INDICES).encode() + b"\n"])
            out += put
            self.memo += 1
        return out

    def items(self, depth, n=None):
        n = self.r.randrange(4) if n is None else n
        return b"".join(self.value(depth + 1) for _ in range(n))

    def container(self, depth):
        r = self.r
        k = r.randrange(16)
        if k == 0:
            return b"(" + self.items(depth) + b"l"
        if k == 1:
            return b"]" + r.choice([b"(" + self.items(depth) + b"e", self.value(depth + 1) + b"a", b"(e"])
        if k == 2:
            return b"(" + self.items(depth) + b"t"
        if k == 3:
            n = r.randint(1, 3)
            return self.items(depth, n) + bytes([0x84 + n])
        if k == 4:
            return b"(" + self.items(depth, 2 * r.randrange(3) + (r.random() < 0.1)) + b"d"
        if k == 5:
            return b"}" + r.choice([b"(" + self.items(depth, 2 * r.randrange(3)) + b"u",
                                    self.items(depth, 2) + b"s", b"(u"])
        if k == 6:
            # Keys Python deems equal.
            keys = [b"K\x01", b"\x88", b"G" + struct.pack(">d", 1.0), b"I01\n", b"F1.0\n",
                    b"I1\n", b"L1\n", b"\x8c\x01a", b"Va\n", b"S'a'\n", b"K\x00", b"\x89",
                    b"G" + struct.pack(">d", -0.0), b"K\x01K\x02\x86", b"K\x01\x88\x86",
                    b"G" + struct.pack(">d", float("nan"))]
            body = b"".join(r.choice(keys) + self.value(depth + 1) for _ in range(r.randint(1, 4)))
            return r.choice([b"}(" + body + b"u", b"(" + body + b"d"])
        if k == 7:
            return b"\x8f" + r.choice([b"(" + self.items(depth) + b"\x90", b"(\x90"])
        if k == 8:
            return b"(" + self.items(depth) + b"\x91"
        if k == 9:
            # Items set on a list or a bytearray, by index.
            target = r.choice([b"(K\x01K\x02l", b"\x96\x02\x00\x00\x00\x00\x00\x00\x00ab",
                               b"]", b")", b"\x8f", b"Vx\n"])
            idx = r.choice([b"K\x00", b"K\x01", b"J\xff\xff\xff\xff", b"K\x05", b"\x88", b"Vx\n"])
            val = r.choice([b"K\x07", b"M\x00\x01", b"Vy\n", b"\x89"])
            return target + r.choice([idx + val + b"s", b"(" + idx + val + b"u"])
        if k == 10:
            # Items appended to a bytearray, or to something that takes none.
            target = r.choice([b"\x96\x00\x00\x00\x00\x00\x00\x00\x00", b"}", b")", b"\x8f",
                               b"Vx\n", b"C\x00"])
            items = r.choice([b"K\x07", b"M\x00\x01", b"Vy\n", b"\x88", b"J\xff\xff\xff\xff"])
            return target + r.choice([items + b"a", b"(" + items + items + b"e", b"(e"])
        if k == 11:
            g = r.choice([b"c__builtin__\nset\n", b"cbuiltins\nset\n", b"c__builtin__\nfrozenset\n",
                          b"cbuiltins\nfrozenset\n"])
            return g + b"(" + b"(" + self.items(depth) + b"l" + b"tR"
        if k == 12:
            g = r.choice([b"c__builtin__\nbytearray\n", b"cbuiltins\nbytearray\n",
                          b"c_codecs\nencode\n"])
            return g + b"(" + self.value(depth + 1) + r.choice([b"Vlatin1\n", b"Vlatin-1\n", b"Vutf-8\n"]) + b"tR"
        if k == 13:
            g = r.choice([b"c__builtin__\ncomplex\n", b"cbuiltins\ncomplex\n"])
            return g + b"(" + b"".join(self.pick([b"G" + struct.pack(">d", 1.5), b"F2.5\n", b"K\x01"])
                                       for _ in range(r.randint(0, 2))) + b"tR"
        if k == 14:
            return b"ccollections\nOrderedDict\n)R" + r.choice([b"(Vb\nK\x01Va\nK\x02u", b""])
        # Marks and stack shuffles.
        return r.choice([b"(" + self.value(depth + 1) + b"0", self.value(depth + 1) + b"2\x86",
                         b"(" + self.value(depth + 1) + b"1" + self.value(depth + 1),
                         self.value(depth + 1) + self.value(depth + 1) + b"0"])

    def stream(self):
        r = self.r
        self.memo = 0
        head = b"" if r.random() < 0.4 else b"\x80" + bytes([r.randrange(6)])
        return head + self.value() + b"."

    def mutated(self):
        r = self.r
        value = r.choice([[1, "a", b"b", 1.5, None], {"k": (1, 2), 3: [True]}, {1, 2, 3},
                          frozenset({"x"}), bytearray(b"ab"), 2**70, "é\udc80", (1, (2, (3,)))])
        data = bytearray(pickle.dumps(value, protocol=r.randrange(6)))
        for _ in range(r.randint(1, 3)):
            i = r.randrange(len(data))
            k = r.randrange(4)
            if k == 0:
                data[i] = r.randrange(256)
            elif k == 1:
                data.insert(i, r.randrange(256))
            elif k == 2 and len(data) > 2:
                del data[i]
            else:
                data[i:i] = data[i:i + r.randint(1, 4)]
        return bytes(data)


def huge_memo_index(blob):
    # CPython grows its memo table to twice the index: a large one asks for gigabytes.
    try:
        for op, arg, _ in pickletools.genops(blob):
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int) and arg > 100000:
                return True
    except Exception:
        pass
    return False


CALLS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD",
         "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}


def plain(blob):
    """Whether the stream parses and names nothing: pickle.loads may then load it as is."""
    try:
        return not {op.name for op, _, _ in pickletools.genops(blob)} & CALLS
    except Exception:
        return False


def stop_end(blob):
    try:
        for op, _, pos in pickletools.genops(blob):
            if op.name == "STOP":
                return pos + 1
    except Exception:
        pass
    return None


def frame_past_end(blob):
    try:
        for op, arg, pos in pickletools.genops(blob):
            if op.name == "FRAME" and pos + 9 + arg > len(blob):
                return True
    except Exception:
        pass
    return False


def readers_may_disagree(blob):
    """Whether another reader could read the stream otherwise than pickle.loads: bytes after
    STOP (load() called again reads them), frames that opcodes cross or that go past STOP
    (pickle.py refuses them, the C unpickler reading a file goes on elsewhere), or frames
    longer than the data (the C unpickler refuses them, pickle.py reading bytes takes what
    there is, and reading a file asks the file for all of it)."""
    end = stop_end(blob)
    if end is not None and end < len(blob):
        return True
    if b"\x95" not in blob:
        return False
    if frame_past_end(blob):
        return True
    f = io.BytesIO(blob)
    try:
        PyGuard(f).load()
    except Exception as e:
        return "frame" in str(e)
    return f.tell() != end


def outcome(blob):
    if huge_memo_index(blob):
        return {"outcome": "skip"}
    case = plain_outcome(blob)
    if readers_may_disagree(blob):
        case["ambiguous"] = True
    return case


def plain_outcome(blob):
    """What CPython's C unpickler does; where it fails, what pickle.py's (which dill uses,
    and which reads some FLOAT forms the C one refuses) does."""
    case = load_with(blob, pickle.loads if plain(blob) else lambda b: Guard(io.BytesIO(b)).load())
    if case["outcome"] == "error":
        other = load_with(blob, lambda b: PyGuard(io.BytesIO(b)).load())
        if other["outcome"] in ("ok", "forbidden"):
            return other
    return case


def load_with(blob, load):
    # pickle.loads reads bytes; the guard needs an Unpickler on a file, which reads frames
    # otherwise where opcodes cross them (those streams are marked ambiguous).
    try:
        value = load(blob)
    except Forbidden as e:
        return {"outcome": "forbidden", "error": str(e)}
    except MemoryError:
        return {"outcome": "skip"}
    except Exception as e:
        return {"outcome": "error", "error": f"{type(e).__name__}: {e}"}
    try:
        return {"outcome": "ok", "expected": form(value)}
    except (RecursionError, TypeError):
        # A list that contains itself, or nesting deeper than JSON should carry.
        return {"outcome": "skip"}


NAN = b"G" + struct.pack(">d", float("nan"))
CX = b"cbuiltins\ncomplex\n"
# Streams every run starts with: objects CPython tells apart by identity (one NaN reused
# through the memo or DUP is one key; two NaNs, or two complexes made from one, are two),
# and INT lines the two readers value differently ("+1": True for the C unpickler, 1 for
# pickle.py), read by one or both.
FIXED = [
    bytes.fromhex("80027d710028477ff800000000000071014b0168014b02752e"),
    b"\x80\x04}(" + NAN + b"\x94K\x01h\x00K\x02u.",
    b"\x80\x04}(" + NAN + b"22K\x01u.",
    b"\x80\x04}(" + NAN + b"K\x01" + NAN + b"K\x02u.",
    b"\x80\x04\x8f(" + NAN + b"\x94h\x00" + NAN + b"\x90.",
    b"\x80\x04}(" + NAN + b"\x94\x85K\x01h\x00\x85K\x02u.",
    b"\x80\x02}(" + CX + b"q\x00(" + NAN + b"q\x01tRK\x01h\x00(h\x01tRK\x02u.",
    b"\x80\x02}(" + CX + b"(" + NAN + b"tRq\x00K\x01h\x00K\x02u.",
    b"\x80\x02}(" + CX + b"(" + NAN + b"G" + struct.pack(">d", 0.0) + b"tRK\x01" + NAN + b"K\x02u.",
    bytes.fromhex("46315f300a30492b300a2e"),
    b"(I+1\nF1_0\nt.",
    b"(I+1\nI-0\nI 1\nI01\nt.",
    b"(I+0\nF1_0\nI-1\nt.",
    b"(I+1\nF1.0\nt.",
]


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    r = random.Random(seed)
    g = Gen(r)
    for i in range(len(FIXED) + count):
        blob = FIXED[i] if i < len(FIXED) else g.mutated() if r.random() < 0.2 else g.stream()
        case = {"pickle": base64.b64encode(blob).decode()}
        case.update(outcome(blob))
        sys.stdout.write(json.dumps(case) + "\n")


main()
