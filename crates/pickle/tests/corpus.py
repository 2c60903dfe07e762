"""Pickles made by CPython for the tests: benign data across protocols 0-5 with the JSON the
decoder must give, and malicious pickles of every known scanner-bypass family. One JSON object
per line: {"name", "kind": "benign"|"malicious", "pickle": base64, "expected"?}.
Run with /usr/bin/python3.
"""
import base64
import collections
import json
import math
import pickle
import pickletools
import sys

from forms import form


shared = [1, 2]
BENIGN = {
    "none": None, "true": True, "false": False, "zero": 0, "small": 255, "u16": 65535,
    "i32": 2**31 - 1, "neg": -2**31 - 1, "i64": 2**63 - 1, "u64": 2**64, "big": -(10**40),
    "float": 1.5, "negzero": -0.0, "inf": math.inf, "nan": math.nan, "tiny": 5e-324,
    "str": "abc", "unicode": "é日本😀", "empty": "", "long_str": "x" * 300,
    "bytes": b"\x00\xff\n", "empty_bytes": b"", "long_bytes": bytes(range(256)) * 2,
    "bytearray": bytearray(b"ab"), "empty_bytearray": bytearray(),
    "list": [1, [2, [3, []]]], "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)],
    "dict": {"a": 1, "b": [True, None]}, "int_keys": {1: "x", 2: "y"},
    "dollar_key": {"$bytes": 1}, "tuple_key": {(1, 2): 3},
    "set": {3, 1, 2}, "empty_set": set(), "frozenset": frozenset({"a", "b"}),
    "complex": 1 + 2j, "shared": [shared, shared, (shared,)],
    "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    "surrogates": "a\udc80b\ud83d", "surrogate_key": {"\ud800": 1},
    "key_order": {"zeta": 1, "alpha": 2, "mid": {"y": 1, "x": 2}},
    "mixed_keys": {2: "a", "b": 1, (1,): None, 1.5: 0, frozenset({1}): 2},
    "huge_int": -(2**20000) + 1,
    "many": list(range(2000)), "wide_dict": {str(i): i for i in range(1500)},
    "big_set": set(range(1500)), "nested": {"rows": [{"id": i, "tags": ["a", "b"], "score": i / 7} for i in range(50)]},
}

out = []
for name, value in BENIGN.items():
    for proto in range(0, 6):
        try:
            data = pickle.dumps(value, protocol=proto)
        except ValueError:
            # Protocols 0 and 1 write ints in decimal, which CPython refuses past 4300 digits.
            continue
        for variant, blob in (("", data), ("-optimized", pickletools.optimize(data))):
            # What CPython loads back is what the decoder must give.
            out.append({"name": f"{name}-p{proto}{variant}", "kind": "benign",
                        "pickle": base64.b64encode(blob).decode(),
                        "expected": form(pickle.loads(blob))})


class Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


import builtins, importlib, operator, os, pkgutil, runpy, subprocess

MALICIOUS = {
    "os.system": Reduce(os.system, ("id",)),
    "eval": Reduce(builtins.eval, ("1",)),
    "exec": Reduce(builtins.exec, ("pass",)),
    "popen": Reduce(subprocess.Popen, (["id"],)),
    "check_output": Reduce(subprocess.check_output, (["id"],)),
    "import_module": Reduce(importlib.import_module, ("os",)),
    "runpy": Reduce(runpy.run_path, ("/x",)),
    "resolve_name": Reduce(pkgutil.resolve_name, ("os:system",)),
    "attrgetter": Reduce(operator.attrgetter("system"), ()),
    "getattr": Reduce(builtins.getattr, (os, "system")),
    "nested_pickle": Reduce(pickle.loads, (pickle.dumps(Reduce(os.system, ("id",))),)),
    "inside_data": [1, {"k": Reduce(os.system, ("id",))}],
}
for name, value in MALICIOUS.items():
    for proto in range(0, 6):
        try:
            data = pickle.dumps(value, protocol=proto)
        except Exception:
            continue
        out.append({"name": f"{name}-p{proto}", "kind": "malicious",
                    "pickle": base64.b64encode(data).decode()})

# Hand-made streams for the tricks scanners have missed.
RAW = {
    # pip.main and friends are plain globals; only an allow-list catches them all.
    "pip_main": b"cpip\nmain\n(]Vinstall\naVevil\natR.",
    # Submodule and dotted qualnames: never matched by prefix.
    "dotted_qualname": b"\x80\x04\x8c\x08builtins\x8c\x11set.__class__.mro\x93.",
    "builtins_prefix": b"cbuiltins\nsetattr\n(Vx\nVy\nI1\ntR.",
    "submodule": b"cos.path\njoin\n(Va\nVb\ntR.",
    # The global and the call apart, through the memo.
    "memo_trick": b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94h\x02\x8c\x02id\x85R.",
    # STACK_GLOBAL whose operands are not strings.
    "non_string_stack_global": b"\x80\x04K\x01K\x02\x93.",
    "tuple_stack_global": b"\x80\x04\x8c\x02os\x85\x8c\x06system\x93.",
    # INST, OBJ, NEWOBJ, NEWOBJ_EX instantiate classes.
    "inst": b"(S'id'\nios\nsystem\n.",
    "obj": b"(cos\nsystem\nS'id'\no.",
    "newobj": b"\x80\x02cos\nsystem\n)\x81.",
    "newobj_ex": b"\x80\x04\x8c\x02os\x8c\x06system\x93)}\x92.",
    # BUILD sets attributes or calls __setstate__.
    "build": b"\x80\x02cbuiltins\nset\n)R}V__class__\nK\x01sb.",
    # Extension codes and persistent ids ask the loader's registries.
    "ext1": b"\x80\x02\x82\x01.",
    "ext4": b"\x80\x02\x84\x01\x00\x00\x00.",
    "persid": b"Pos.system\n.",
    "binpersid": b"\x80\x02Vx\nQ.",
    # Allow-listed names called with arguments plain data never has.
    "bytes_bomb": b"\x80\x02c__builtin__\nbytes\nJ\x00\x00\x00\x10\x85R.",
    "ordereddict_args": b"\x80\x02ccollections\nOrderedDict\n]\x85R.",
    "codecs_other_encoding": b"\x80\x02c_codecs\nencode\nVx\nVrot13\n\x86R.",
    # A call on a value that is not a global.
    "reduce_on_list": b"\x80\x02])R.",
    # Out-of-band buffers.
    "next_buffer": b"\x80\x05\x97.",
}
for name, blob in RAW.items():
    # Every hand-made stream is well-formed: the verdict must be about what it does.
    list(pickletools.genops(blob))
    out.append({"name": name, "kind": "malicious", "pickle": base64.b64encode(blob).decode()})

for o in out:
    sys.stdout.write(json.dumps(o) + "\n")
