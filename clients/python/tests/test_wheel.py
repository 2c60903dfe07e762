"""The package as a wheel: maturin builds one abi3 wheel (`cp311-abi3-linux_x86_64`) holding the
pickle guard, and a fresh venv that has only that wheel (and httpx, from PyPI), no source tree,
gets a working `airlock_client.pickle`. Takes about 15 s once the guard is compiled
(`scripts/lib.sh`'s `ensure_python_client` compiles it)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[3]

CHECK = """
import pathlib, pickle, sys
import airlock_client
from airlock_client import pickle as safe_pickle

assert pathlib.Path(airlock_client.__file__).is_relative_to(sys.prefix), airlock_client.__file__
assert safe_pickle.loads(pickle.dumps({"a": [1, {2}]})) == {"a": [1, {2}]}
try:
    safe_pickle.loads(pickle.dumps(print))
except safe_pickle.UnsafePickle as e:
    print(e)
else:
    raise AssertionError("loaded")
"""


def test_the_wheel_is_abi3_and_works_without_the_source_tree(tmp_path: pathlib.Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--wheel-dir", str(wheels), str(ROOT / "clients" / "python")],
        check=True,
    )
    [wheel] = wheels.iterdir()
    assert wheel.name == "airlock_client-0.1.0-cp311-abi3-linux_x86_64.whl"
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("_pickle.abi3.so", "_pickle.pyi", "pickle.py", "py.typed", "__init__.py"):
        assert f"airlock_client/{name}" in names, names
    assert not [n for n in names if "__pycache__" in n], names

    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True,
    )
    # -I: neither the current directory nor PYTHON* variables; run from elsewhere.
    out = subprocess.run(
        [python, "-I", "-c", CHECK], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    assert out.stdout.startswith("unsafe: global builtins.print is not allowed"), out
