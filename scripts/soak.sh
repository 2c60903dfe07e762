#!/usr/bin/env bash
# The soak: executions over HTTP at concurrency 8, a tenth of them hostile (fork bomb, memory
# hog, output flood, sleep past the timeout, forbidden syscalls, disk fill, channel abuse)
# under a tenant key of their own, mixed with sessions and streamed executions, while the
# server is killed with SIGKILL at random moments and restarted. It fails unless every
# started execution has exactly one final record, every benign answer is right, nothing is
# left on the host, the server's memory and descriptors stay bounded and the benign p99 with
# hostile executions is within 3x of the p99 without (scripts/soak.py says how).
#   ./scripts/soak.sh              # 10,000 tasks, 3 kills, release build; figures in SOAK.md
#   ./scripts/soak.sh --short      # what scripts/test.sh runs: 600 tasks, 1 kill, debug build
#                                  # (too few for a p99: the ratio is reported, not checked)
# Other arguments go to scripts/soak.py (--executions, --kills, --seed, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/soak.sh needs root: airlock creates cgroups for its sandboxes" >&2
    exit 1
fi
ensure_debian_packages "${SANDBOX_PYTHON_PACKAGES[@]}"
ensure_python_client
if [ "${1:-}" = "--short" ]; then
    shift
    # airlock-sandbox too: its cdylib is what zygotes load (libairlock_sandbox.so, beside the
    # binary). The workspace's features, as scripts/test.sh builds them, so that its build is
    # reused (the Python pickle guard, which changes no one else's features, is left out).
    cargo build --locked --workspace --exclude airlock-pyguard
    set -- --airlock target/debug/airlock --executions 600 --kills 1 --out target/soak-short.md "$@"
else
    echo "==> building (release)"
    cargo build --release --locked -p airlock -p airlock-sandbox
    set -- --airlock target/release/airlock --out SOAK.md "$@"
fi
exec "$PYTHON_CLIENT_VENV/bin/python" scripts/soak.py "$@"
