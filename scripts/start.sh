#!/usr/bin/env bash
# Installs what airlock needs, builds it, checks the host, and starts the server with its
# embedded defaults (127.0.0.1:8080; an API key is made and printed on first start).
#   ./scripts/start.sh                        # the server
#   ./scripts/start.sh run --json my.py       # any other airlock command
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

# Installing and building say what they do on stderr: `start.sh run --json my.py` prints
# nothing on stdout but airlock's answer.
{
    ensure_debian_packages "${SANDBOX_PYTHON_PACKAGES[@]}"
    echo "==> building airlock (release)"
    # airlock-sandbox too: its cdylib is what zygotes load (libairlock_sandbox.so, beside the binary).
    cargo build --release --locked -p airlock -p airlock-sandbox
} >&2
bin=target/release/airlock
if [ $# -gt 0 ]; then
    exec "$bin" "$@"
fi
"$bin" doctor || echo "==> airlock doctor found problems: executions will be refused until they are fixed" >&2
echo >&2
exec "$bin" serve
