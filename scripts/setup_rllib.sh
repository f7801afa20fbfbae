#!/usr/bin/env bash
# Create .venv-rllib: Ray RLlib (new API stack) against the local CPU torch wheel.
#
#   bash scripts/setup_rllib.sh          # or: make rllib
#
# Its own venv because ray[rllib] pins gymnasium to one exact version, which clashes with the
# project's main venv (see docs/integrations.md, "RLlib").
# Idempotent: a stamp file records the pinned set; when it matches, nothing is done.
#   - torch is pinned to 2.13.0 (CPU) through a constraints file, so no resolver step can swap
#     in a CUDA build of several GB;
#   - the project is installed editable and without deps (its `rllib` extra would resolve
#     again), then its own runtime deps are installed under the same constraints.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLLIB_VENV:-$ROOT/.venv-rllib}"
PYTHON="${PYTHON:-python3.11}"
source "$ROOT/scripts/venv_common.sh"  # start_venv, check_cpu_torch, TORCH_VERSION
RAY_VERSION="2.60.0"
STAMP_CONTENT="torch==$TORCH_VERSION ray[rllib]==$RAY_VERSION v1"
STAMP="$VENV/.agent_gym_rllib_stamp"

install_project() {
    # Cheap (finds the packages without importing them), so it is checked on every run: the
    # stamp may predate the pyproject.
    if [[ -f "$ROOT/pyproject.toml" ]] && ! (cd / && "$VENV/bin/python" -c \
        "import importlib.util as u, sys; sys.exit(not all(u.find_spec(p) for p in ('agent_gym', 'envs', 'trainers')))" \
        >/dev/null 2>&1); then
        "$VENV/bin/python" -m pip install -q -e "$ROOT" --no-deps
    fi
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
    && "$VENV/bin/python" -c "import importlib.metadata as m; m.version('ray'); m.version('dm-tree')" >/dev/null 2>&1; then
    install_core_deps "$VENV"
    install_project
    echo "rllib env already set up at $VENV ($(cat "$STAMP"))"
    exit 0
fi

start=$(date +%s)
start_venv "$VENV" "$PYTHON" rllib
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q "ray[rllib]==$RAY_VERSION"
# The project's own runtime deps (pyproject [project].dependencies; ray's gymnasium pin meets
# them) and the test runner.
install_core_deps "$VENV"
"${PIP[@]}" install -q "safetensors>=0.4"
install_project

check_cpu_torch "$VENV"
# The real thing, not only `import ray`: RLlib's new API stack and its PPO config import (a partial
# install fails here, loudly, instead of skipping every RLlib test later).
"$VENV/bin/python" -c "import ray, ray.rllib, gymnasium; from ray.rllib.algorithms.ppo import PPOConfig; \
print('ray', ray.__version__, 'rllib ok', 'gymnasium', gymnasium.__version__)" \
    || { echo "error: ray[rllib] does not import in $VENV (see above); rerun \`make rllib\` or remove $VENV" >&2; exit 1; }
echo "$STAMP_CONTENT" > "$STAMP"
echo "rllib env ready at $VENV in $(( $(date +%s) - start )) s"
