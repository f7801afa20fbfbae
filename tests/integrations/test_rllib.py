"""RLlib integration (agent_gym.integrations.rllib).

The wrapper tests need only gymnasium and run in the core venv. The tests marked ``rllib`` run
real RLlib PPO on a local Ray cluster and need ``.venv-rllib`` (``make test-rllib``); the core run
deselects them (``-m "not rllib"``).
"""

import json
import math
import os

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401
from agent_gym.integrations.rllib import TokenStepEnv, answer_vocab, check_env_config, make_token_step_env
from envs.factchain import oracle_turns

EASY = {
    "num_hops": 1,
    "num_entities": 4,
    "num_relations": 1,
    "tools_in_prompt": False,
    "rewards": {"no_action": -0.1, "format": 0.1},
}


def _base():
    return gym.make("AgentR1/FactChain-v0", **EASY)


def _play(env: TokenStepEnv, turns_ids):
    """Step ``env`` one token at a time through ``turns_ids``; return (rewards, last step)."""
    index = {int(t): k for k, t in enumerate(env.action_ids)}
    rewards, last = [], None
    for ids in turns_ids:
        for t in ids:
            last = env.step(index[int(t)])
            rewards.append(last[1])
    return rewards, last


def test_token_steps_reproduce_the_whole_turn_episode():
    """Token by token through the wrapper gives the same ids, rewards and Episode as whole turns
    on the ToolEnv; intermediate steps have reward 0 and an empty info."""
    ref = _base()
    ref.reset(seed=3)
    task = ref.unwrapped.task
    turns = [ref.unwrapped.encode_turn(t) for t in oracle_turns(task)]
    ref_rewards = []
    for ids in turns:
        obs_ref, r, *_, info_ref = ref.step(ids)
        ref_rewards.append(r)

    env = TokenStepEnv(_base(), max_turn_tokens=64)
    obs, _ = env.reset(seed=3)
    assert env.unwrapped.task == task and env.observation_space.contains(obs)
    n0 = int(obs["length"])
    obs1, r1, term1, trunc1, info1 = env.step(int(turns[0][0]))
    assert (r1, term1, trunc1, info1) == (0.0, False, False, {})
    assert int(obs1["length"]) == n0 + 1 and obs1["input_ids"][n0] == turns[0][0]
    index = {int(t): k for k, t in enumerate(env.action_ids)}
    rewards = [r1]
    for t in turns[0][1:]:
        step = env.step(index[int(t)])
        rewards.append(step[1])
    rest, (obs, r, term, trunc, info) = _play(env, turns[1:])
    rewards += rest
    assert term and not trunc and info["trajectory"].success
    assert sum(rewards) == pytest.approx(sum(ref_rewards)) == pytest.approx(1.1)
    turn_ends = set(np.cumsum([len(t) for t in turns]) - 1)
    assert all(r == 0 for k, r in enumerate(rewards) if k not in turn_ends)  # a turn's reward is on its last token
    assert [rewards[k] for k in sorted(turn_ends)] == pytest.approx(ref_rewards)
    n = int(obs["length"])
    assert np.array_equal(obs["input_ids"][:n], obs_ref["input_ids"]) and env.observation_space.contains(obs)
    assert info["trajectory"].token_ids == info_ref["trajectory"].token_ids
    assert info["trajectory"].loss_mask == info_ref["trajectory"].loss_mask


def test_turn_cap_closes_the_turn_with_an_env_token():
    env = TokenStepEnv(_base(), max_turn_tokens=3)
    obs, _ = env.reset(seed=0)
    word = env.unwrapped.tokenizer.encode("hello", add_special_tokens=False)[0]
    steps = [env.step(word) for _ in range(3)]
    assert [s[4] == {} for s in steps] == [True, True, False]
    info = steps[-1][4]
    assert info["closed_by_env"] and info["reward_components"] == {"no_action": -0.1}
    assert steps[-1][1] == pytest.approx(-0.1)


def test_context_budget_is_respected_and_the_observation_fits():
    """A turn that reaches the context budget is handed to the env, which ends the episode; the
    observation (budget + the env's closing token) still fits the Box."""
    base = gym.make("AgentR1/FactChain-v0", max_context_tokens=160, **EASY)
    env = TokenStepEnv(base, max_turn_tokens=1000)
    obs, _ = env.reset(seed=0)
    word = env.unwrapped.tokenizer.encode("hello", add_special_tokens=False)[0]
    done, steps = False, 0
    while not done:
        obs, r, term, trunc, info = env.step(word)
        done, steps = term or trunc, steps + 1
    assert trunc and info["truncation_reason"] == "context" and steps == 160 - int(info["trajectory"].prompt_len)
    assert int(obs["length"]) == 161 and env.observation_space.contains(obs)


def test_answer_vocab_and_bad_inputs():
    env = make_token_step_env({"env_id": "AgentR1/FactChain-v0", "env_kwargs": EASY, "vocab": "answer"})
    tok = env.unwrapped.tokenizer
    assert env.action_space.n == len(env.action_ids) < 30
    env.reset(seed=1)
    answer = env.unwrapped.task["answer"]
    ids = env.unwrapped.encode_turn(f"<answer>{answer}</answer>")
    _, (_, r, term, _, info) = _play(env, [ids])
    assert term and info["trajectory"].success and r == pytest.approx(1.1)
    assert set(answer_vocab(env)) == set(env.action_ids.tolist())
    two = make_token_step_env(
        {"env_id": "AgentR1/FactChain-v0", "env_kwargs": {**EASY, "num_kbs": 2}, "vocab": "answer"}
    )
    second_kb_ids = {i for name in two.unwrapped.kb_at(1)[0] for i in tok.encode(name, add_special_tokens=False)}
    assert second_kb_ids <= set(two.action_ids.tolist()) and not second_kb_ids <= set(env.action_ids.tolist())
    with pytest.raises(ValueError, match="num_kbs=5000 is more than 1000"):
        make_token_step_env(
            {"env_id": "AgentR1/FactChain-v0", "env_kwargs": {**EASY, "num_kbs": 5000}, "vocab": "answer"}
        )
    with pytest.raises(ValueError, match="one integer"):
        env.step(len(env.action_ids))
    with pytest.raises(ValueError, match="one integer"):
        env.step(1.0)
    with pytest.raises(ValueError, match="stop token"):
        TokenStepEnv(_base(), action_ids=[5, 6])
    with pytest.raises(ValueError, match="vocab_size"):
        TokenStepEnv(_base(), action_ids=[2, 10**6])
    with pytest.raises(ValueError, match="max_turn_tokens"):
        TokenStepEnv(_base(), max_turn_tokens=0)
    with pytest.raises(ValueError, match="unknown env_config"):
        check_env_config({"env_id": "AgentR1/FactChain-v0", "vocabulary": "answer"})
    with pytest.raises(ValueError, match="env_id"):
        make_token_step_env({})
    with pytest.raises(ValueError, match="one of"):
        make_token_step_env({"env_id": "AgentR1/FactChain-v0", "vocab": "tiny"})


# -- real RLlib PPO on a local Ray cluster (.venv-rllib) ------------------------------------------

FRAGMENT = 64


@pytest.fixture(scope="module")
def ppo_run():
    """One local Ray cluster for the module: a PPO algo with 2 env runner actors, its weights
    before training, and the results of 2 iterations. Shut down at the end. (Kept cheap: each
    env runner actor start imports torch and RLlib, tens of seconds on a loaded machine.)"""
    pytest.importorskip("ray.rllib", reason="needs ray[rllib]: run `make test-rllib` (.venv-rllib)")
    import ray
    import torch

    from agent_gym.integrations.rllib import build_ppo_config, init_ray

    torch.set_num_threads(1)
    # 4 logical CPUs (not cores): the fixture's 2 runners hold one each while the CLI test's
    # algo starts 2 more on the same cluster; with 2 its actors would wait forever.
    assert init_ray(num_cpus=4)
    algo = None
    try:
        config = build_ppo_config(
            "AgentR1/FactChain-v0",
            EASY,
            max_turn_tokens=8,
            num_env_runners=2,
            rollout_fragment_length=FRAGMENT,
            num_epochs=2,
            minibatch_size=64,
            seed=0,
        )
        algo = config.build_algo()
        before = algo.learner_group.get_weights()
        results = [algo.train() for _ in range(2)]
        yield algo, before, results
    finally:
        if algo is not None:
            algo.stop()
        ray.shutdown()
    assert not ray.is_initialized()


@pytest.mark.rllib
@pytest.mark.timeout(900)
def test_ppo_reports_finite_episode_metrics(ppo_run):
    _, _, results = ppo_run
    for res in results:
        runners = res["env_runners"]
        assert runners["num_episodes"] >= 1
        ret, length = runners["episode_return_mean"], runners["episode_len_mean"]
        assert math.isfinite(ret) and math.isfinite(length)
        # An episode is at least one token and at most 3 turns of 8 tokens (max_turns = hops + 2).
        assert 1 <= length <= 24
        # Every turn pays no_action (-0.1) unless it calls or answers; an answer pays at most 1.1.
        assert -0.3 - 1e-6 <= ret <= 1.1 + 1e-6
        stats = runners["agent_gym"]
        assert 0 <= stats["success"] <= 1 and 1 <= stats["turns"] <= 3
    assert results[-1]["env_runners"]["num_env_steps_sampled_lifetime"] == 2 * 2 * FRAGMENT


@pytest.mark.rllib
@pytest.mark.timeout(900)
def test_ppo_changed_the_weights_and_synced_the_runners(ppo_run):
    algo, before, _ = ppo_run
    from ray.rllib.core import DEFAULT_MODULE_ID

    after = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    before = before[DEFAULT_MODULE_ID]
    assert set(after) == set(before)
    changed = [k for k in after if not np.allclose(np.asarray(after[k]), np.asarray(before[k]))]
    assert "pi.weight" in changed and "vf.weight" in changed and "embed.weight" in changed
    # The 2 env runners are Ray actors (other processes) holding the trained weights.
    assert algo.env_runner_group.num_remote_env_runners() == 2
    remote = algo.env_runner_group.foreach_env_runner(
        lambda r: (os.getpid(), {k: v.detach().cpu().numpy() for k, v in r.module.state_dict().items()}),
        local_env_runner=False,
    )
    pids = {pid for pid, _ in remote}
    assert len(pids) == 2 and os.getpid() not in pids
    for _, state in remote:
        assert np.allclose(state["pi.weight"], np.asarray(after["pi.weight"]))


@pytest.mark.rllib
@pytest.mark.timeout(900)
def test_rllib_episodes_are_the_env_tokens(ppo_run):
    """Token-exact through RLlib: an episode sampled by an env runner took, as its actions, exactly
    the ids the ToolEnv recorded under its loss mask, and its rewards add up to the Episode's."""
    algo, _, _ = ppo_run

    def sample(runner):
        eps = runner.sample(num_episodes=2, random_actions=False)
        out = []
        for ep in eps:
            if not ep.is_done:
                continue
            info = ep.get_infos(-1)
            traj = info["trajectory"]
            out.append(
                (
                    np.asarray(ep.get_actions()).tolist(),
                    float(np.sum(ep.get_rewards())),
                    traj.token_ids,
                    traj.loss_mask,
                    traj.reward,
                )
            )
        return out

    env = make_token_step_env({"env_id": "AgentR1/FactChain-v0", "env_kwargs": EASY, "max_turn_tokens": 8})
    episodes = [
        e for per_runner in algo.env_runner_group.foreach_env_runner(sample, local_env_runner=False) for e in per_runner
    ]
    assert episodes
    for actions, ret, token_ids, loss_mask, env_return in episodes:
        agent_ids = [t for t, m in zip(token_ids, loss_mask) if m]
        assert [int(env.action_ids[a]) for a in actions] == agent_ids
        assert ret == pytest.approx(env_return)


@pytest.mark.rllib
@pytest.mark.timeout(900)
def test_cli_runs_one_iteration_and_rejects_bad_arguments(ppo_run, tmp_path, capsys):
    """The CLI on the cluster the fixture started (it starts its own when none is up)."""
    from agent_gym.integrations.rllib import main

    out = tmp_path / "rllib.jsonl"
    assert (
        main(
            [
                "--env",
                "AgentR1/FactChain-v0",
                "--env-kwargs",
                json.dumps(EASY),
                "--iterations",
                "1",
                "--max-turn-tokens",
                "8",
                "--rollout-fragment-length",
                "32",
                "--num-epochs",
                "1",
                "--vocab",
                "answer",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (line,) = out.read_text().splitlines()
    s = json.loads(line)
    assert s["iteration"] == 1 and math.isfinite(s["episode_return_mean"]) and math.isfinite(s["episode_len_mean"])
    with pytest.raises(SystemExit):
        main(["--env-kwargs", "{num_hops: 1}", "--iterations", "1"])
    assert "not valid JSON" in capsys.readouterr().err
    with pytest.raises(ValueError, match="num_env_runners"):
        main(["--num-env-runners", "0", "--iterations", "1"])
