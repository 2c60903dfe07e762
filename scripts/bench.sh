#!/usr/bin/env bash
# Installs what the benchmark needs (Debian's python3 with the sandbox's packages: its chart
# rows import pandas and matplotlib; bubblewrap), builds release binaries
# and runs airlock-bench: bare python, bwrap, `airlock run` and the HTTP API side by side.
#   ./scripts/bench.sh                                  # the full run behind BENCHMARKS.md
#   ./scripts/bench.sh --rounds 20 --requests 50        # a quick one
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/bench.sh needs root: airlock creates cgroups for its sandboxes" >&2
    exit 1
fi
ensure_debian_packages "${SANDBOX_PYTHON_PACKAGES[@]}" bubblewrap
echo "==> building (release)"
# airlock-sandbox too: its cdylib is what zygotes load (libairlock_sandbox.so, beside the binary).
cargo build --release --locked -p airlock -p airlock-sandbox -p airlock-bench
exec target/release/airlock-bench --airlock target/release/airlock "$@"
