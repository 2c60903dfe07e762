#!/usr/bin/env bash
# Installs what the tests need, then runs every check: formatting, clippy, and the whole test
# suite against the real kernel, the real sandbox and Debian's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh needs root: the tests create cgroups and run airlock as an unprivileged user too" >&2
    exit 1
fi
# The sandbox's Python and its packages (function mode returns numpy and pandas values; charts
# need matplotlib). util-linux/bsdutils: setpriv and script(1) for
# the tests that run airlock as nobody and under a terminal. time: GNU time for peak memory.
# openssl: the egress tests make a certificate for their HTTPS server. postgresql, haproxy:
# the replicas test's store and balancer; systemd: systemd-analyze for the unit's test;
# runc and containers-common (its default seccomp profile): the pod test's container.
# groff-base: the CLI test renders `airlock man`. strace: the volumes test that kills the
# server at one system call of an upload.
ensure_debian_packages "${SANDBOX_PYTHON_PACKAGES[@]}" util-linux bsdutils time openssl e2fsprogs \
    postgresql haproxy systemd runc golang-github-containers-common groff-base strace
ensure_rust_components rustfmt clippy
# cargo-deny builds while the packages below download (mostly waiting on the network); its
# check waits for it.
deny_log=$(mktemp)
(ensure_cargo_deny >"$deny_log" 2>&1) &
deny_build=$!
# So does cargo-fuzz, for the fuzz run at the end, instead of there on its own (35 s). The setup
# is mostly CPU-bound here (the pickle guard's build), so this moves the build more than it hides it.
fuzz_tool_log=$(mktemp)
(ensure_cargo_fuzz >"$fuzz_tool_log" 2>&1) &
fuzz_tool_build=$!
# A clean checkout builds once: incremental compilation's bookkeeping would only cost time.
if [ "${CI:-}" = "true" ]; then
    export CARGO_INCREMENTAL=0
fi
# The official Python MCP SDK, the client of crates/cli/tests/it/mcp.rs and the tool servers of
# tools.rs; the MCP reference server, another tool source of tools.rs.
ensure_mcp_client
ensure_mcp_everything
# opentelemetry-proto, the OTLP receiver of crates/cli/tests/it/telemetry.rs.
ensure_otlp_receiver
# pytest and mypy for the Python client (clients/python).
ensure_python_client
# The TypeScript client's packages (clients/typescript): tsc, openapi-typescript, the runtimes
# its packed package is tried in (deno, bun, workerd), and the agent frameworks its adapters are
# tested with (Node 22 for them comes with its first run).
ensure_typescript_client
# schemathesis, the API fuzzer of crates/cli/tests/it/openapi.rs.
ensure_schemathesis
# kubectl kustomize and kubernetes-validate, for deploy/kubernetes (crates/cli/tests/it/deploy.rs).
ensure_kubernetes_tools

step "cargo fmt --check"
cargo fmt --all -- --check
if ! wait "$deny_build"; then
    cat "$deny_log" >&2
    exit 1
fi
rm -f "$deny_log"
step "cargo deny: licences, duplicate versions, sources (deny.toml)"
# Errors only: a crate in two versions is a warning in deny.toml (hundreds of lines, nothing
# to act on); the bans it enforces are errors, and print.
cargo deny --log-level error --locked check licenses bans sources
# Advisories need RustSec's database, fetched from github.com: checked where it can be reached.
if cargo deny fetch db >/dev/null 2>&1; then
    step "cargo deny: advisories"
    cargo deny --log-level error --locked check advisories
else
    echo "cargo deny: RustSec's advisory database cannot be fetched here (github.com); advisories not checked"
fi
step "cargo build, and the tests' build"
# Built first: servers under test find the zygote's library (libairlock_sandbox.so) beside them.
# Every build below names the whole workspace, so each resolves the same features (the bench's
# own feature of airlock-sandbox included) and none rebuilds what another built: a binary's or
# a cdylib's file has no per-feature name, and each rebuild of the five crates costs 20-30 s.
cargo build --workspace --locked
cargo test --workspace --locked --no-run
# Clippy, the docs and the fuzz targets' build take the CPU the tests leave: most end-to-end
# tests run one at a time and wait on sandboxes (the suite used 1.15 cores of 2). In the
# background, at the lowest priority (the tests keep their CPU when they want it), in target
# directories of their own (one cargo holds its target directory's lock while its tests
# run); their results are checked after the tests.
lint_log=$(mktemp)
(
    set -e
    export CARGO_TARGET_DIR="$PWD/target/lint"
    step "cargo clippy"
    nice -n 19 ionice -c 3 cargo clippy --workspace --all-targets --locked -- -D warnings
    step "cargo doc: a doc link to a renamed or private item fails the build"
    RUSTDOCFLAGS="-D warnings" nice -n 19 ionice -c 3 cargo doc --workspace --no-deps --document-private-items --locked
    unset CARGO_TARGET_DIR
    # Once cargo-fuzz is built (its build is the main shell's child: waited for by polling).
    while kill -0 "$fuzz_tool_build" 2>/dev/null; do sleep 1; done
    if cargo fuzz --version >/dev/null 2>&1; then
        step "cargo fuzz build (the fuzz run's targets, ahead)"
        (cd fuzz && nice -n 19 ionice -c 3 cargo fuzz build --dev --sanitizer none)
    fi
) >"$lint_log" 2>&1 &
lints=$!
step "cargo test"
# The server and egress tests run below instead, beside another airlock.
cargo test --workspace --locked -- --skip server:: --skip egress::
step "the server and egress tests beside a running airlock (its embedded configuration, as start.sh runs it)"
# Tests count only the sandboxes, cgroups and processes their own servers made: they pass
# while the server of the README's first command runs (its pool and zygotes live meanwhile).
beside_state=$(mktemp -d)
beside_log="$beside_state.log"
target/debug/airlock serve --listen 127.0.0.1:0 --state-dir "$beside_state" >"$beside_log" 2>&1 &
beside=$!
stop_beside() {
    kill "$beside" 2>/dev/null && wait "$beside" 2>/dev/null
    rm -rf "$beside_state" "$beside_log"
}
trap stop_beside EXIT
for _ in $(seq 300); do
    grep -q "listening on" "$beside_log" && break
    kill -0 "$beside" 2>/dev/null || { cat "$beside_log" >&2; exit 1; }
    sleep 0.1
done
grep -q "listening on" "$beside_log" || { cat "$beside_log" >&2; echo "the airlock beside never listened" >&2; exit 1; }
cargo test --workspace --locked --test it -- server:: egress::
kill -0 "$beside" 2>/dev/null || { cat "$beside_log" >&2; echo "the airlock beside the tests died" >&2; exit 1; }
stop_beside
trap - EXIT
step "the lints and docs (built beside the tests)"
if ! wait "$lints"; then
    cat "$lint_log" >&2
    echo "clippy, the docs or the fuzz targets' build failed (above)" >&2
    exit 1
fi
grep '^==>' "$lint_log" || true
rm -f "$lint_log"
# The TypeScript client's tests wait on their servers' sandboxes most of the time: they run
# beside the Python client's, each against servers of its own.
step "the TypeScript client (beside the Python client's tests): tsc --noEmit, node --test, the adapters under Node 22, the package packed into Node, Deno, Bun and workerd"
ts_log=$(mktemp)
(cd clients/typescript && npm run --silent check && npm test) >"$ts_log" 2>&1 &
ts_tests=$!
step "the Python client: pytest, mypy --strict"
(cd clients/python && "../../$PYTHON_CLIENT_VENV/bin/python" -m pytest -q -p no:cacheprovider tests \
    && "../../$PYTHON_CLIENT_VENV/bin/python" -m mypy --strict --cache-dir /dev/null src tests)
step "the TypeScript client's tests (begun beside the Python client's)"
if ! wait "$ts_tests"; then
    cat "$ts_log" >&2
    echo "the TypeScript client's checks failed (above)" >&2
    exit 1
fi
grep -E '^# (tests|pass|fail)' "$ts_log" || true
rm -f "$ts_log"
step "the jail, kernel, limits, results, outputs and function tests again, every sandbox a zygote's child"
TEST_VIA_ZYGOTE=1 cargo test --workspace --locked --test it -- jail:: kernel:: limits:: \
    results:: outputs:: function::
step "the soak, short: hostile executions, sessions and streams, a kill -9 (scripts/soak.sh)"
scripts/soak.sh --short
# The evaluator and the pickle scanner must never panic, hang or overflow their stack on any
# input, and the scan must see what miniz, zipfile and tarfile extract (scripts/fuzz.sh). A
# short run of unoptimised targets (overflow checks on): their build takes half the time.
if ! wait "$fuzz_tool_build"; then
    cat "$fuzz_tool_log" >&2
    exit 1
fi
rm -f "$fuzz_tool_log"
scripts/fuzz.sh --dev "${AIRLOCK_TEST_FUZZ_SECONDS:-60}"
step "all checks passed"
