"""What Python's zipfile and tarfile extract from archives (tarfile as torch's legacy loader
opens them): an oracle for the scanner's tests. Run with /usr/bin/python3.

Reads archives on stdin, each an 8-byte little-endian length and then its bytes, and writes
for each one line per member, then a line ".":
  "zipfile <local header offset> ok <hex>" / "zipfile <offset> err <error>"
  "tarfile <header offset> ok <hex>" / "tarfile <offset> err <error>"
Archives that a reader does not open give nothing for it.
"""
import io
import struct
import sys
import tarfile
import warnings
import zipfile

warnings.simplefilter("ignore")
MOST = 64 << 20
out = sys.stdout


def zip_view(data):
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except Exception:
        return
    for info in z.infolist():
        # is_dir() fails on an empty name; a name ending in "/" is what it checks.
        if info.filename.endswith("/"):
            continue
        try:
            if info.file_size > MOST:
                raise ValueError("too large for the test")
            got = z.read(info)
            out.write("zipfile %d ok %s\n" % (info.header_offset, got.hex()))
        except Exception as e:
            out.write("zipfile %d err %s\n" % (info.header_offset, type(e).__name__))


def tar_view(data):
    # torch.load's legacy format: tarfile.open(fileobj=f, mode="r:", format=PAX_FORMAT).
    try:
        t = tarfile.open(fileobj=io.BytesIO(data), mode="r:", format=tarfile.PAX_FORMAT)
        members = t.getmembers()
    except Exception:
        return
    for m in members:
        if not m.isfile():
            continue
        at = m.offset_data - 512
        try:
            if m.size > MOST:
                raise ValueError("too large for the test")
            got = t.extractfile(m).read()
            out.write("tarfile %d ok %s\n" % (at, got.hex()))
        except Exception as e:
            out.write("tarfile %d err %s\n" % (at, type(e).__name__))


stdin = sys.stdin.buffer
while True:
    head = stdin.read(8)
    if len(head) < 8:
        break
    (n,) = struct.unpack("<Q", head)
    data = stdin.read(n)
    zip_view(data)
    tar_view(data)
    out.write(".\n")
    out.flush()
