#!/usr/bin/env bash
# Fuzzes the native evaluator (crates/pyeval) and the pickle scanner (crates/pickle) with
# cargo fuzz on the stable toolchain (libFuzzer coverage, no sanitizer: neither crate has
# unsafe code). The evaluator's seeds come from its differential corpus, the scanner's from
# pickles CPython writes. Usage: scripts/fuzz.sh [SECONDS] (default 60, split between the two).
# A crash leaves its input under fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
seconds="${1:-60}"

command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi
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
half=$(( (seconds + 1) / 2 ))
cd fuzz
echo "==> cargo fuzz run eval for ${half}s ($n seeds)"
cargo fuzz run eval --sanitizer none -- -max_total_time="$half" -max_len=4096 -timeout=10
echo "==> cargo fuzz run pickle for ${half}s"
cargo fuzz run pickle --sanitizer none -- -max_total_time="$half" -max_len=65536 -timeout=10
