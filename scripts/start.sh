#!/usr/bin/env bash
# Installs what airlock needs, builds it, checks the host, and runs ARGS (default: the demo).
#   ./scripts/start.sh                       # doctor, then examples/hello.py in a sandbox
#   ./scripts/start.sh run --json my.py      # any airlock command
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_debian_packages python3
echo "==> building airlock (release)"
cargo build --release --locked -p airlock
bin=target/release/airlock
if [ $# -gt 0 ]; then
    exec "$bin" "$@"
fi
"$bin" doctor
echo
echo "==> $bin run --json examples/hello.py"
exec "$bin" run --json examples/hello.py
