#!/usr/bin/env bash
# Builds crates/pickle/tests/readers/miniz_read.c against miniz, the ZIP reader under
# torch.load, into OUT: the oracle of the pickle scanner's reader tests and fuzz target,
# never part of airlock. miniz's source is the one in the miniz-sys crate (miniz 2.0, as
# PyTorch vendored before 3.0), a dev-dependency of airlock-pickle so that Cargo.lock pins
# it. Usage: scripts/miniz-reader.sh OUT
set -euo pipefail
out="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
host=$(rustc -vV | sed -n "s/^host: //p")
src=$(cd "$root" && "${CARGO:-cargo}" metadata --format-version 1 --locked --filter-platform "$host" \
    | /usr/bin/python3 -c 'import json, sys, os
meta = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in meta["packages"] if p["name"] == "miniz-sys"))')
mkdir -p "$(dirname "$out")"
# Neither stdio nor time functions are needed; warnings in miniz itself are not ours to fix.
gcc -O1 -w -DMINIZ_NO_STDIO -DMINIZ_NO_TIME -I "$src" \
    "$root/crates/pickle/tests/readers/miniz_read.c" "$src/miniz.c" -o "$out.tmp"
mv "$out.tmp" "$out"
