#!/usr/bin/env bash
# Install bubblewrap (bwrap), which agent_gym.sandbox runs agent code in, and libseccomp2, which
# compiles its syscall filter (docs/sandbox.md).
#
#   bash scripts/setup_sandbox.sh      # or: make sandbox (make setup runs it)
#
# Idempotent. As root it installs Debian's `bubblewrap` and `libseccomp2` with apt-get (with sudo
# where there is sudo) when missing; then it checks that a trivial program runs in the sandbox, which also needs user
# namespaces. Without root or sudo, or when that check fails, it says so and exits 0: the
# sandbox tests then skip, naming the fix.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# bwrap runs the sandbox; libseccomp2 is the library the pyseccomp binding (the `code` extra, which
# `make setup` installs into the venv) compiles the sandbox's syscall filter with.
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
if (( ${#missing[@]} )); then
    if [[ "$(id -u)" == 0 ]]; then
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    else
        echo "error: ${missing[*]} missing and no root: the sandbox (python tool, Math/HumanEval/MBPP envs) cannot" \
             "run; install with: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

PY="${PYTHON_BIN:-$ROOT/.venv/bin/python}"
if [[ -x "$PY" ]]; then
    # A sandboxed call, not only the binaries: the python tool's first real run. A machine where it
    # cannot run (no user namespaces, no seccomp) fails the set-up here, with the reason above.
    (cd "$ROOT" && "$PY" -c "from agent_gym.sandbox import check_available, run_python; check_available(); \
r = run_python('print(6 * 7)'); assert r.reason == 'exit' and r.stdout.strip() == '42', r; print('sandbox: ok')") \
        || { echo "error: the sandbox does not run here (see above): its tests would fail; fix it or set" \
                  "SANDBOX_OPTIONAL=1 to go on without it" >&2; [[ "${SANDBOX_OPTIONAL:-0}" == 1 ]] || exit 1; }
fi
