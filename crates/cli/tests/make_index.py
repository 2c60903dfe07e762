"""Builds a package index for the environment tests in DIR (served by `python3 -m http.server`
as a PEP 503 simple index: DIR/simple/<project>/<file>), from nothing but the standard library:

- tinyenv-pkg 1.0 and sessionpkg 2.0: wheels of one pure-Python module each;
- evilpkg 1.0: a source distribution whose setup.py, run by pip during the build, tries to read
  host files, to connect around the proxy and through it to a host that is not the index, then
  records what happened in the module it installs (evilpkg.report), after sleeping SLEEP seconds.

- plantpkg 1.0: a source distribution whose setup.py plants, in the environment it is built
  into, a link named like airlock's manifest pointing at VICTIM (a host file root would then
  write), and a sparse file.
- hogpkg 1.0: a source distribution whose setup.py writes 8 files of 60 MiB into the
  environment it is built into (/env), stopping at the first error.

Usage: make_index.py DIR STATE_DIR OTHER_PORT SLEEP VICTIM
"""

import base64
import hashlib
import io
import os
import sys
import tarfile
import zipfile


def wheel(root, name, version, module, source):
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{module}/__init__.py": source,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: make_index\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    project = os.path.join(root, "simple", name)
    os.makedirs(project, exist_ok=True)
    with zipfile.ZipFile(os.path.join(project, f"{dist}-py3-none-any.whl"), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


SETUP = r'''
import errno, json, os, socket, time, urllib.request
report = {"uid": os.getuid()}
for path in ["/etc/shadow", "/root", "/proc/1/environ", STATE_DIR]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(16)
        report[path] = "read"
    except OSError as e:
        report[path] = errno.errorcode.get(e.errno, str(e.errno))
try:
    socket.create_connection(("127.0.0.1", OTHER_PORT), timeout=2)
    report["direct"] = "connected"
except OSError as e:
    report["direct"] = errno.errorcode.get(e.errno, str(e.errno))
try:
    urllib.request.urlopen("http://localhost:%d/" % OTHER_PORT, timeout=5)
    report["proxy"] = "fetched"
except Exception as e:
    report["proxy"] = str(e)
time.sleep(SLEEP)
os.makedirs("evilpkg", exist_ok=True)
with open("evilpkg/report.py", "w") as f:
    f.write("REPORT = %r\n" % (report,))
from setuptools import setup
setup(name="evilpkg", version="1.0", packages=["evilpkg"])
'''


PLANT = r'''
import os
if not os.path.lexists("/env/airlock-environment.json"):  # setup.py runs more than once
    os.symlink(VICTIM, "/env/airlock-environment.json")
with open("/env/sparse", "wb") as f:
    f.truncate(1 << 30)
from setuptools import setup
setup(name="plantpkg", version="1.0", packages=["plantpkg"])
'''


HOG = r'''
chunk = b"h" * (1 << 20)
for i in range(8):
    with open("/env/hog%d" % i, "wb") as f:
        for _ in range(60):
            f.write(chunk)
from setuptools import setup
setup(name="hogpkg", version="1.0", packages=["hogpkg"])
'''


def sdist(root, name, setup):
    files = {
        f"{name}-1.0/setup.py": setup,
        f"{name}-1.0/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{name}-1.0/{name}/__init__.py": "",
    }
    project = os.path.join(root, "simple", name)
    os.makedirs(project, exist_ok=True)
    with tarfile.open(os.path.join(project, f"{name}-1.0.tar.gz"), "w:gz") as t:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def main():
    root, state_dir, other_port, sleep, victim = sys.argv[1:6]
    wheel(root, "tinyenv-pkg", "1.0", "tinyenv_pkg", "VALUE = 42\n")
    wheel(root, "sessionpkg", "2.0", "sessionpkg", "VALUE = 'installed in a session'\n")
    sdist(root, "evilpkg", SETUP.replace("STATE_DIR", repr(state_dir))
          .replace("OTHER_PORT", str(int(other_port))).replace("SLEEP", str(float(sleep))))
    sdist(root, "plantpkg", PLANT.replace("VICTIM", repr(victim)))
    sdist(root, "hogpkg", HOG)


if __name__ == "__main__":
    main()
