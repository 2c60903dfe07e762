# Shared by the project's scripts: install what is missing from the machine's registries.

# step NAME: announces a step with the seconds since the outermost script started, so that a
# log says where the time went (a script another one runs, fuzz.sh under test.sh, counts on
# from its caller's clock instead of from zero). Not AIRLOCK_*: airlock reads those as settings.
if [ -n "${SCRIPTS_STEP_CLOCK:-}" ]; then
    SECONDS=$(($(date +%s) - SCRIPTS_STEP_CLOCK))
else
    export SCRIPTS_STEP_CLOCK=$(($(date +%s) - SECONDS))
fi
step() {
    printf '==> [%5ss] %s\n' "$SECONDS" "$*"
}

# ensure_debian_packages PKG...: apt-get install the packages that dpkg does not have yet.
ensure_debian_packages() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "==> installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Python packages code in the sandbox can import (headless: no display libraries are
# needed by the Agg backend), from Debian so they match /usr/bin/python3.
# pip, venv, setuptools and wheel build environments (airlock env create) and `pip install` in
# sandboxes; the CA bundle lets code with egress verify TLS servers itself; requests, httpx,
# aiohttp and curl are the HTTP clients code with egress (and credentials) is tested with.
SANDBOX_PYTHON_PACKAGES=(python3 python3-numpy python3-pandas python3-matplotlib python3-pip python3-venv python3-setuptools python3-wheel python3-cloudpickle python3-requests python3-httpx python3-aiohttp curl ca-certificates)

# ensure_rust_components COMPONENT...: rustup component add what the toolchain lacks.
ensure_rust_components() {
    command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
    for c in "$@"; do
        case "$c" in
            rustfmt) cargo fmt --version >/dev/null 2>&1 && continue ;;
            clippy) cargo clippy --version >/dev/null 2>&1 && continue ;;
        esac
        echo "==> installing rust component $c"
        rustup component add "$c"
    done
}

# The Python client (clients/python) and its test tools, in a venv under target/ that sees
# Debian's numpy (the client decodes arrays into numpy when it is there).
PYTHON_CLIENT_VENV=target/python-client

# What the client's native module (airlock_client._pickle, maturin) is built from.
PYTHON_CLIENT_NATIVE_SOURCES=(crates/pickle/src crates/pyguard Cargo.toml Cargo.lock clients/python/pyproject.toml)
# The agent frameworks the adapters' tests run, at the versions they were tested with.
PYTHON_CLIENT_FRAMEWORKS=clients/python/tests/requirements-adapters.txt

# ensure_python_client: the venv in $PYTHON_CLIENT_VENV with pytest, mypy, the agent
# frameworks of $PYTHON_CLIENT_FRAMEWORKS and the client installed from the tree (editable: the
# tests run what is checked out). The editable install
# builds the pickle guard (crates/pyguard, Rust, with maturin: cargo on PATH, maturin from
# PyPI) into clients/python/src/airlock_client; it is built again whenever what it is built
# from changed since the last build.
ensure_python_client() {
    local py="$PYTHON_CLIENT_VENV/bin/python"
    local stamp="$PYTHON_CLIENT_VENV/native-built"
    local tools="$PYTHON_CLIENT_VENV/tools-installed"
    if [ ! -x "$py" ] || ! "$py" -c "import pytest, mypy" 2>/dev/null \
        || [ ! -f "$tools" ] || [ "$PYTHON_CLIENT_FRAMEWORKS" -nt "$tools" ]; then
        echo "==> installing the Python client's test tools and agent frameworks into $PYTHON_CLIENT_VENV"
        ensure_debian_packages python3-venv python3-numpy
        [ -x "$py" ] || /usr/bin/python3 -m venv --clear --system-site-packages "$PYTHON_CLIENT_VENV"
        "$py" -m pip install --quiet --disable-pip-version-check pytest mypy -r "$PYTHON_CLIENT_FRAMEWORKS"
        touch "$tools"
    fi
    if [ -f "$stamp" ] && compgen -G "clients/python/src/airlock_client/_pickle.*.so" >/dev/null \
        && [ -z "$(find "${PYTHON_CLIENT_NATIVE_SOURCES[@]}" -newer "$stamp" -print -quit)" ]; then
        return 0
    fi
    echo "==> building the Python client and its pickle guard (maturin) into $PYTHON_CLIENT_VENV"
    # Stamped as of before the build: a source changed during it is built next time.
    touch "$stamp.next"
    "$py" -m pip install --quiet --disable-pip-version-check -e clients/python
    mv "$stamp.next" "$stamp"
}

# The TypeScript client (clients/typescript): its npm packages in its own node_modules, from
# the npm registry through a cache outside the clone that a machine keeps between runs (a fresh
# machine downloads them once); `npm ci` installs exactly package-lock.json's versions.
# Not exported, and no AIRLOCK_ name: a server under test would read it as a setting.
CLIENTS_CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/airlock

# ensure_typescript_client: node and npm (Debian's, when missing), and clients/typescript's
# node_modules as its package-lock.json says.
ensure_typescript_client() {
    local dir=clients/typescript
    command -v node >/dev/null && command -v npm >/dev/null || ensure_debian_packages nodejs npm
    if [ -f "$dir/node_modules/.package-lock.json" ] \
        && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]; then
        return 0
    fi
    echo "==> installing the TypeScript client's packages (npm ci, cache $CLIENTS_CACHE_DIR/npm)"
    (cd "$dir" && npm ci --silent --no-audit --no-fund --prefer-offline --cache "$CLIENTS_CACHE_DIR/npm")
}

# schemathesis, which fuzzes the real server from its own /openapi.json (crates/cli/tests/
# openapi.rs), in its own venv under target/.
SCHEMATHESIS_VENV=target/schemathesis
SCHEMATHESIS_VERSION=4.32.5

# ensure_schemathesis: a venv in $SCHEMATHESIS_VENV with schemathesis==$SCHEMATHESIS_VERSION.
ensure_schemathesis() {
    ensure_pinned_venv "$SCHEMATHESIS_VENV" schemathesis "$SCHEMATHESIS_VERSION"
}

# kubernetes-validate (PyPI): the Kubernetes API's schemas, offline, for the manifests'
# test (crates/cli/tests/it/deploy.rs); and kubectl for `kubectl kustomize` (Debian's
# kubernetes-client where the machine has no kubectl).
KUBERNETES_VALIDATE_VENV=target/kubernetes-validate
KUBERNETES_VALIDATE_VERSION=1.37.0

ensure_kubernetes_tools() {
    ensure_pinned_venv "$KUBERNETES_VALIDATE_VENV" kubernetes-validate "$KUBERNETES_VALIDATE_VERSION"
    command -v kubectl >/dev/null || ensure_debian_packages kubernetes-client
}

# ensure_pinned_venv DIR PACKAGE VERSION: a venv of Debian's Python in DIR holding
# PACKAGE==VERSION, made afresh when it holds another version.
ensure_pinned_venv() {
    local dir="$1" package="$2" version="$3"
    local py="$dir/bin/python"
    if [ -x "$py" ] && "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('$package') != '$version')" 2>/dev/null; then
        return 0
    fi
    echo "==> installing $package $version into $dir"
    ensure_debian_packages python3-venv
    /usr/bin/python3 -m venv --clear "$dir"
    "$py" -m pip install --quiet --disable-pip-version-check "$package==$version"
}

# The MCP client the tests drive `airlock mcp` with: the official Python SDK, in its own venv
# under target/ (Debian's Python; its system packages stay untouched).
MCP_CLIENT_VENV=target/mcp-client
MCP_CLIENT_VERSION=2.3.0

# ensure_mcp_client: a venv in $MCP_CLIENT_VENV with mcp==$MCP_CLIENT_VERSION.
ensure_mcp_client() {
    ensure_pinned_venv "$MCP_CLIENT_VENV" mcp "$MCP_CLIENT_VERSION"
}

# The OTLP receiver of crates/cli/tests/it/telemetry.rs and airlock-bench --telemetry
# (crates/cli/tests/otlp_receiver.py): OpenTelemetry's own protobuf classes, from PyPI, in a
# venv under target/ (no collector is packaged by the registries the project uses).
OTLP_RECEIVER_VENV=target/otlp-receiver
OTLP_PROTO_VERSION=1.45.2

# ensure_otlp_receiver: a venv in $OTLP_RECEIVER_VENV with opentelemetry-proto==$OTLP_PROTO_VERSION.
ensure_otlp_receiver() {
    ensure_pinned_venv "$OTLP_RECEIVER_VENV" opentelemetry-proto "$OTLP_PROTO_VERSION"
}

# The MCP reference server (@modelcontextprotocol/server-everything) from the npm registry, a
# tool source for crates/cli/tests/it/tools.rs besides the Python SDK's.
MCP_EVERYTHING_DIR=target/mcp-everything
MCP_EVERYTHING_VERSION=2026.8.31

# ensure_mcp_everything: node and npm (Debian's, when missing), and the server in
# $MCP_EVERYTHING_DIR.
ensure_mcp_everything() {
    local main="$MCP_EVERYTHING_DIR/node_modules/@modelcontextprotocol/server-everything/package.json"
    if [ -f "$main" ] && grep -q "\"version\": \"$MCP_EVERYTHING_VERSION\"" "$main"; then
        return 0
    fi
    command -v node >/dev/null && command -v npm >/dev/null || ensure_debian_packages nodejs npm
    echo "==> installing @modelcontextprotocol/server-everything $MCP_EVERYTHING_VERSION into $MCP_EVERYTHING_DIR"
    mkdir -p "$MCP_EVERYTHING_DIR"
    npm install --silent --no-audit --no-fund --prefix "$MCP_EVERYTHING_DIR" \
        "@modelcontextprotocol/server-everything@$MCP_EVERYTHING_VERSION"
}

# ensure_cargo_fuzz: cargo-fuzz (scripts/fuzz.sh), built from crates.io.
ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        step "installing cargo-fuzz"
        cargo install --locked cargo-fuzz
    fi
}

# ensure_cargo_deny: cargo-deny (the dependency policy in deny.toml), built from crates.io.
# A debug build: 1.5 min instead of 4.5, and a check still takes seconds.
CARGO_DENY_VERSION=0.20.2
ensure_cargo_deny() {
    if ! cargo deny --version 2>/dev/null | grep -q "$CARGO_DENY_VERSION"; then
        step "installing cargo-deny $CARGO_DENY_VERSION"
        cargo install --locked --debug --version "$CARGO_DENY_VERSION" cargo-deny
    fi
}
