#!/usr/bin/env bash
# Install bubblewrap (bwrap), which agent_gym.sandbox runs agent code in (docs/sandbox.md).
#
#   bash scripts/setup_sandbox.sh      # or: make sandbox (make setup runs it)
#
# Idempotent. As root it installs Debian's `bubblewrap` with apt-get (with sudo where there is
# sudo); then it checks that a trivial program runs in the sandbox, which also needs user
# namespaces. Without root or sudo, or when that check fails, it says so and exits 0: the
# sandbox tests then skip, naming the fix.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v bwrap >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]]; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap
    else
        echo "bubblewrap missing and no root: the sandbox (python tool, Math/HumanEval/MBPP envs) cannot run;" \
             "install it with: apt-get install -y bubblewrap"
        exit 0
    fi
fi

PY="${PYTHON_BIN:-$ROOT/.venv/bin/python}"
if [[ -x "$PY" ]]; then
    # A failure here is reported, not fatal: the rest of the project works without the sandbox.
    (cd "$ROOT" && "$PY" -c "from agent_gym.sandbox import check_available; check_available(); print('sandbox: ok')") \
        || echo "WARNING: the sandbox does not run here (see above); its tests will skip."
fi
