"""The decoder's documented JSON form of a value, shared by the corpus scripts."""
import base64
import math


def form(v):
    """The decoder's documented JSON form of a value."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        if -2**63 <= v < 2**64:
            return v
        if abs(v) < 10**4300:
            return {"$airlock": "int", "value": str(v)}
        text = ("-" if v < 0 else "") + hex(abs(v))
        return {"$airlock": "repr", "type": "int", "repr": text[:4096], "truncated": len(text) > 4096,
                "why": "an integer of more than 4300 digits"}
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return {"$airlock": "float", "value": "nan" if v != v else ("inf" if v > 0 else "-inf")}
    if isinstance(v, complex):
        return {"$complex": [form(v.real), form(v.imag)]}
    if isinstance(v, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            return {"$str": [ord(c) for c in v]}
        return v
    if isinstance(v, bytes):
        return {"$bytes": base64.b64encode(v).decode()}
    if isinstance(v, bytearray):
        return {"$bytearray": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, list):
        return [form(x) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [form(x) for x in v]}
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("$") and isinstance(form(k), str) for k in v):
            return {k: form(x) for k, x in v.items()}
        return {"$dict": [[form(k), form(x)] for k, x in v.items()]}
    if isinstance(v, frozenset):
        return {"$frozenset": [form(x) for x in v]}
    if isinstance(v, set):
        return {"$set": [form(x) for x in v]}
    raise TypeError(type(v))
