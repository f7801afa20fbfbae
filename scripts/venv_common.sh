# Shared by scripts/setup_vllm_cpu.sh, scripts/setup_rllib.sh and scripts/setup_verifiers.sh
# (sourced, not run; ROOT set first). The first two build a side venv around the local CPU torch
# wheel; all three install the project's own runtime deps with install_core_deps.

TORCH_VERSION="2.13.0"

# start_venv VENV PYTHON NAME: create VENV if needed, pin torch (CPU) and transformers through a
# constraints file exported as PIP_CONSTRAINT (so no later resolver step can swap in a CUDA
# build of several GB), then install torch first from the local wheel (pip.conf's find-links).
start_venv() {
    local venv="$1" python="$2" name="$3"
    [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
    local constraints="$venv/constraints-$name.txt"
    printf 'torch==%s\ntransformers<5.20\n' "$TORCH_VERSION" > "$constraints"
    export PIP_CONSTRAINT="$constraints"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q "torch==$TORCH_VERSION"
}

# check_cpu_torch VENV: fail unless VENV's torch is the pinned CPU build.
check_cpu_torch() {
    local torch_v
    torch_v=$("$1/bin/python" -c "import torch; print(torch.__version__)")
    if [[ "$torch_v" != "$TORCH_VERSION"* || "$torch_v" == *cu* ]]; then
        echo "error: expected torch $TORCH_VERSION (CPU) in $1, found $torch_v" >&2
        exit 1
    fi
}

# install_core_deps VENV: the project's runtime deps, read from pyproject.toml ([project].dependencies)
# so that no side venv drifts from it (.venv-vllm once lacked bm25s, and QA envs could not run
# there), and the test runner. Installed when one is missing or outside its version bounds (checked
# with pip's own requirement parser): cheap to call on every run.
install_core_deps() {
    local venv="$1" deps
    mapfile -t deps < <("$venv/bin/python" -c \
        'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
        "$ROOT/pyproject.toml")
    deps+=(pytest pytest-timeout)
    if ! "$venv/bin/python" -c '
import sys
from importlib.metadata import version
from pip._vendor.packaging.requirements import Requirement
for line in sys.argv[1:]:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate():
        assert req.specifier.contains(version(req.name), prereleases=True), line
' "${deps[@]}" >/dev/null 2>&1; then
        "$venv/bin/python" -m pip install -q "${deps[@]}"
    fi
}
