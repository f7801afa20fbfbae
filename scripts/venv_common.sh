# Shared by scripts/setup_vllm_cpu.sh and scripts/setup_rllib.sh (sourced, not run).
# Both build a side venv around the local CPU torch wheel; these are the steps they share.

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
