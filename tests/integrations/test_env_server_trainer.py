"""The project's trainer with ``env_server: URL``: its rollout envs are sessions on a real
``python -m agent_gym.serve`` process on 127.0.0.1 (OpenEnv), built by the run's
``agent_gym.factory.EnvFactory``, and one iteration gives the same batch as the in-process run
with the same config and seed. An unreachable server and a server that serves other envs fail at
set-up with errors that say what to do.

The server is the one of tests/integrations/test_openenv.py (FactChain, ``max_turns: 4``, the tiny
model's vocabulary); the tiny model is untrained (seeded), so its turns are mostly invalid calls
and the env's feedback, which is what has to cross the wire token for token.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip(
    "openenv.core.env_server", reason="openenv-core is not installed (pip install -e '.[openenv]'; make setup does)"
)
pytest.importorskip("torch")

from agent_gym.env_client import RemoteVectorEnv  # noqa: E402
from tests.integrations.test_openenv import ENV_ID, ENV_KWARGS, _free_port, server  # noqa: E402,F401  (server: its fixture)

TRAIN_ENV_KWARGS = {k: v for k, v in ENV_KWARGS.items() if k != "vocab_size"}  # the run's vocab is the policy's


def _cfg(run_dir, **kw):
    from trainers.config import TrainConfig

    base = dict(
        run_dir=str(run_dir),
        env_id=ENV_ID,
        env_kwargs=dict(TRAIN_ENV_KWARGS),
        algo="grpo",
        iterations=1,
        seed=3,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=16,
        temperature=1.0,
        eval_every=1,
        eval_tasks=2,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        checkpoint_every=1,
        gc_freeze=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def _one_iteration(cfg, server, sessions):
    """(iteration 0's rollout, the metrics of one whole iteration) of a fresh trainer, which holds
    ``sessions`` sessions on ``server`` once set up (its rollout envs: 0 in-process)."""
    from trainers.compose import build_trainer

    tr = build_trainer(cfg)
    tr.setup()
    try:
        assert server.wait_open_envs(sessions) == sessions
        trajs, _ = tr.rollout(0)
        metrics = tr.train()  # rollout 0 again (the same seed), score, update, evaluate, checkpoint
    finally:
        tr.cleanup()
    return trajs, metrics


@pytest.mark.timeout(180)
def test_one_iteration_on_the_env_server_equals_the_in_process_one(server, tmp_path):
    expected, local = _one_iteration(_cfg(tmp_path / "local"), server, 0)
    got, remote = _one_iteration(_cfg(tmp_path / "remote", env_server=server.url), server, 4)  # 2 tasks x 2
    assert len(got) == 4 and got == expected  # Trajectory dataclasses: Episode (ids, masks, reward), log-probs, group
    assert sum(t.episode.turns for t in got) > 4  # multi-turn episodes went over the wire
    assert len({tuple(t.episode.token_ids) for t in got}) > 1
    # The rest of the iteration (scores, advantages, update, in-process evaluation) follows from the
    # same batch: every metric but the timings is the same.
    skip = ("time/", "perf/", "memory/")  # timings and memory differ between two runs
    keys = {k for k in local if not k.startswith(skip) and not k.endswith(("_s", "per_s"))}
    assert keys == {k for k in remote if not k.startswith(skip) and not k.endswith(("_s", "per_s"))}
    assert "policy/loss" in keys and "eval/success_rate" in keys
    for k in sorted(keys):
        a, b = local[k], remote[k]
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (k, a, b)
    assert server.wait_open_envs(0) == 0  # cleanup closed the run's sessions


@pytest.mark.timeout(60)
def test_an_unreachable_env_server_fails_at_set_up_naming_it(tmp_path):
    from trainers.compose import build_trainer

    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    tr = build_trainer(_cfg(tmp_path, env_server=url))
    with pytest.raises(
        ConnectionError,
        match=rf"env server {url} is unreachable .*python -m agent_gym.serve "
        rf"{ENV_ID}.*or unset env_server",
    ):
        tr.setup()


@pytest.mark.timeout(60)
def test_a_server_of_other_envs_is_refused_naming_the_difference(server, tmp_path):
    from trainers.compose import build_trainer

    tr = build_trainer(_cfg(tmp_path, env_server=server.url, env_kwargs={"max_turns": 3}))
    with pytest.raises(
        ValueError,
        match=r"serves other envs than this run would build: env kwargs .*server "
        r"\{'max_turns': 4\}, here \{'max_turns': 3\}",
    ):
        tr.setup()
    tr = build_trainer(_cfg(tmp_path, env_server=server.url, env_kwargs={**TRAIN_ENV_KWARGS, "vocab_size": 4096}))
    with pytest.raises(ValueError, match=r"vocab_size: server 2112, here 4096"):
        tr.setup()


@pytest.mark.timeout(60)
def test_a_server_whose_envs_encode_with_another_tokenizer_is_refused(server):
    from agent_gym.factory import EnvFactory
    from agent_gym.tokenizer import build_bpe_tokenizer, load_tokenizer

    same = EnvFactory(
        ENV_ID, TRAIN_ENV_KWARGS, load_tokenizer(None), vocab_size=ENV_KWARGS["vocab_size"], server=server.url
    )
    assert same.check_server()["num_tasks"] == same.local().make().unwrapped.num_tasks()
    other = EnvFactory(
        ENV_ID,
        TRAIN_ENV_KWARGS,
        build_bpe_tokenizer(vocab_size=1024),
        vocab_size=ENV_KWARGS["vocab_size"],
        server=server.url,
    )
    with pytest.raises(ValueError, match="tokenizer: the server's env encodes with a different tokenizer"):
        other.make_vector(2)
    assert server.wait_open_envs(0) == 0  # refused before any session was opened


def test_the_server_takes_its_env_from_a_sectioned_trainer_config(tmp_path):
    """``python -m agent_gym.serve --config RUN.yaml`` serves the run's env: ``rollout.env_id`` and
    ``rollout.env_kwargs`` of a sectioned config (the old flat keys still work); ``--env-kwargs`` adds
    the policy's ``vocab_size``."""
    import yaml

    from agent_gym.serve import parse_args

    sectioned = {
        "run": {"run_dir": "runs/x"},
        "model": {"name": "tiny"},
        "rollout": {"env_id": ENV_ID, "env_kwargs": dict(TRAIN_ENV_KWARGS), "env_server": "http://127.0.0.1:1"},
    }
    flat = {"env_id": ENV_ID, "env_kwargs": dict(TRAIN_ENV_KWARGS), "lr": 1e-3}
    for name, cfg in (("sectioned", sectioned), ("flat", flat)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        _, env_id, kwargs = parse_args(
            ["--config", str(path), "--env-kwargs", f"{{vocab_size: {ENV_KWARGS['vocab_size']}}}"]
        )
        assert (env_id, kwargs) == (ENV_ID, ENV_KWARGS), name


@pytest.mark.timeout(60)
def test_trl_env_rollout_plays_on_the_server_through_the_factory(server):
    """``EnvRollout(env_server=URL)``: its rollouts are sessions on the server (the model's vocabulary
    checked against the served env's), its dataset's prompts are rendered in-process."""
    from agent_gym.tokenizer import load_tokenizer
    from agent_gym.vector import ToolVectorEnv
    from trainers.integrations.trl import EnvRollout

    rollout = EnvRollout(ENV_ID, TRAIN_ENV_KWARGS, load_tokenizer(None), env_server=server.url)
    remote = rollout._envs(2, ENV_KWARGS["vocab_size"])
    assert isinstance(remote, RemoteVectorEnv) and server.wait_open_envs(2) == 2
    assert isinstance(rollout._envs(1), ToolVectorEnv) and server.wait_open_envs(0) == 0  # the remote one closed
    with pytest.raises(ValueError, match="vocab_size: server 2112, here 4096"):
        rollout._envs(2, 4096)
    assert rollout._vec is None  # the old one closed and forgotten: nothing stale is handed out next
    assert EnvRollout.from_factory(rollout.env_factory).env_factory.server == server.url
