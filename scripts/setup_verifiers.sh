#!/usr/bin/env bash
# Create .venv-verifiers: Prime Intellect's `verifiers` (its v1 stack) and the project, torch-free.
#
#   bash scripts/setup_verifiers.sh          # or: make verifiers
#
# Its own venv because verifiers pulls a large, fast-moving dependency set (openai 2.x, httpx2,
# mcp, anthropic, prime-* clients, renderers) that the main venv does not need (see
# docs/integrations.md, "verifiers"). The project's envs need no torch, so none is installed.
# Idempotent: a stamp file records the pinned set; when it matches, nothing is done.
#   - transformers is held below 5.20 (the project's pin) through a constraints file;
#   - the project is installed editable and without deps (its extras would resolve torch), then
#     its own runtime deps are installed under the same constraints.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERIFIERS_VENV:-$ROOT/.venv-verifiers}"
PYTHON="${PYTHON:-python3.11}"
VERIFIERS_VERSION="0.4.0"
STAMP_CONTENT="verifiers==$VERIFIERS_VERSION transformers<5.20 v1"
STAMP="$VENV/.agent_gym_verifiers_stamp"
source "$ROOT/scripts/venv_common.sh"  # install_core_deps (its torch helpers are not used here)

install_project() {
    # Cheap (finds the packages without importing them), so it is checked on every run: the
    # stamp may predate the pyproject or a new package of the project (agent_gym_verifiers).
    if [[ -f "$ROOT/pyproject.toml" ]] && ! (cd / && "$VENV/bin/python" -c \
        "import importlib.util as u, sys; sys.exit(not all(u.find_spec(p) for p in ('agent_gym', 'envs', 'trainers', 'agent_gym_verifiers')))" \
        >/dev/null 2>&1); then
        "$VENV/bin/python" -m pip install -q -e "$ROOT" --no-deps
    fi
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
    && "$VENV/bin/python" -c "import verifiers.v1" >/dev/null 2>&1; then
    install_core_deps "$VENV"
    install_project
    echo "verifiers env already set up at $VENV ($(cat "$STAMP"))"
    exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
constraints="$VENV/constraints-verifiers.txt"
printf 'transformers<5.20\n' > "$constraints"
export PIP_CONSTRAINT="$constraints"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "verifiers==$VERIFIERS_VERSION"
# The project's own runtime deps (pyproject [project].dependencies) and the test runner.
install_core_deps "$VENV"
"${PIP[@]}" install -q "safetensors>=0.4"
install_project

"$VENV/bin/python" -c "import verifiers, verifiers.v1, gymnasium, agent_gym_verifiers; agent_gym_verifiers.load_environment('AgentR1/FactChain-v0'); print('verifiers', verifiers.__version__, 'gymnasium', gymnasium.__version__, 'env ok')" \
    || { echo "error: verifiers or the agent-gym-verifiers package does not load in $VENV (see above); remove $VENV and rerun \`make verifiers\`" >&2; exit 1; }
echo "$STAMP_CONTENT" > "$STAMP"
echo "verifiers env ready at $VENV in $(( $(date +%s) - start )) s"
