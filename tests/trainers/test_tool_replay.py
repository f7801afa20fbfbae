"""An RL iteration re-run from a tool recording (env kwargs tool_record / tool_replay): the same
trajectories and metrics, with no tool run the second time."""

import json

import pytest

from tests.trainers.conftest import tiny_rl_config
from trainers.compose import build_trainer

pytestmark = pytest.mark.timeout(600)


def _run(tmp_path, name, sft_model, **env):
    cfg = tiny_rl_config(tmp_path / name, "grpo", sft_model, iterations=1)
    cfg.rollout.env_kwargs.update(env)
    tr = build_trainer(cfg)
    tr.setup()
    if "tool_replay" in env:  # every env of the run, rollout and evaluation: no tool may run
        for vec in (tr.source.envs, tr.source.eval_envs):
            for e in vec.envs:
                e.unwrapped.tools["lookup"].execute = lambda **kw: (_ for _ in ()).throw(AssertionError("tool ran"))
    tr.train()
    tr.cleanup()
    rec = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    trajs = (tmp_path / name / "trajectories" / "iter_00000.jsonl").read_text()
    return {k: v for k, v in rec.items() if not k.startswith(("time/", "perf/", "gc/", "memory/"))}, trajs


def test_an_iteration_replayed_from_its_recording_is_the_same(tmp_path, sft_model):
    calls = tmp_path / "calls.jsonl"
    first, trajs1 = _run(tmp_path, "record", sft_model, tool_record=str(calls))
    n = len(calls.read_text().splitlines())
    assert n > 0
    again, trajs2 = _run(tmp_path, "replay", sft_model, tool_replay=str(calls))
    assert again == first and trajs2 == trajs1
    assert len(calls.read_text().splitlines()) == n  # replay records nothing
