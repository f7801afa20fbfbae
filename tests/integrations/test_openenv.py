"""OpenEnv (openenv-core): ``python -m agent_gym.serve`` as a real server process on 127.0.0.1,
driven by openenv-core's own WebSocket client (``agent_gym.env_client.AgentGymClient`` subclasses its
``EnvClient``; ``RemoteToolEnv`` wraps its ``.sync()`` client).

Token-exact equality with the in-process env over fuzzed episodes (token and text actions), 64
sessions at once, a client that drops mid-episode (its session is freed), malformed actions (clear
errors, the session goes on) and a server restart (a clear ConnectionError, then a fresh session).
One server process serves the module (about 10 s to start under load: openenv-core imports gradio).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "openenv.core.env_server", reason="openenv-core is not installed (pip install -e '.[openenv]'; make setup does)"
)

import gymnasium as gym  # noqa: E402

import agent_gym  # noqa: E402,F401
from agent_gym.env_client import AgentGymClient, AgentGymServerError, RemoteToolEnv, RemoteVectorEnv  # noqa: E402
from agent_gym.env_wire import AgentGymAction  # noqa: E402
from agent_gym.factory import jsonable  # noqa: E402
from agent_gym.serve import parse_args  # noqa: E402
from agent_gym.wrappers import TextView  # noqa: E402
from tests.agent_gym.fuzz import fuzz_action  # noqa: E402
from tests.integrations.serve_server import Server, free_port  # noqa: E402

ENV_ID = "AgentR1/FactChain-v0"
ROOT = Path(__file__).resolve().parents[2]


def _env_kwargs() -> dict:
    """The served env's kwargs (the in-process twins use the same): the vocabulary of the tiny
    model of the rollout test (``len(tokenizer)`` rounded up to 64, as ``build_tiny_qwen2`` does)."""
    from agent_gym.tokenizer import load_tokenizer

    return {"vocab_size": -(-len(load_tokenizer(None)) // 64) * 64, "max_turns": 4}


ENV_KWARGS = _env_kwargs()


_free_port = free_port  # the name tests/integrations/test_env_server_trainer.py imports


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``python -m agent_gym.serve`` (tests/integrations/serve_server.py), 70 sessions at most."""
    s = Server(tmp_path_factory.mktemp("openenv") / "server.log", ENV_KWARGS, max_concurrent_envs=70)
    s.start(deadline_s=120.0)
    yield s
    s.stop()


def _same_step(remote, local):
    """The remote (obs, reward, terminated, truncated, info) equals the local one exactly."""
    r_obs, r_rew, r_term, r_trunc, r_info = remote
    l_obs, l_rew, l_term, l_trunc, l_info = local
    if isinstance(l_obs, dict):
        assert r_obs["input_ids"].dtype == np.int64 and np.array_equal(r_obs["input_ids"], l_obs["input_ids"])
    else:
        assert r_obs == l_obs
    assert (r_rew, r_term, r_trunc) == (l_rew, l_term, l_trunc)
    assert type(r_rew) is float
    l_info, r_info = dict(l_info), dict(r_info)
    l_traj, r_traj = l_info.pop("trajectory", None), r_info.pop("trajectory", None)
    assert r_info == jsonable(l_info)
    assert r_traj == l_traj  # the Episode dataclass itself, rebuilt by pydantic on the client
    return l_term or l_trunc


@pytest.mark.timeout(240)
def test_token_exact_with_the_in_process_env_over_fuzzed_episodes(server):
    local = gym.make(ENV_ID, **ENV_KWARGS)
    u = local.unwrapped
    text_local = TextView(local)
    rng = np.random.default_rng(0)
    episodes = steps = text_steps = successes = 0
    statuses: set[str] = set()
    with RemoteToolEnv(server.url) as remote:
        while episodes < 60:
            seed = 1000 + episodes
            (r_obs, r_info), (l_obs, l_info) = remote.reset(seed=seed), local.reset(seed=seed)
            assert np.array_equal(r_obs["input_ids"], l_obs["input_ids"]) and r_info == jsonable(l_info)
            done = False
            while not done:
                ids = fuzz_action(local, rng, u.task)
                if rng.random() < 0.25 and len(ids) and ids[-1] == u.eot_id:  # the same turn as text (TextView)
                    text = u.tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False)
                    out = remote.step(text)
                    done = _same_step(out, _text_step_as_ids(text_local, text))
                    text_steps += 1
                else:
                    out = remote.step(ids)
                    done = _same_step(out, local.step(ids))
                statuses.update(c["status"] for c in out[4]["tool_calls"])
                successes += bool(done and out[4]["trajectory"].success)
                steps += 1
                assert steps < 2000
            episodes += 1
    # Both action kinds, multi-turn episodes, good and bad tool calls, right answers.
    assert text_steps > 10 and steps > 2 * episodes and {"ok", "parse_error"} <= statuses and successes > 0

    # A session reset with view="text" sees TextView's observations.
    with RemoteToolEnv(server.url, text=True) as remote:
        for seed in (7, 8):
            r_obs, _ = remote.reset(seed=seed)
            l_obs, _ = text_local.reset(seed=seed)
            assert isinstance(r_obs, str) and r_obs == l_obs
            done = False
            while not done:
                ids = fuzz_action(local, rng, u.task)
                text = u.tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False)
                done = _same_step(remote.step(text), text_local.step(text))


def _text_step_as_ids(text_view: TextView, text: str):
    """TextView's step with its obs as the ids dict (the remote session is in the token view)."""
    _, r, term, trunc, info = text_view.step(text)
    return text_view.tool_env._obs(), r, term, trunc, info


@pytest.mark.timeout(180)
def test_64_concurrent_sessions_each_with_its_own_env(server):
    n = 64
    local = gym.make(ENV_ID, **ENV_KWARGS)
    u = local.unwrapped
    expected = []
    for i in range(n):
        obs, _ = local.reset(seed=i, options={"task_index": i})
        answer = f"<answer>{u.task['answer'] if i % 2 else 'wrong'}</answer>"
        s_obs, s_rew, _, _, s_info = local.step(u.encode_turn(answer))
        expected.append((obs["input_ids"].tolist(), answer, s_obs["input_ids"].tolist(), s_rew, s_info["trajectory"]))

    async def main():
        clients = [AgentGymClient(base_url=server.url) for _ in range(n)]
        await asyncio.gather(*(c.connect() for c in clients))
        resets = await asyncio.gather(*(c.reset(seed=i, task_index=i) for i, c in enumerate(clients)))
        open_during = await asyncio.to_thread(server.open_envs)
        steps = await asyncio.gather(*(c.step(AgentGymAction(text=expected[i][1])) for i, c in enumerate(clients)))
        await asyncio.gather(*(c.close() for c in clients))
        return resets, open_during, steps

    resets, open_during, steps = asyncio.run(main())
    assert open_during == n
    for i, (reset, step) in enumerate(zip(resets, steps)):
        prompt, _, full, reward, episode = expected[i]
        assert reset.observation.token_ids == prompt
        assert prompt + step.observation.token_ids == full and step.observation.num_tokens == len(full)
        assert step.reward == reward and step.done and step.observation.episode == episode
    assert sum(1 for s in steps if s.observation.episode.success) == n // 2
    assert server.wait_open_envs(0) == 0


@pytest.mark.timeout(240)
def test_the_rollout_loop_collects_the_same_batch_from_the_server_as_in_process(server):
    """``trainers.rollout.collect`` (the project's trainer's rollout loop) with a tiny model: 4
    sessions (2 GRPO groups of 2) on the server give the same trajectories as an in-process
    ``ToolVectorEnv``: ids, loss masks, rewards, the sampler's log-probs."""
    pytest.importorskip("torch")
    from agent_gym.tokenizer import load_tokenizer
    from trainers.backends.base import SamplingConfig
    from trainers.backends.hf_backend import HFBackend
    from trainers.rollout import collect
    from trainers.sources import make_vector_env
    from trainers.tiny_model import build_tiny_qwen2

    tok = load_tokenizer(None)
    model = build_tiny_qwen2(tok, seed=0)
    assert model.get_output_embeddings().weight.shape[0] == ENV_KWARGS["vocab_size"]
    backend = HFBackend(model, pad_token_id=tok.pad_token_id)
    sampling = SamplingConfig(max_new_tokens=24, temperature=1.0)
    local = make_vector_env(ENV_ID, 4, ENV_KWARGS)
    expected, _ = collect(local, backend, [3, 11], 2, sampling, seed=5)
    local.close()
    with RemoteVectorEnv(server.url, 4) as remote:
        assert server.wait_open_envs(4) == 4  # a session's env is built just after its connection opens
        got, _ = collect(remote, backend, [3, 11], 2, sampling, seed=5)
    assert len(got) == 4 and got == expected  # Trajectory dataclasses: Episode, log-probs, group
    assert sum(t.episode.turns for t in got) > 4  # multi-turn episodes went over the wire
    assert server.wait_open_envs(0) == 0


@pytest.mark.timeout(60)
def test_a_client_that_drops_mid_episode_frees_its_session(server):
    from websockets.sync.client import connect

    assert server.wait_open_envs(0) == 0
    with connect(server.url.replace("http", "ws") + "/ws", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"text": '<tool_call>{"name": "lookup"'}}))
        step = json.loads(ws.recv(timeout=30))
        assert step["type"] == "observation" and not step["data"]["done"]  # mid-episode
        assert server.open_envs() == 1
        ws.socket.shutdown(socket.SHUT_RDWR)  # the client vanishes mid-episode: no close frame
        ws.socket.close()
    assert server.wait_open_envs(0) == 0
    # Neither this drop nor the normal closes of the tests before it are errors in the server's log
    # (openenv-core alone logged "Exception in ASGI application" with a traceback for each).
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


@pytest.mark.timeout(60)
def test_malformed_actions_get_clear_errors_and_the_session_goes_on(server):
    local = gym.make(ENV_ID, **ENV_KWARGS)
    u = local.unwrapped
    with RemoteToolEnv(server.url) as remote:
        with pytest.raises(AgentGymServerError, match=r"(before calling env\.reset\(\)|call reset\(\) first)") as e:
            remote.step([1, 2, u.eot_id])
        assert e.value.code == "EXECUTION_ERROR"
        with pytest.raises(AgentGymServerError, match="unknown reset argument.*'colour'"):
            remote.client.reset(seed=0, colour="red")
        (r_obs, _), (l_obs, _) = remote.reset(seed=5), local.reset(seed=5)
        np.testing.assert_array_equal(r_obs["input_ids"], l_obs["input_ids"])  # the same episode on both sides
        bad = [
            ({}, "VALIDATION_ERROR", "exactly one of 'token_ids'.*got neither"),
            ({"token_ids": [1], "text": "hi"}, "VALIDATION_ERROR", "exactly one of 'token_ids'.*got both"),
            ({"token_ids": "abc"}, "VALIDATION_ERROR", r"token_ids: Input should be a valid list"),
            ({"token_ids": [1.5]}, "VALIDATION_ERROR", r"token_ids\.0: Input should be a valid integer"),
            ({"text": 3}, "VALIDATION_ERROR", r"text: Input should be a valid string"),
            ({"tokens": [1]}, "VALIDATION_ERROR", r"tokens: Extra inputs are not permitted"),
            ({"token_ids": [-1]}, "EXECUTION_ERROR", r"token ids outside \[0, \d+\)"),
            ({"token_ids": [u.vocab_size]}, "EXECUTION_ERROR", r"token ids outside \[0, \d+\)"),
        ]
        for payload, code, msg in bad:
            with pytest.raises(AgentGymServerError, match=msg) as e:
                remote.client.step(payload)
            assert e.value.code == code, payload
            assert remote.state().turn == 0  # nothing was stepped
        # The session is intact: the next good action matches the in-process env token for token.
        ids = u.encode_turn('<tool_call>{"name": "lookup", "arguments": {"entity": "x", "relation": "y"}}</tool_call>')
        assert not _same_step(remote.step(ids), local.step(ids))
        assert remote.state().turn == 1


@pytest.mark.timeout(240)
def test_a_server_restart_gives_clients_a_clear_error(server):
    remote = RemoteToolEnv(server.url, message_timeout_s=30)
    remote.reset(seed=0)
    server.stop()
    with pytest.raises(ConnectionError, match="is gone.*session and episode are lost.*Connect again and reset"):
        remote.step("<answer>x</answer>")
    server.start()
    # The same client object reconnects to a new session, which has no episode yet.
    with pytest.raises(AgentGymServerError, match=r"(before calling env\.reset\(\)|call reset\(\) first)"):
        remote.step("<answer>x</answer>")
    obs, _ = remote.reset(seed=0)
    assert len(obs["input_ids"]) > 0
    remote.close()
    assert server.wait_open_envs(0) == 0


@pytest.mark.timeout(60)
def test_command_line_env_kwargs_from_a_config_and_flags(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("env_id: AgentR1/FactChain-v0\nenv_kwargs:\n  max_turns: 3\n  num_kbs: 2\nlr: 0.1\n")
    _, env_id, kwargs = parse_args(["--config", str(cfg), "--env-kwargs", '{"max_turns": 5}'])
    assert env_id == ENV_ID and kwargs == {"max_turns": 5, "num_kbs": 2}
    kw = tmp_path / "kw.yaml"
    kw.write_text("max_context_tokens: 512\n")
    _, env_id, kwargs = parse_args(["AgentR1/FactChain-v0", "--env-kwargs", str(kw)])
    assert kwargs == {"max_context_tokens": 512}
    with pytest.raises(SystemExit, match="must be a mapping"):
        parse_args([ENV_ID, "--env-kwargs", "[1, 2]"])
    with pytest.raises(SystemExit, match="name an env id"):
        parse_args([])
    from agent_gym.serve import main

    with pytest.raises(SystemExit, match="unknown env id 'AgentR1/Nope-v0'"):
        main(["AgentR1/Nope-v0"])
    with pytest.raises(SystemExit, match="max_turns must be a positive integer"):
        main([ENV_ID, "--env-kwargs", "max_turns: 0"])


@pytest.mark.timeout(300)
def test_trl_grpo_trains_through_rollout_func_on_the_server(server):
    """TRL's OpenEnv pattern: ``GRPOTrainer(rollout_func=...)`` whose rollout plays its episodes on
    the server. ``EnvRollout`` (trainers.integrations.trl) with its vector env swapped for
    :class:`RemoteVectorEnv`: TRL trains on exactly the ids and loss masks the server's envs built."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    from agent_gym.tokenizer import load_tokenizer
    from trainers.integrations.trl import EnvRollout, env_reward
    from trainers.tiny_model import build_tiny_qwen2

    class ServerRollout(EnvRollout):
        remote = None

        def _envs(self, n, vocab_size=None):
            if vocab_size is None:  # EnvRollout.dataset renders the prompts with an in-process env
                return super()._envs(n)
            assert vocab_size == ENV_KWARGS["vocab_size"]  # the served env's vocabulary is the model's
            if self.remote is None or self.remote.num_envs != n:
                if self.remote is not None:
                    self.remote.close()
                self.remote = RemoteVectorEnv(server.url, n)
            return self.remote

    tok = load_tokenizer(None)
    model = build_tiny_qwen2(tok, seed=0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    rollout = ServerRollout(
        ENV_ID,
        env_kwargs={k: v for k, v in ENV_KWARGS.items() if k != "vocab_size"},
        tokenizer=tok,
        max_turn_tokens=12,
        seed=0,
    )
    episodes, seen = [], []

    def rollout_func(prompts, trainer):
        out = rollout(prompts, trainer)
        episodes.extend(rollout.last_episodes)
        return out

    def shaping(completion_ids, **kwargs):  # breaks GRPO's reward ties, as in tests/integrations/test_trl.py
        return [0.1 * sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]

    class Recording(GRPOTrainer):
        def _compute_loss(self, model, inputs):
            seen.append(
                {
                    k: inputs[k].detach().clone()
                    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")
                }
            )
            return super()._compute_loss(model, inputs)

    args = GRPOConfig(
        output_dir=str(Path(server.log).parent / "trl"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,
        gradient_checkpointing=False,
    )
    trainer = Recording(
        model=model,
        reward_funcs=[env_reward, shaping],
        args=args,
        train_dataset=rollout.dataset(range(8)),
        processing_class=tok,
        rollout_func=rollout_func,
    )
    trainer.train()
    rollout.remote.close()
    assert len(seen) == 2 and len(episodes) == 8
    trained_rows = []
    for b in seen:
        for i in range(b["completion_ids"].shape[0]):
            real = b["completion_mask"][i].bool()
            trained_rows.append(
                (
                    tuple(b["prompt_ids"][i][b["prompt_mask"][i].bool()].tolist()),
                    tuple(b["completion_ids"][i][real].tolist()),
                    tuple(int(m) for m in (b["completion_mask"][i] * b["tool_mask"][i])[real].tolist()),
                )
            )
    env_rows = [
        (
            tuple(ep.token_ids[: ep.prompt_len]),
            tuple(ep.token_ids[ep.prompt_len :]),
            tuple(ep.loss_mask[ep.prompt_len :]),
        )
        for ep in episodes
    ]
    assert sorted(trained_rows) == sorted(env_rows)
    assert any(0 in m for _, _, m in env_rows)  # env tokens inside completions, masked out of the loss
    assert any(not torch.equal(v.detach(), before[k]) for k, v in model.named_parameters())
    assert server.wait_open_envs(0) == 0
