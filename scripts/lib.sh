# Shared by the project's scripts: install what is missing from the machine's registries.

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
SANDBOX_PYTHON_PACKAGES=(python3 python3-numpy python3-pandas python3-matplotlib)

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
