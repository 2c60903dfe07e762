#!/usr/bin/env bash
# Fuzzes the native evaluator (crates/pyeval) with cargo fuzz on the stable toolchain
# (libFuzzer coverage, no sanitizer: the crate has no unsafe code). Seeds come from the
# differential tests' corpus. Usage: scripts/fuzz.sh [SECONDS] (default 60).
# A crash leaves its input under fuzz/artifacts/eval/ and fails the script.
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
echo "==> cargo fuzz run eval for ${seconds}s ($n seeds)"
cd fuzz
cargo fuzz run eval --sanitizer none -- -max_total_time="$seconds" -max_len=4096 -timeout=10
