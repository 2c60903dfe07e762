#!/usr/bin/env bash
# Builds the Python client's wheel into target/dist (or the directory given): airlock_client
# with its native pickle guard (crates/pyguard), one abi3 wheel for CPython 3.11 and later on
# this kind of machine (cp311-abi3-linux_x86_64). pip fetches maturin, which runs cargo.
# (Not target/wheels: maturin's editable builds, scripts/lib.sh ensure_python_client, write there.)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

out="${1:-target/dist}"
command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
ensure_debian_packages python3-pip
mkdir -p "$out"
rm -f "$out"/airlock_client-*.whl
/usr/bin/python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$out" clients/python
wheel=$(ls "$out"/airlock_client-*.whl)
case "$wheel" in
    *-cp311-abi3-linux_*.whl) echo "$wheel" ;;
    *) echo "$wheel: not a cp311-abi3 wheel" >&2; exit 1 ;;
esac
