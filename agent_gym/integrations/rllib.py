"""RLlib PPO (new API stack) on a registered ``AgentR1/...`` id, one token per RLlib step.

    python -m agent_gym.integrations.rllib --env AgentR1/FactChain-v0 --iterations 5

RLlib's new API stack samples one action per env step from a fixed-shape space, so the
token-in/token-out ``ToolEnv`` (a whole turn per step, ``Sequence`` spaces) is seen through
:class:`TokenStepEnv`: each RLlib action is one token id; the wrapper buffers the tokens of the
current turn and steps the ``ToolEnv`` with the whole turn when the policy emits a stop token
(or the turn reaches ``max_turn_tokens``, or the context budget is full). The observation is the
context so far (the env's ids followed by the turn's buffered ids), right-padded to a fixed
``Box(int64)``, plus its ``length``. Why one token per step and not one turn per step:
docs/integrations.md ("RLlib").

The policy is :class:`agent_gym.integrations.rllib_module.TokenTransformerModule` (token and
position embeddings and one transformer layer over the last ids of the context, with policy and
value heads), trained by RLlib's own PPO with its
env runners as Ray actors on a local Ray cluster. This module imports gymnasium and numpy at
module level only; ray and torch are imported by the functions that need them, so the wrapper
works (and is tested) without RLlib installed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import agent_gym  # noqa: F401  (registers the AgentR1/... ids, in the driver and in each env runner)
from agent_gym.factory import EnvFactory
from agent_gym.tokenizer import pad_token_id
from agent_gym.wrappers import tool_env_of

RLLIB_ENV_NAME = "agent_gym_token_step"
"""The name :func:`build_ppo_config` registers :func:`make_token_step_env` under with Ray Tune."""

ENV_CONFIG_KEYS = ("env_id", "env_kwargs", "max_turn_tokens", "vocab")
VOCABS = ("full", "answer")


class TokenStepEnv(gym.Wrapper):
    """One token per step over a ``ToolEnv``.

    Observation ``Dict(input_ids=Box(int64, (max_context_tokens + 1,)), length=Box(int64, ()))``:
    the context (the env's ids, then the ids of the turn being written) right-padded with
    ``pad_id``. The ``+ 1``: an action that exactly fills the context budget without a stop token is
    closed with the env's end-of-turn token, one past the budget.

    Action ``Discrete(len(action_ids))``: index ``k`` is token ``action_ids[k]``; by default every id
    of the env's vocabulary (``Discrete(vocab_size)``, index = id). A restricted list (for example
    :func:`answer_vocab`) makes a smaller problem for an untrained policy; the ids are still the
    env's own, appended verbatim.

    Reward: the ``ToolEnv``'s step reward on the step that ends a turn, 0 on the others, so an
    episode's return is the ``ToolEnv`` episode's return. ``info`` is the ``ToolEnv``'s step info
    on a turn's last step (``trajectory`` included at the episode's end), ``{}`` on the others.
    """

    def __init__(
        self, env: gym.Env, max_turn_tokens: int = 32, action_ids: list[int] | None = None, pad_id: int | None = None
    ):
        super().__init__(env)
        self.tool_env = te = tool_env_of(env)
        if (
            not isinstance(max_turn_tokens, (int, np.integer))
            or isinstance(max_turn_tokens, bool)
            or max_turn_tokens <= 0
        ):
            raise ValueError(f"max_turn_tokens must be a positive integer, got {max_turn_tokens!r}")
        self.max_turn_tokens = int(max_turn_tokens)
        v = te.vocab_size
        if action_ids is None:
            self.action_ids = np.arange(v, dtype=np.int64)
        else:
            ids = np.asarray(action_ids)
            if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"action_ids must be a non-empty 1-D list of integer token ids, got {action_ids!r}")
            if ids.min() < 0 or ids.max() >= v:
                raise ValueError(
                    f"action_ids must lie in [0, {v}) (the env's vocab_size), got min {ids.min()}, max {ids.max()}"
                )
            if len(set(ids.tolist())) != ids.size:
                raise ValueError("action_ids holds the same id twice; each action must be a distinct token")
            if not set(ids.tolist()) & set(te.stop_token_ids):
                raise ValueError(
                    f"action_ids must include a stop token ({te.stop_token_ids}) so that the policy can end "
                    f"a turn by itself"
                )
            self.action_ids = ids.astype(np.int64)
        tok = te.tokenizer
        self.pad_id = int(pad_id) if pad_id is not None else pad_token_id(tok, default=0)
        self.max_len = te.max_context_tokens + 1
        self.observation_space = spaces.Dict(
            {
                "input_ids": spaces.Box(0, v - 1, shape=(self.max_len,), dtype=np.int64),
                "length": spaces.Box(0, self.max_len, shape=(), dtype=np.int64),
            }
        )
        self.action_space = spaces.Discrete(len(self.action_ids))
        self._stop = frozenset(te.stop_token_ids)
        self._context: list[int] = []
        self._turn: list[int] = []

    def _obs(self) -> dict[str, np.ndarray]:
        ids = self._context + self._turn
        out = np.full(self.max_len, self.pad_id, dtype=np.int64)
        out[: len(ids)] = ids
        return {"input_ids": out, "length": np.asarray(len(ids), dtype=np.int64)}

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._context, self._turn = obs["input_ids"].tolist(), []
        return self._obs(), info

    def step(self, action: Any):
        a = np.asarray(action)
        if a.ndim != 0 or not np.issubdtype(a.dtype, np.integer) or not 0 <= int(a) < len(self.action_ids):
            raise ValueError(
                f"action must be one integer in [0, {len(self.action_ids)}) (an index into action_ids), got {action!r}"
            )
        token = int(self.action_ids[int(a)])
        self._turn.append(token)
        room = self.tool_env.max_context_tokens - len(self._context)
        if token not in self._stop and len(self._turn) < self.max_turn_tokens and len(self._turn) < room:
            return self._obs(), 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(self._turn, dtype=np.int64))
        self._context, self._turn = obs["input_ids"].tolist(), []
        return self._obs(), float(reward), terminated, truncated, info


_ANSWER_VOCAB_MAX_KBS = 1000
"""``answer_vocab`` builds every KB to list its names (~0.6 ms each): beyond this it refuses."""


def answer_vocab(tool_env: Any) -> list[int]:
    """The smallest vocabulary that can answer a FactChain question: the ids of ``<answer>``,
    ``</answer>``, every entity name of the env's knowledge bases, and the stop tokens. An untrained
    policy over the full vocabulary almost never writes ``<answer>...</answer>`` (docs/results.md)."""
    base = getattr(tool_env, "unwrapped", tool_env)
    kb_at = getattr(base, "kb_at", None)
    if kb_at is None:
        raise ValueError(
            f"vocab='answer' needs an env with entity names (FactChain's `kb_at`); "
            f"{type(base).__name__} has none: use vocab='full'"
        )
    if base.num_kbs > _ANSWER_VOCAB_MAX_KBS:
        raise ValueError(
            f"vocab='answer' lists the names of every KB of the env: num_kbs={base.num_kbs} is more than "
            f"{_ANSWER_VOCAB_MAX_KBS}; lower num_kbs or use vocab='full'"
        )
    names = sorted({e for i in range(base.num_kbs) for e in kb_at(i)[0]})
    tok = base.tokenizer
    ids: set[int] = set(base.stop_token_ids)
    for text in ["<answer>", "</answer>"] + names:
        ids.update(tok.encode(text, add_special_tokens=False))
    return sorted(ids)


def make_token_step_env(env_config: dict[str, Any]) -> TokenStepEnv:
    """The env creator RLlib calls in each env runner: ``EnvFactory(env_id, env_kwargs).make()`` wrapped in
    :class:`TokenStepEnv`. ``env_config`` keys: ``env_id`` (required), ``env_kwargs`` (dict),
    ``max_turn_tokens`` (default 32), ``vocab`` (``"full"``, the default, or ``"answer"``).
    RLlib may add its own keys (``num_envs``) to the context; those are ignored."""
    cfg = dict(env_config)
    if "env_id" not in cfg:
        raise ValueError(f"env_config needs 'env_id' (e.g. 'AgentR1/FactChain-v0'); got keys {sorted(cfg)}")
    vocab = cfg.get("vocab", "full")
    if vocab not in VOCABS:
        raise ValueError(f"env_config['vocab'] must be one of {VOCABS}, got {vocab!r}")
    env = EnvFactory(cfg["env_id"], cfg.get("env_kwargs")).make()
    ids = answer_vocab(env) if vocab == "answer" else None
    return TokenStepEnv(env, max_turn_tokens=int(cfg.get("max_turn_tokens", 32)), action_ids=ids)


def check_env_config(env_config: dict[str, Any]) -> None:
    """Fail early (in the driver, not in a Ray actor) on a bad env config: unknown keys, an
    unregistered id, bad env kwargs; builds one env and closes it."""
    unknown = sorted(set(env_config) - set(ENV_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown env_config key(s) {unknown}; valid keys: {list(ENV_CONFIG_KEYS)}")
    make_token_step_env(env_config).close()


def build_ppo_config(
    env_id: str = "AgentR1/FactChain-v0",
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_turn_tokens: int = 32,
    vocab: str = "full",
    num_env_runners: int = 2,
    rollout_fragment_length: int = 128,
    num_epochs: int = 4,
    minibatch_size: int = 128,
    lr: float = 3e-4,
    gamma: float = 1.0,
    lambda_: float = 0.95,
    entropy_coeff: float = 0.01,
    embed_dim: int = 32,
    window: int = 128,
    seed: int = 0,
):
    """RLlib's ``PPOConfig`` (new API stack) for PPO on ``env_id`` through :class:`TokenStepEnv`,
    with :class:`~agent_gym.integrations.rllib_module.TokenTransformerModule` as the policy and value net,
    ``num_env_runners`` env runners (Ray actors, one env each) and the learner in the driver.
    The train batch is one fragment per runner per iteration. ``gamma`` defaults to 1: the reward
    comes at the end of a turn and every token of the turn should share it."""
    from ray.rllib.algorithms.ppo import PPOConfig  # optional: ray[rllib] (extra rllib)
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # optional: ray[rllib] (extra rllib)
    from ray.tune.registry import register_env  # optional: ray[rllib] (extra rllib)

    from agent_gym.integrations.rllib_module import (  # optional: torch and ray[rllib] (extras train, rllib)
        EpisodeStatsCallback,
        TokenTransformerModule,
    )

    if num_env_runners < 1:
        raise ValueError(f"num_env_runners must be at least 1 (the env runners are Ray actors), got {num_env_runners}")
    env_config = {
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs or {}),
        "max_turn_tokens": max_turn_tokens,
        "vocab": vocab,
    }
    check_env_config(env_config)
    register_env(RLLIB_ENV_NAME, make_token_step_env)
    batch = rollout_fragment_length * num_env_runners
    return (
        PPOConfig()
        .environment(RLLIB_ENV_NAME, env_config=env_config)
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=1,
            rollout_fragment_length=rollout_fragment_length,
            num_cpus_per_env_runner=1,
        )
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=batch,
            minibatch_size=min(minibatch_size, batch),
            num_epochs=num_epochs,
            lr=lr,
            gamma=gamma,
            lambda_=lambda_,
            entropy_coeff=entropy_coeff,
        )
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=TokenTransformerModule, model_config={"embed_dim": embed_dim, "window": window}
            )
        )
        .callbacks(EpisodeStatsCallback)
        .debugging(seed=seed)
    )


SUMMARY_KEYS = ("episode_return_mean", "episode_len_mean", "num_episodes", "num_env_steps_sampled_lifetime")


def summarize(result: dict[str, Any]) -> dict[str, float]:
    """The scalars of one ``algo.train()`` result that the CLI prints: RLlib's episode return and
    length (tokens per episode) means, the episodes and env steps, and the ``agent_gym/*`` metrics
    that :class:`~agent_gym.integrations.rllib_module.EpisodeStatsCallback` logs."""
    runners = result.get("env_runners", {})
    out = {k: float(runners[k]) for k in SUMMARY_KEYS if k in runners}
    for k, v in runners.get("agent_gym", {}).items():
        out[f"agent_gym/{k}"] = float(v)
    out["time_this_iter_s"] = float(result.get("time_this_iter_s", math.nan))
    return out


def init_ray(num_cpus: int = 2) -> bool:
    """Start a small local Ray cluster unless one is up (no dashboard, a 256 MB object store);
    returns whether it started one (then the caller shuts it down)."""
    import ray  # optional: ray (extra rllib)

    if ray.is_initialized():
        return False
    ray.init(  # "local": our own cluster, never another process's (trainers/ray_rollout.py says why)
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        log_to_driver=False,
    )
    return True


def train(
    iterations: int, max_minutes: float | None = None, log=print, torch_threads: int | None = 1, **config_kwargs: Any
) -> list[dict[str, float]]:
    """Run ``iterations`` PPO iterations (or stop after ``max_minutes``); returns one summary per
    iteration. Starts (and shuts down) a local Ray cluster unless one is already up.
    ``torch_threads`` sets this process's torch threads (the learner runs here; None leaves
    torch's default): 1 is several times faster for this small model on a busy 2-core CPU. The
    env runners are Ray actors with one CPU each, where Ray sets one thread."""
    import ray  # optional: ray (extra rllib)
    import torch  # optional: torch (extra train)

    if torch_threads is not None:
        torch.set_num_threads(torch_threads)

    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    started = init_ray(num_cpus=max(2, int(config_kwargs.get("num_env_runners", 2))))
    algo = None
    history = []
    try:
        algo = build_ppo_config(**config_kwargs).build_algo()
        t0 = time.monotonic()
        for i in range(iterations):
            s = summarize(algo.train())
            s["iteration"] = i + 1
            s["elapsed_s"] = time.monotonic() - t0
            history.append(s)
            log(json.dumps(s))
            if max_minutes is not None and s["elapsed_s"] > 60 * max_minutes:
                break
    finally:
        if algo is not None:
            algo.stop()
        if started:
            ray.shutdown()
    return history


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_gym.integrations.rllib", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="AgentR1/FactChain-v0", help="a registered id")
    p.add_argument("--env-kwargs", default="{}", help="JSON object of keyword arguments for gym.make")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--max-minutes", type=float, default=None, help="stop after this much wall time")
    p.add_argument(
        "--vocab",
        choices=VOCABS,
        default="full",
        help="full: every token id; answer: <answer>, </answer>, entity names and the stop token (FactChain)",
    )
    p.add_argument("--max-turn-tokens", type=int, default=32)
    p.add_argument("--num-env-runners", type=int, default=2)
    p.add_argument("--rollout-fragment-length", type=int, default=128)
    p.add_argument("--num-epochs", type=int, default=4)
    p.add_argument("--minibatch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--entropy-coeff", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the per-iteration summaries here (JSON lines)")
    args = p.parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        p.error(f"--env-kwargs is not valid JSON ({e}); example: '{{\"num_hops\": 1}}'")
    if not isinstance(env_kwargs, dict):
        p.error(f"--env-kwargs must be a JSON object, got {args.env_kwargs!r}")
    history = train(
        args.iterations,
        max_minutes=args.max_minutes,
        env_id=args.env,
        env_kwargs=env_kwargs,
        vocab=args.vocab,
        max_turn_tokens=args.max_turn_tokens,
        num_env_runners=args.num_env_runners,
        rollout_fragment_length=args.rollout_fragment_length,
        num_epochs=args.num_epochs,
        minibatch_size=args.minibatch_size,
        lr=args.lr,
        entropy_coeff=args.entropy_coeff,
        seed=args.seed,
    )
    if args.out:
        with open(args.out, "w") as f:
            for s in history:
                f.write(json.dumps(s) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
