#!/usr/bin/env bash
# The evaluations behind docs/results.md's SmolLM2 HotpotQA/2Wiki/MuSiQue table (Table 2 layout):
# every method greedy on every held-out row of `make qa-split` (HotpotQA and 2Wiki: the held-out
# half; MuSiQue: all of it, never trained on), each searching its own dataset's corpus, on vLLM's
# CPU engine. Each step writes under runs/qa_table/ and is skipped when its output exists, so the
# script resumes. Then benchmarks/analysis/qa_table.py builds the table from benchmarks/analysis/tables/smollm2_qa.yaml.
#
#   bash scripts/qa_table.sh baselines            # Naive RAG, the base agent unscaffolded and scaffolded
#   bash scripts/qa_table.sh checkpoint NAME RUN_DIR [scaffold|noscaffold]   # a trained run
#   bash scripts/qa_table.sh model NAME MODEL_DIR CONFIG_YAML   # a saved model (the SFT) with a config's env_kwargs
#   bash scripts/qa_table.sh table                # runs/qa_table/table.md
#
# QA_ROWS=100 evaluates the first 100 held-out rows of each set instead of all of them (0: all);
# QA_TABLE_OUT puts the outputs elsewhere (default runs/qa_table); QA_CONDITIONS picks the baselines
# (default: naiverag-text agent-smollm2-oneshot agent-smollm2-scaffold); QA_SPEC the table's spec;
# QA_DATASETS the sets a checkpoint or model is evaluated on (default: hotpotqa 2wikimultihopqa musique).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv-vllm/bin/python}
DATA=${SHARED_DATA:-../shared/data}
OUT=${QA_TABLE_OUT:-runs/qa_table}
ROWS=${QA_ROWS:-0}
TASKS=$([[ "$ROWS" == 0 ]] && echo 100000 || echo "$ROWS")
read -r -a CONDITIONS <<< "${QA_CONDITIONS:-naiverag-text agent-smollm2-oneshot agent-smollm2-scaffold}"
read -r -a DATASETS <<< "${QA_DATASETS:-hotpotqa 2wikimultihopqa musique}"
SPEC=${QA_SPEC:-benchmarks/analysis/tables/smollm2_qa.yaml}
mkdir -p "$OUT"
declare -A ENV_ID=([hotpotqa]=AgentR1/HotpotQA-v0 [2wikimultihopqa]=AgentR1/2WikiMultiHopQA-v0 [musique]=AgentR1/MuSiQue-v0)

rows_kwargs() {  # the held-out rows of $1 and its own corpus
    echo "data_path: runs/qa_split/$1_heldout.jsonl, corpus_path: $DATA/$1/corpus.jsonl"
}

case "${1:-}" in
baselines)
    [[ -f "$OUT/baselines/results.json" ]] && [[ $(grep -c '"condition"' "$OUT/baselines/results.json") -ge $((3 * ${#CONDITIONS[@]})) ]] \
        || "$PY" benchmarks/experiments/smollm_baselines.py --backend vllm --rows "$ROWS" --rows-dir runs/qa_split \
            --conditions "${CONDITIONS[@]}" --out "$OUT/baselines"
    ;;
checkpoint)
    name=$2; run=$3; mode=${4:-scaffold}
    extra=""; [[ "$mode" == noscaffold ]] && extra=", scaffold: null"
    for ds in "${DATASETS[@]}"; do
        dir="$OUT/$name/$ds"
        [[ -f "$dir/trajectories.jsonl" ]] && continue
        "$PY" trainers/evaluate.py --checkpoint "$run" --env "${ENV_ID[$ds]}" --backend vllm --tasks "$TASKS" \
            --env-kwargs "{$(rows_kwargs "$ds")$extra}" --out "$dir"
    done
    ;;
model)
    name=$2; model=$3; kwargs_file=$4
    for ds in "${DATASETS[@]}"; do
        dir="$OUT/$name/$ds"
        [[ -f "$dir/trajectories.jsonl" ]] && continue
        kw=$("$PY" -c "import sys, yaml, json; d = yaml.safe_load(open(sys.argv[1])); \
d = d.get('env_kwargs') or (d.get('rollout') or {}).get('env_kwargs') or d; d.update(data_path='runs/qa_split/$ds''_heldout.jsonl', corpus_path='$DATA/$ds/corpus.jsonl'); print(json.dumps(d))" "$kwargs_file")
        "$PY" trainers/evaluate.py --model "$model" --env "${ENV_ID[$ds]}" --backend vllm --tasks "$TASKS" \
            --max-turn-tokens 48 --env-kwargs "$kw" --out "$dir"
    done
    ;;
table)
    "$PY" benchmarks/analysis/qa_table.py --spec "$SPEC" --out "$OUT"
    ;;
*)
    sed -n '2,16p' "$0"; exit 2
    ;;
esac
