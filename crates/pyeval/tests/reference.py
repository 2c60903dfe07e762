"""CPython's answers for the differential tests: one JSON-encoded expression
per input line, one JSON object per output line, in the evaluator's format.

Run as /usr/bin/python3 with PYTHONHASHSEED=0 (str and bytes hashes, and so
the order of sets of strings, are then fixed).
"""
import ast
import json
import sys
import warnings

warnings.simplefilter("ignore")

def intern_constants(expr):
    # The compiler rebuilds a constant frozenset when interning replaces one
    # of its strings, which depends on what the process interned before.
    # Interning every identifier-like string first fixes that state (the one
    # the evaluator models).
    try:
        tree = ast.parse(expr, mode="eval")
    except Exception:  # the real compile below reports it
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            KEEP.append(sys.intern(node.value))


KEEP = []

for line in sys.stdin:
    expr = json.loads(line)
    intern_constants(expr)
    try:
        value = eval(compile(expr, "<expr>", "eval"), {"__builtins__": {}}, {})
        out = {"ok": True, "type": type(value).__name__, "repr": repr(value), "str": str(value)}
    except Exception as e:  # every error is an answer to compare
        out = {"ok": False, "error": {"type": type(e).__name__, "message": str(e)}}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
