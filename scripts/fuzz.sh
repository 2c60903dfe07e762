#!/usr/bin/env bash
# Fuzzes the native evaluator (crates/pyeval), the pickle scanner (crates/pickle) and the
# host's reading of a sandbox's channel (crates/engine: its frames, responses, outputs and
# tool calls) with cargo fuzz on the
# stable toolchain (libFuzzer coverage, no sanitizer: the code fuzzed is safe Rust). Targets: eval (seeds from the evaluator's differential corpus), pickle
# (pickles CPython writes) and zip_readers (the archives the scanner's tests make, headers
# mutated: each input is also read by miniz, built from its C source by
# scripts/miniz-reader.sh, and by zipfile and tarfile, and whatever they would load from an
# archive scanned `safe` must have been scanned as they read it).
# A fourth, channel, reads what a sandbox sends the host as the host does: a program's response
# (result or error, outputs, files), its captured output, its tool channel's frames, and frames
# read whole and in pieces (as a session reads them), which must agree.
# Usage: scripts/fuzz.sh [--dev] [SECONDS] (default 90, split between the four).
# A crash leaves its input under fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# --dev: targets built without optimisation (and with overflow checks), in half the time of
# the release build; for a short run, where the build costs more than the fuzzing.
profile=()
if [ "${1:-}" = "--dev" ]; then
    profile=(--dev)
    shift
fi
seconds="${1:-90}"

command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
ensure_cargo_fuzz
mkdir -p fuzz/corpus/eval
n=0
while IFS= read -r line; do
    case "$line" in ''|'##'*) continue ;; esac
    n=$((n + 1))
    printf '%s' "$line" > "fuzz/corpus/eval/seed-$n"
done < crates/pyeval/tests/corpus.txt
mkdir -p fuzz/corpus/pickle
/usr/bin/python3 - fuzz/corpus/pickle <<'PY'
import os, pickle, sys, collections
out = sys.argv[1]
values = [None, True, 2**70, -1.5, "é", b"\x00", bytearray(b"x"), [1, [2]], (1, 2), {"a": {1, 2}},
          frozenset({3}), 1 + 2j, collections.OrderedDict(a=1)]
for i, v in enumerate(values):
    for p in range(6):
        open(os.path.join(out, f"seed-{i}-{p}"), "wb").write(pickle.dumps(v, protocol=p))
PY
mkdir -p fuzz/corpus/zip_readers
/usr/bin/python3 - fuzz/corpus/zip_readers crates/pickle/tests <<'PY'
import base64, json, os, subprocess, sys
out, tests = sys.argv[1], sys.argv[2]
for args in (["archives.py"], ["mutations.py", "11", "300"]):
    lines = subprocess.run(["/usr/bin/python3", os.path.join(tests, args[0])] + args[1:],
                           check=True, capture_output=True).stdout.decode().splitlines()
    for line in lines:
        case = json.loads(line)
        data = base64.b64decode(case["zip"])
        if len(data) <= 65536:
            open(os.path.join(out, "seed-" + case["name"]), "wb").write(data)
PY
export AIRLOCK_TEST_MINIZ_READER="$PWD/target/fuzz-readers/miniz_read"
bash scripts/miniz-reader.sh "$AIRLOCK_TEST_MINIZ_READER"
# The channel: what a sandbox sends the host. The first byte picks the reader modulo 4 (0 a
# response, 1 captured output, 2 tool-call frames, 3 frames whole and in pieces of its upper six
# bits plus one), as in fuzz_targets/channel.rs.
mkdir -p fuzz/corpus/channel
/usr/bin/python3 - fuzz/corpus/channel <<'PY'
import json, os, struct, sys
out = sys.argv[1]
responses = [
    {"result": 42},
    {"result": {"$airlock": "bytes", "base64": "aGk="}, "outputs": [{"type": "text/plain", "data": "x"}]},
    {"error": {"type": "ValueError", "message": "m", "traceback": "tb"}},
    {"result": None, "files": [{"path": "a/b.txt", "size": 2, "base64": "aGk="}, {"path": "c", "size": 9, "skipped": "over the size limit"}]},
    {"result": [1, 2], "outputs": [{"type": "application/json", "data": {"k": [1]}}, {"type": "image/png", "data": "iVBORw0KGgo="}]},
]
seeds = [b"\x00" + json.dumps(r).encode() for r in responses]
seeds += [b"\x01" + "héllo €".encode(), b"\x81" + "cut €".encode()[:-1], b"\x01\xff\xfe"]
calls = [{"id": 1, "server": "crm", "tool": "find", "arguments": {"customer_id": 7}},
         {"id": 2, "server": "crm", "tool": "list", "arguments": {}}]
frames = b"".join(struct.pack("<I", len(b)) + b for b in (json.dumps(c).encode() for c in calls))
seeds += [b"\x02" + frames, b"\x02" + struct.pack("<I", 1 << 31)]
seeds += [b"\x03" + frames, b"\x0b" + frames[:-1], b"\x07" + frames + b"\x01\x00"]
for i, seed in enumerate(seeds):
    open(os.path.join(out, f"seed-{i}"), "wb").write(seed)
PY
third=$(( (seconds + 3) / 4 ))
# The fuzz build comes last and needs about 0.6 GB more: say what the disk has left, so that a
# build that fails for want of it says so.
step "disk: $(df -h --output=avail . | tail -n 1 | tr -d ' ') available"
cd fuzz
step "cargo fuzz run eval for ${third}s ($n seeds)"
cargo fuzz run eval "${profile[@]}" --sanitizer none -- -max_total_time="$third" -max_len=4096 -timeout=10
step "cargo fuzz run pickle for ${third}s"
cargo fuzz run pickle "${profile[@]}" --sanitizer none -- -max_total_time="$third" -max_len=65536 -timeout=10
step "cargo fuzz run zip_readers for ${third}s"
cargo fuzz run zip_readers "${profile[@]}" --sanitizer none -- -max_total_time="$third" -max_len=65536 -timeout=10
step "cargo fuzz run channel for ${third}s"
cargo fuzz run channel "${profile[@]}" --sanitizer none -- -max_total_time="$third" -max_len=65536 -timeout=10
