"""The trainer's side of scaffolded turns (agent_gym/scaffold.py): the transformers backend's stop
strings, the rollout that passes each env's stop strings to the backend (and refuses a backend that
takes none), and one GRPO iteration from SmolLM2-135M-Instruct itself, with no SFT, whose batch has
reward (vLLM's stop strings: tests/trainers/test_vllm_backend.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_gym.vector import ToolVectorEnv
from tests.agent_gym.test_scaffold import QEnv
from tests.trainers.test_hf_backend import model, tok  # noqa: F401  (the tiny model and tokenizer fixtures)
from trainers.backends.base import Generation, SamplingConfig
from trainers.backends.hf_backend import HFBackend
from trainers.rollout import collect

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qa" / "hotpotqa" / "hotpot_dev_distractor_v1.json"


def first_stop(tok, ids, stops):
    """How many of ``ids`` a sampler keeps when it stops at the first token whose text completes a stop string."""
    for k in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:k], skip_special_tokens=False) for s in stops):
            return k
    return None


def test_hf_stop_strings_cut_the_same_samples_at_the_token_that_completes_the_string(tok, model):
    be = HFBackend(model, pad_token_id=tok.pad_token_id, tokenizer=tok)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("Who is the mentor of", "<tool_call>{", "a b c")] * 4
    s = SamplingConfig(max_new_tokens=40, temperature=1.0)
    seeds = list(range(100, 100 + len(prompts)))
    free = be.generate(prompts, s, seeds=seeds)
    # Stop strings made of characters the free samples actually wrote, so some rows do stop.
    stops = []
    for g in free:
        text = tok.decode(g.token_ids, skip_special_tokens=False)
        stops.append([text[len(text) // 2 : len(text) // 2 + 2]] if len(text) > 6 else ["\x00never"])
    cut = be.generate(prompts, s, seeds=seeds, stop_strings=stops)
    stopped = 0
    for f, c, st in zip(free, cut, stops):
        k = first_stop(tok, f.token_ids, st)
        if k is None:
            assert c.token_ids == f.token_ids
            continue
        stopped += 1
        assert c.token_ids == f.token_ids[:k] and c.finish_reason == "stop"
        assert c.logprobs == pytest.approx(f.logprobs[:k], abs=1e-5)
    assert stopped >= 6
    with pytest.raises(ValueError, match="one list of strings per prompt"):
        be.generate(prompts, s, stop_strings=[["x"]])
    with pytest.raises(ValueError, match="need the tokenizer"):
        HFBackend(model, pad_token_id=tok.pad_token_id).generate(prompts[:1], s, stop_strings=[["x"]])


def test_rollout_passes_each_turns_stop_strings_and_refuses_a_backend_without_them(tok, model):
    class NoStops:
        def generate(self, prompts, sampling, seeds=None):
            return [Generation([5], [0.0], "length") for _ in prompts]

    vec = ToolVectorEnv([lambda: QEnv(scaffold=True)] * 2, info_format="list")
    with pytest.raises(TypeError, match="takes no stop_strings"):
        collect(vec, NoStops(), [0], 2, SamplingConfig(max_new_tokens=4), seed=0)
    plain = ToolVectorEnv(
        [lambda: QEnv()], info_format="list"
    )  # an env without a scaffold sends none: such a backend works as before
    assert len(collect(plain, NoStops(), [0], 1, SamplingConfig(max_new_tokens=4), seed=0)[0]) == 1

    seen = []

    class Recording(HFBackend):
        def generate(self, prompts, sampling, seeds=None, stop_strings=None):
            seen.append(stop_strings)
            return super().generate(prompts, sampling, seeds, stop_strings)

    be = Recording(model, pad_token_id=tok.pad_token_id, tokenizer=tok)
    vec = ToolVectorEnv([lambda: QEnv(scaffold={"turns": ["call:search", None, "answer"]})] * 2, info_format="list")
    trajs, _ = collect(vec, be, [0], 2, SamplingConfig(max_new_tokens=12, temperature=1.0), seed=3)
    assert seen[0] == [['"', "\n"]] * 2
    assert all(t.episode.step_slots[0] == "call:search" for t in trajs)
    for t in trajs:  # the env's own masks survive the rollout: 1 exactly on sampled ids
        assert sum(t.episode.loss_mask) == sum(e - s for s, e in t.episode.step_spans)


def test_one_grpo_iteration_from_smollm2_with_the_scaffold_has_reward(tmp_path):
    """RL from the instruct model itself: with the scaffold, every episode makes valid searches and
    answers, and the batch has reward (the answer's F1 and the supporting-paragraph reward)."""
    from tests.trainers.test_smollm import _available
    from trainers.compose import build_trainer
    from trainers.config import from_dict

    if _available() is not None:
        pytest.skip(f"SmolLM2 extra absent: {_available()}")
    cfg = from_dict(
        {
            "run": {
                "run_dir": str(tmp_path / "run"),
                "seed": 0,
                "iterations": 1,
                "checkpoint_every": 100,
                "tensorboard": False,
                "progress_bar": False,
                "log_trajectories": 4,
            },
            "model": {"name": "smollm2-135m-instruct", "torch_threads": 1},
            "rollout": {
                "env_id": "AgentR1/HotpotQA-v0",
                "tasks_per_iter": 2,
                "group_size": 2,
                "max_turn_tokens": 24,
                "temperature": 0.7,
                "env_kwargs": {
                    "data_path": str(FIXTURE),
                    "tool_format": "smollm2",
                    "max_turns": 3,
                    "max_result_tokens": 64,
                    "scaffold": True,
                    "rewards": {"answer_weights": {"f1": 1.0}, "extra": {"supporting_hit": 0.1}},
                },
            },
            "algorithm": {"algo": "grpo", "minibatch_size": 4, "lr": 1e-3},
            "scale": {"lora_r": 4},
            "eval": {"every": 100, "tasks": 1},
        }
    )
    tr = build_trainer(cfg)
    tr.setup()
    last = tr.train()
    tr.cleanup()
    assert last["rollout/answered_rate"] == 1.0 and last["tools/ok_per_episode"] == 2.0
    assert last["rollout/reward_mean"] > 0, last
    assert last["train/logprob_mismatch_max"] < 1e-3


def test_rollout_scaffold_drop_anneals_the_slots_over_the_run(tmp_path):
    """``rollout.scaffold_drop: [1.0, 0.0]``: the first iteration's turns are all free, the last one's
    all scaffolded (each env's reset gets the iteration's ``scaffold_drop_prob``)."""
    import json

    from trainers.compose import build_trainer
    from trainers.config import from_dict

    cfg = from_dict(
        {
            "run": {
                "run_dir": str(tmp_path / "run"),
                "iterations": 3,
                "checkpoint_every": 100,
                "tensorboard": False,
                "progress_bar": False,
            },
            "model": {"name": "tiny", "tiny_layers": 1, "torch_threads": 1},
            "rollout": {
                "env_id": "AgentR1/HotpotQA-v0",
                "tasks_per_iter": 2,
                "group_size": 2,
                "max_turn_tokens": 8,
                "scaffold_drop": [1.0, 0.0],
                "env_kwargs": {"data_path": str(FIXTURE), "max_turns": 2, "max_result_tokens": 32, "scaffold": True},
            },
            "algorithm": {"algo": "grpo", "minibatch_size": 4},
            "eval": {"every": 100, "tasks": 1},
        }
    )
    tr = build_trainer(cfg)
    tr.setup()
    tr.train()
    tr.cleanup()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/scaffolded_turns"] for r in (rows[0], rows[-1])] == [0.0, 1.0]
    assert tr.reset_options(1) == {"reset_options": {"scaffold_drop_prob": 0.5}}


@pytest.mark.parametrize("value, needle", [([0.5], "two probabilities"), ([0.0, 1.5], "two probabilities")])
def test_bad_scaffold_drop_is_refused_at_start(value, needle):
    from trainers.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match=needle):
        from_dict({"rollout": {"env_id": "AgentR1/HotpotQA-v0", "scaffold_drop": value}}).check()
