"""Rollout: drive a ``ToolVectorEnv`` in lockstep with a generation backend.

Each turn, the prompts of the still-active envs (their full ``input_ids``) go to the backend in
one batch; the sampled ids go back to the envs verbatim. The env builds the loss mask and the
step spans; this module never guesses which tokens were the agent's.

Shapes: B = trajectories in a batch, T = the longest trajectory's length (right padding).
"""

from __future__ import annotations

import inspect
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from agent_gym.episode import Episode
from agent_gym.formats import CALL_IN_TEXT
from agent_gym.vector import ToolVectorEnv
from trainers.algos import place_rewards
from trainers.backends.base import GenerationBackend, SamplingConfig


@dataclass
class Trajectory:
    """One sampled episode: the env's ``Episode`` plus what only the sampler knows."""

    episode: Episode
    """The env's record: token ids, loss mask, spans, step rewards, answer scores, success..."""
    sampler_logprobs: list[float]
    """(T_i,) the backend's log-prob of each agent token, 0 elsewhere."""
    group: int
    """The GRPO/RLOO group: trajectories of one group share a task."""


@dataclass
class RolloutBatch:
    """A padded batch ready for scoring and the update. All tensors are right-padded to T."""

    input_ids: torch.Tensor
    """(B, T) long token ids (padding = pad id)."""
    attention_mask: torch.Tensor
    """(B, T) long, 1 on real tokens."""
    loss_mask: torch.Tensor
    """(B, T) float, 1 on the agent's tokens: the single mask used by every loss term."""
    token_rewards: torch.Tensor
    """(B, T) float, each step's reward on the last token of its action span."""
    sampler_logprobs: torch.Tensor
    """(B, T) float, the backend's log-probs on agent tokens (for the mismatch metric)."""
    group_ids: torch.Tensor
    """(B,) long, the GRPO/RLOO group of each trajectory."""
    old_logprobs: torch.Tensor | None = None
    """(B, T) float, log p_old(token_t | tokens_<t), recomputed by the trainer; 0 at t = 0."""
    ref_logprobs: torch.Tensor | None = None
    """(B, T) float, the same under the frozen reference model."""
    values: torch.Tensor | None = None
    """(B, T) float, V(tokens_<t) from the critic (PPO only)."""
    advantages: torch.Tensor | None = None
    """(B, T) float."""
    returns: torch.Tensor | None = None
    """(B, T) float."""
    behaviour_weights: torch.Tensor | None = None
    """(B, T) float, the truncated proximal/behaviour weights of off-policy tokens
    (``trainers.algos.behaviour_weights``); None: on-policy, no weight."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """Rows ``idx`` of every tensor field (a minibatch)."""
        kw = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return RolloutBatch(**kw)

    def to(self, device: str | torch.device) -> RolloutBatch:
        """Every tensor field on ``device`` (the trainer's, where its models are)."""
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return RolloutBatch(**kw)


def pad_rows(rows: Sequence[Sequence[float]], pad_value: float, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) the rows right-padded with ``pad_value`` to the longest (T); RL batches and SFT both use it."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def build_batch(trajs: Sequence[Trajectory], pad_id: int) -> RolloutBatch:
    eps = [tr.episode for tr in trajs]
    ids = pad_rows([ep.token_ids for ep in eps], pad_id, torch.long)  # (B, T)
    attn = pad_rows([[1] * len(ep.token_ids) for ep in eps], 0, torch.long)  # (B, T)
    mask = pad_rows([ep.loss_mask for ep in eps], 0.0, torch.float32)  # (B, T)
    slp = pad_rows([tr.sampler_logprobs for tr in trajs], 0.0, torch.float32)  # (B, T)
    # A turn whose action was empty has no agent token to carry its reward; it goes to the
    # nearest earlier agent token (the env's penalties for empty turns still count).
    ends, rewards = [], []
    for ep in eps:
        e_row, r_row, carry = [], [], 0.0
        for (s, e), r in zip(ep.step_spans, ep.step_rewards):
            if e > s:
                e_row.append(e - 1)
                r_row.append(r + carry)
                carry = 0.0
            elif e_row:
                r_row[-1] += r
            else:
                carry += r
        ends.append(e_row)
        rewards.append(r_row)
    outcome = torch.zeros(len(eps))
    token_rewards = place_rewards(outcome, mask, rewards, ends)  # (B, T)
    groups = torch.tensor([tr.group for tr in trajs], dtype=torch.long)
    return RolloutBatch(ids, attn, mask, token_rewards, slp, groups)


@dataclass
class RolloutTimes:
    generate_s: float = 0.0
    env_s: float = 0.0
    generated_tokens: int = 0


ENGINE_RESTARTS = "rollout/engine_restarts"


class EngineRestarts:
    """The metric ``rollout/engine_restarts`` of one generation backend: how often it restarted a dead
    engine (``VLLMBackend.restarts``; docs/vllm.md, "A dead engine") since the last ``take()``,
    the first take counting from the backend's start. A backend without an engine to restart
    (no ``restarts`` attribute: the HF backend, ``AsyncVLLMBackend``) gives no metric. Taken once
    per iteration, so the column is per iteration and sums to the run's total, as
    ``rollout/worker_restarts`` does for Ray workers."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.seen = 0

    def count(self) -> int | None:
        """Restarts since the last ``take()``, without taking them; None without a counter."""
        n = getattr(self.backend, "restarts", None)
        return None if n is None else int(n) - self.seen

    def take(self) -> dict[str, float]:
        new = self.count()
        if new is None:
            return {}
        self.seen += new
        return {ENGINE_RESTARTS: float(new)}


def collect(
    vec: ToolVectorEnv,
    backend: GenerationBackend,
    task_indices: Sequence[int],
    group_size: int,
    sampling: SamplingConfig,
    seed: int,
    offset: int = 0,
    reset_options: dict[str, Any] | None = None,
) -> tuple[list[Trajectory], RolloutTimes]:
    """Run one episode in every sub-env. Env ``i`` gets task ``task_indices[i // group_size]``.
    ``reset_options``: more options for every sub-env's reset (``scaffold_drop_prob``).

    Generation seeds are a pure function of ``(seed, env, turn)``, so a rollout is reproducible
    and a resumed run repeats it exactly. ``offset``: the global index of this vector env's first
    sub-env when it runs one slice of a larger batch (a Ray rollout worker, trainers/ray_rollout.py);
    env ``i`` then seeds and groups as env ``offset + i`` of the whole batch would, so the slices
    together give the same trajectories as one in-process call. A multiple of ``group_size``.
    """
    n = vec.num_envs
    if offset % group_size:
        raise ValueError(f"offset {offset} must be a multiple of group_size {group_size} (slices hold whole groups)")
    times = RolloutTimes()
    t0 = time.perf_counter()
    obs, infos = vec.reset(
        seed=[seed + offset + i for i in range(n)],
        options={"task_indices": list(task_indices), "group_size": group_size, **(reset_options or {})},
    )
    times.env_s += time.perf_counter() - t0
    stop = list(infos[0]["stop_token_ids"])
    sampling = SamplingConfig(**{**sampling.__dict__, "stop_token_ids": stop})
    stops = [list(info.get("stop_strings") or []) for info in infos]  # a scaffolded turn's (agent_gym/scaffold.py)
    lps: list[dict[int, float]] = [{} for _ in range(n)]
    done: list[Trajectory | None] = [None] * n
    turn = 0
    while any(d is None for d in done):
        active = [i for i in range(n) if done[i] is None]
        prompts = [obs["input_ids"][i].tolist() for i in active]
        seeds = [
            int(np.random.SeedSequence([seed, offset + i, turn]).generate_state(1)[0] & 0x7FFFFFFF) for i in active
        ]
        t0 = time.perf_counter()
        gens = generate(backend, prompts, sampling, seeds, [stops[i] for i in active])
        times.generate_s += time.perf_counter() - t0
        actions: list[Any] = [None] * n
        for i, p, g in zip(active, prompts, gens):
            actions[i] = np.asarray(g.token_ids, dtype=np.int64)
            times.generated_tokens += len(g.token_ids)
            for k, lp in enumerate(g.logprobs):
                lps[i][len(p) + k] = float(lp)
        t0 = time.perf_counter()
        obs, _, term, trunc, infos = vec.step(actions)
        times.env_s += time.perf_counter() - t0
        for i in active:
            stops[i] = list(infos[i].get("stop_strings") or [])
            if term[i] or trunc[i]:
                ep: Episode = infos[i]["trajectory"]
                slp = [0.0] * len(ep.token_ids)
                for pos, lp in lps[i].items():
                    slp[pos] = lp
                done[i] = Trajectory(ep, slp, (offset + i) // group_size)
        turn += 1
    return [d for d in done if d is not None], times


def generate(
    backend: GenerationBackend,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    seeds: list[int],
    stop_strings: list[list[str]],
) -> list[Any]:
    """``backend.generate``, with each prompt's stop strings when any prompt has some (a scaffolded
    turn). A backend whose ``generate`` takes no ``stop_strings`` is refused then, by name: without
    them it would run past the end of the scaffold's slot."""
    if not any(stop_strings):
        return backend.generate(prompts, sampling, seeds=seeds)
    if not takes_stop_strings(backend):
        raise TypeError(
            f"{type(backend).__name__}.generate takes no stop_strings, which a scaffolded env "
            "(env kwarg scaffold) needs to end the model's part of a turn; use a backend that "
            "stops at strings (HFBackend, VLLMBackend, AsyncVLLMBackend) or an env without a scaffold"
        )
    return backend.generate(prompts, sampling, seeds=seeds, stop_strings=stop_strings)


def takes_stop_strings(backend: Any) -> bool:
    """Whether ``backend.generate`` accepts ``stop_strings``."""
    try:
        params = inspect.signature(backend.generate).parameters
    except (TypeError, ValueError):
        return False
    return "stop_strings" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


LENGTH_CUTS = ("context", "max_turns")
"""The ``Episode.truncation_reason`` values of an episode cut by a length limit (the monitors,
``algorithm.overlong``)."""


def _holds_call(e: Episode) -> bool:
    return e.answer_holds_call or bool(CALL_IN_TEXT.search(e.answer or ""))


def collapse_monitors(eps: Sequence[Episode]) -> dict[str, float]:
    """What goes wrong in agent RL, per batch (docs/metrics.md, "Collapse monitors"): calls per
    episode, calls that repeat an earlier successful call of the same episode (same name and
    arguments), answers given without any successful call, episodes cut by a length limit, and
    the agent's reply length per turn (mean and longest), answers that are empty (an answer
    tag with nothing in it: under a length penalty, the shortest reply a process reward still pays)
    and answers that hold a tool call (a call written into the answer, which an F1 reward pays for the
    words its query shares with the gold): ``Episode.answer_holds_call``, the env's own reading in its
    tool format, or for an episode built elsewhere a shipped format's call (``CALL_IN_TEXT``)."""
    n = len(eps)
    calls = repeats = 0
    no_call_answers = 0
    replies: list[int] = []
    for e in eps:
        seen: set[str] = set()
        ok_calls = 0
        for sigs, statuses in zip(e.step_calls, e.step_call_statuses):
            for sig, status in zip(sigs, statuses):
                calls += 1
                if status != "ok":
                    continue
                ok_calls += 1
                repeats += sig in seen
                seen.add(sig)
        no_call_answers += e.answered and ok_calls == 0
        replies += [end - start for start, end in e.step_spans]
    return {
        "monitor/calls_per_episode": calls / n,
        "monitor/repeated_calls_per_episode": repeats / n,
        "monitor/answer_without_call_rate": no_call_answers / n,
        "monitor/empty_answer_rate": sum(e.answered and not e.answer.strip() for e in eps) / n,
        "monitor/answer_holds_call_rate": sum(e.answered and _holds_call(e) for e in eps) / n,
        "monitor/length_cut_rate": sum(e.truncation_reason in LENGTH_CUTS for e in eps) / n,
        "monitor/reply_tokens_mean": float(np.mean(replies)) if replies else 0.0,
        "monitor/reply_tokens_max": float(max(replies, default=0)),
    }


def summarize(episodes: Sequence[Episode | Trajectory]) -> dict[str, float]:
    """Episode-level metrics of a batch (see docs/metrics.md). ``rollout/<score>`` is the mean of
    each answer score the env reports (``em``, ``f1``...; 0 for an episode without an answer)."""
    eps = [e.episode if isinstance(e, Trajectory) else e for e in episodes]
    n = len(eps)
    out: dict[str, float] = {
        "rollout/reward_mean": float(np.mean([e.reward for e in eps])),
        "rollout/success_rate": float(np.mean([e.success for e in eps])),
        "rollout/answered_rate": float(np.mean([e.answered for e in eps])),
        "rollout/turns_mean": float(np.mean([e.turns for e in eps])),
        "rollout/length_mean": float(np.mean([len(e.token_ids) for e in eps])),
        "rollout/agent_tokens_mean": float(np.mean([sum(e.loss_mask) for e in eps])),
    }
    for key in sorted({k for e in eps for k in e.answer_scores}):
        out[f"rollout/{key}"] = float(np.mean([e.answer_scores.get(key, 0.0) for e in eps]))
    slots = [s for e in eps for s in e.step_slots]
    if slots:  # a scaffolded env (agent_gym/scaffold.py): the share of turns the env scaffolded
        out["rollout/scaffolded_turns"] = sum(s is not None for s in slots) / len(slots)
    reasons = Counter(e.truncation_reason or "answered" for e in eps)
    for r, c in reasons.items():
        out[f"rollout/end_{r}"] = c / n
    statuses: Counter[str] = Counter()
    comps: Counter[str] = Counter()
    for e in eps:
        statuses.update(e.call_statuses)
        comps.update(e.reward_components)
    for s, c in statuses.items():
        out[f"tools/{s}_per_episode"] = c / n
    out.update(collapse_monitors(eps))
    for k, v in comps.items():
        out[f"reward/{k}"] = v / n
    return out
