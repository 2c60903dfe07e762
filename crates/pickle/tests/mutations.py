"""Archives with mutated headers, for the readers differential (tests/differential.rs):
torch-like ZIP and tar archives whose member holds a safe pickle followed by one that calls
a global, with sizes, methods, times, flags, CRCs, ZIP64 fields, offsets and end records
changed at random. Whatever a reader then extracts must have been scanned as it extracts it.
Usage: mutations.py SEED COUNT; one JSON object per line: {"name", "zip"} (base64).
Run with /usr/bin/python3.
"""
import base64
import io
import json
import os
import pickle
import random
import struct
import sys
import tarfile
import zlib

seed, count = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)


class Evil:
    def __reduce__(self):
        return (os.system, ("id",))


GOOD = pickle.dumps({"weights": [1.0, 2.0]}, protocol=2)
HIDDEN = pickle.dumps(Evil(), protocol=2)
NAME = b"archive/data.pkl"


def zip_archive(method, data, stored_len, extra_member=True):
    """A member whose data holds `data` of which the headers declare `stored_len` bytes
    (stored) or the deflate stream of it (method 8), then an 'archive/version' member."""
    out = bytearray()
    cd = bytearray()
    members = [(NAME, method, data, stored_len)]
    if extra_member:
        members.append((b"archive/version", 0, b"3\n", 2))
    for name, m, payload, declared in members:
        if m == 8:
            co = zlib.compressobj(9, zlib.DEFLATED, -15)
            raw = co.compress(payload[:declared]) + co.flush() + payload[declared:]
            csize = len(raw) - (len(payload) - declared)
            size = declared
        else:
            raw, csize, size = payload, declared, declared
        crc = zlib.crc32(payload[:declared])
        off = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, m, 0, 0, crc, csize, size, len(name), 0) + name + raw
        cd += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, m, 0, 0, crc, csize, size, len(name), 0, 0, 0, 0, 0, off) + name
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd), len(out), 0)
    return bytearray(out + cd + eocd)


def tar_archive(data, declared):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("storages")
        info.size = declared
        t.addfile(info, io.BytesIO(data[:declared]))
    b = bytearray(buf.getvalue())
    # The hidden pickle in the padding after the member and in the end blocks.
    at = b.find(GOOD) + len(GOOD)
    rest = data[declared:]
    b[at:at + len(rest)] = rest
    return b


def find_all(b, sig):
    out, i = [], b.find(sig)
    while i >= 0:
        out.append(i)
        i = b.find(sig, i + 1)
    return out


SIZES = lambda: rng.choice([len(GOOD), len(GOOD) + len(HIDDEN), len(HIDDEN), 0, 1, 2, 0xFFFFFFFF, rng.randrange(0, 200)])


def get(b, at, fmt):
    if at is not None and 0 <= at and at + struct.calcsize(fmt) <= len(b):
        return struct.unpack_from(fmt, b, at)[0]
    return 0


def put(b, at, fmt, value):
    if at is not None and 0 <= at and at + struct.calcsize(fmt) <= len(b):
        b[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)


def mutate_zip(b, ops):
    # Which member's headers: the first (the pickle) most often.
    pick = 0 if rng.random() < 0.7 else -1
    for _ in range(ops):
        locals_ = find_all(b, b"PK\x03\x04")
        centrals = find_all(b, b"PK\x01\x02")
        eocds = find_all(b, b"PK\x05\x06")
        lh = locals_[pick] if locals_ else None
        ch = centrals[pick] if centrals else None
        eo = eocds[-1] if eocds else None
        op = rng.choice(list(range(15)) + [14, 14])  # 14: the views readers disagree on
        if op == 0:
            put(b, lh and lh + 18, "<I", SIZES())          # local compressed size
        elif op == 1:
            put(b, lh and lh + 22, "<I", SIZES())          # local size
        elif op == 2:
            put(b, ch and ch + 20, "<I", SIZES())          # directory compressed size
        elif op == 3:
            put(b, ch and ch + 24, "<I", SIZES())          # directory size
        elif op == 4:                                       # times and dates (miniz skips a check)
            put(b, lh and lh + 10, "<I", rng.choice([0, 0x58216000, rng.getrandbits(32)]))
            put(b, ch and ch + 12, "<I", rng.choice([0, 0x58216000, rng.getrandbits(32)]))
        elif op == 5:                                       # methods
            m = rng.choice([0, 8, 0, 8, rng.getrandbits(16)])
            put(b, lh and lh + 8, "<H", m)
            if rng.random() < 0.7:
                put(b, ch and ch + 10, "<H", m)
        elif op == 6:                                       # flags
            f = rng.choice([0, 8, 0x800, 0x808, 1, rng.getrandbits(16)])
            put(b, lh and lh + 6, "<H", f)
            put(b, ch and ch + 8, "<H", f)
        elif op == 7:                                       # CRC of one view or another
            crc = zlib.crc32(rng.choice([GOOD, GOOD + HIDDEN, HIDDEN, b""]))
            put(b, lh and lh + 14, "<I", crc)
            put(b, ch and ch + 16, "<I", crc)
        elif op == 8 and ch is not None:                   # a ZIP64 field in the directory
            nlen, xlen = get(b, ch + 28, "<H"), get(b, ch + 30, "<H")
            z = struct.pack("<QQ", SIZES(), SIZES())
            field = struct.pack("<HH", 1, len(z)) + z
            end = ch + 46 + nlen + xlen
            b[end:end] = field
            put(b, ch + 30, "<H", xlen + len(field))
            put(b, ch + 20, "<I", rng.choice([0xFFFFFFFF, SIZES()]))
            put(b, ch + 24, "<I", rng.choice([0xFFFFFFFF, SIZES()]))
            for e in find_all(b, b"PK\x05\x06"):
                size = get(b, e + 12, "<I")
                put(b, e + 12, "<I", size + len(field))
        elif op == 9:                                       # the member's header offset
            if ch is not None:
                off = get(b, ch + 42, "<I")
                put(b, ch + 42, "<I", max(0, off + rng.choice([-1, 1, len(GOOD), -30, 30])))
        elif op == 10 and eo is not None:                  # the directory's place and size
            put(b, eo + 16, "<I", max(0, get(b, eo + 16, "<I") + rng.choice([-46, 46, -1, 1, 100])))
        elif op == 11 and eo is not None:
            put(b, eo + 12, "<I", max(0, get(b, eo + 12, "<I") + rng.choice([-46, 46, -1, 1])))
        elif op == 12:                                      # bytes before the archive
            b[0:0] = bytes(rng.choice([1, 4, 30, 100]))
        elif op == 13 and len(b) > 30:                      # cut the file
            del b[rng.randrange(len(b) - 22, len(b)):]
        elif op == 14:                                      # one size and its CRC agree on
            view = rng.choice([GOOD + HIDDEN, GOOD, HIDDEN])  # another view of the bytes
            crc = zlib.crc32(view)
            for h, size_at, crc_at in ((ch, 24, 16), (lh, 22, 14)):
                if h is not None and rng.random() < 0.7:
                    put(b, h + size_at, "<I", len(view))
                    put(b, h + crc_at, "<I", crc)
    return b


def mutate_tar(b, ops):
    headers = [i for i in range(0, len(b) - 512, 512) if b[i + 257:i + 262] == b"ustar"]
    for _ in range(ops):
        if not headers:
            break
        h = rng.choice(headers)
        op = rng.randrange(3)
        if op == 0:
            b[h + 124:h + 136] = b"%011o\0" % rng.choice([len(GOOD), len(GOOD) + len(HIDDEN), 0, 512])
        elif op == 1:
            b[h + 156:h + 157] = rng.choice([b"0", b"\0", b"x", b"g", b"5", b"7"])
        elif op == 2:
            i = b.find(b"size=")
            if i >= 0:
                b[i + 5:i + 7] = rng.choice([b"29", b"74", b"10", b"99"])
        # tarfile checks the checksum: most mutations keep it right.
        if rng.random() < 0.9:
            b[h + 148:h + 156] = b" " * 8
            b[h + 148:h + 156] = b"%06o\0 " % sum(b[h:h + 512])
    return b


for i in range(count):
    kind = rng.randrange(4)
    data = GOOD + HIDDEN
    if kind == 0:
        b, name = zip_archive(0, data, len(GOOD)), "stored"
    elif kind == 1:
        b, name = zip_archive(8, data, len(GOOD)), "deflated"
    elif kind == 2:
        b, name = zip_archive(0, data, len(data), extra_member=False), "stored_whole"
    else:
        b, name = tar_archive(data, len(GOOD)), "tar"
    ops = rng.choice([1, 1, 2, 3, 5])
    if kind != 3 and rng.random() < 0.5:
        # A file time, as any real archive has: miniz checks a stored member's two sizes
        # only where the four bytes of its method and time are all zero.
        for h in find_all(b, b"PK\x03\x04") + find_all(b, b"PK\x01\x02"):
            put(b, h + (10 if b[h + 2] == 3 else 12), "<I", 0x58216000)
    b = mutate_tar(b, ops) if kind == 3 else mutate_zip(b, ops)
    sys.stdout.write(json.dumps({"name": "%s-%d" % (name, i), "zip": base64.b64encode(bytes(b)).decode()}) + "\n")
