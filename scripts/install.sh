#!/usr/bin/env bash
# Puts `airlock` on PATH: builds it as start.sh does (release) and installs the binary and the
# library its zygotes load (libairlock_sandbox.so, which airlock finds beside itself) into
# PREFIX/bin, /usr/local/bin by default: the path deploy/systemd and docs/mcp.md use.
#   sudo ./scripts/install.sh                     # /usr/local/bin/airlock
#   ./scripts/install.sh --prefix ~/.local        # ~/.local/bin/airlock
#   ./scripts/install.sh --from target/debug      # what is built there, nothing built
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

prefix=/usr/local
from=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --from) from="${2:?--from needs a directory}"; shift 2 ;;
        -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$from" ]; then
    {
        ensure_debian_packages "${SANDBOX_PYTHON_PACKAGES[@]}"
        echo "==> building airlock (release)"
        cargo build --release --locked -p airlock -p airlock-sandbox
    } >&2
    from=target/release
fi
for file in airlock libairlock_sandbox.so; do
    [ -f "$from/$file" ] || { echo "install.sh: $from/$file is missing (cargo build -p airlock -p airlock-sandbox)" >&2; exit 1; }
done
mkdir -p "$prefix/bin"
# Beside each other: the zygotes load the library from the binary's own directory.
install -m 0755 "$from/airlock" "$prefix/bin/airlock"
install -m 0644 "$from/libairlock_sandbox.so" "$prefix/bin/libairlock_sandbox.so"
echo "installed $prefix/bin/airlock and $prefix/bin/libairlock_sandbox.so"
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH here" >&2 ;;
esac
