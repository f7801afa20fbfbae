"""Training a shared policy on a multi-agent env (``agent_gym.MULTIAGENT_IDS``, docs/multiagent.md).

One policy plays every seat. Each agent's turns in a team episode form one trajectory: the seat's
own ``Episode`` (its own context ids, its own loss mask, its own step rewards, the team's outcome on
its last step), so the update trains each agent on exactly the tokens it sampled, with its own
context as the prompt. A team episode of N agents gives N trajectories. Groups (GRPO/RLOO) are per
task *and* seat: the ``group_size`` rollouts of one task give agent ``a``'s trajectories their own
group, so an agent's turns are compared with the same seat's on the same task, never with a
teammate's (their roles differ).

The trainer is ``trainers.trainer.Trainer`` given the rollout source :class:`TeamRollout`: its envs
are a list of ``ParallelEnv``s instead of a ``ToolVectorEnv``, its rollout is
:func:`collect_multiagent` (every live agent of every env generates in one backend call per cycle),
and it evaluates greedy team episodes. ``trainers.compose.choose_parts`` picks it when ``env_id`` is
a multi-agent id; nothing else in a config changes (configs/factchain_team_grpo.yaml). The trajectory
records carry each trajectory's ``agent`` (an ``AgentTrajectory`` field).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from agent_gym.factory import EnvFactory
from agent_gym.registration import make_multiagent
from trainers import scale
from trainers.backends.base import GenerationBackend, SamplingConfig
from trainers.config import TrainConfig
from trainers.rollout import RolloutTimes, Trajectory, generate, summarize
from trainers.sources import eval_keys


@dataclass
class AgentTrajectory(Trajectory):
    """A ``Trajectory`` that also names the seat that played it."""

    agent: str = ""


class TeamEnvs:
    """``num_envs`` copies of a multi-agent id's ``ParallelEnv``, driven in lockstep by
    :func:`collect_multiagent` (the multi-agent counterpart of ``ToolVectorEnv``)."""

    def __init__(self, env_id: str, num_envs: int, env_kwargs: dict[str, Any]):
        self.envs = [make_multiagent(env_id, parallel=True, **env_kwargs) for _ in range(num_envs)]
        self.possible_agents = list(self.envs[0].possible_agents)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def close(self) -> None:
        for e in self.envs:
            e.close()


@dataclass
class TeamStats:
    """Per team episode: the team's success, its cycles and its delivered messages."""

    success: list[bool] = dataclasses.field(default_factory=list)
    cycles: list[int] = dataclasses.field(default_factory=list)
    messages: list[int] = dataclasses.field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "team/success_rate": float(np.mean(self.success)),
            "team/cycles_mean": float(np.mean(self.cycles)),
            "team/messages_per_episode": float(np.mean(self.messages)),
        }


def collect_multiagent(
    teams: TeamEnvs,
    backend: GenerationBackend,
    task_indices: Sequence[int],
    group_size: int,
    sampling: SamplingConfig,
    seed: int,
) -> tuple[list[AgentTrajectory], RolloutTimes, TeamStats]:
    """One team episode in every env (env ``i`` gets task ``task_indices[i // group_size]``); every
    cycle, the live agents of every env generate in one backend call. Returns one trajectory per
    agent and env (ordered by env, then seat), the timings and the team statistics. Generation seeds
    are a pure function of ``(seed, env, seat, cycle)``."""
    agents = teams.possible_agents
    times = RolloutTimes()
    t0 = time.perf_counter()
    obs = []
    stops: dict[tuple[int, str], list[str]] = {}  # each seat's next stop strings (a scaffolded seat's)
    for i, env in enumerate(teams.envs):
        o, infos = env.reset(seed=seed + i, options={"task_index": int(task_indices[i // group_size])})
        obs.append(o)
        stops.update({(i, a): list(infos[a].get("stop_strings") or []) for a in infos})
    times.env_s += time.perf_counter() - t0
    stop = list(infos[agents[0]]["stop_token_ids"])
    sampling = SamplingConfig(**{**sampling.__dict__, "stop_token_ids": stop})
    lps: dict[tuple[int, str], dict[int, float]] = {(i, a): {} for i in range(teams.num_envs) for a in agents}
    done: dict[tuple[int, str], AgentTrajectory] = {}
    stats = TeamStats()
    cycle = 0
    while any(env.agents for env in teams.envs):
        active = [(i, a) for i, env in enumerate(teams.envs) for a in env.agents]
        prompts = [obs[i][a]["input_ids"].tolist() for i, a in active]
        seeds = [
            int(np.random.SeedSequence([seed, i, agents.index(a), cycle]).generate_state(1)[0] & 0x7FFFFFFF)
            for i, a in active
        ]
        t0 = time.perf_counter()
        gens = generate(backend, prompts, sampling, seeds, [stops.get(k, []) for k in active])
        times.generate_s += time.perf_counter() - t0
        actions: dict[int, dict[str, np.ndarray]] = {}
        for (i, a), p, g in zip(active, prompts, gens):
            actions.setdefault(i, {})[a] = np.asarray(g.token_ids, dtype=np.int64)
            times.generated_tokens += len(g.token_ids)
            for k, lp in enumerate(g.logprobs):
                lps[(i, a)][len(p) + k] = float(lp)
        t0 = time.perf_counter()
        for i, acts in actions.items():
            env = teams.envs[i]
            obs[i], _, term, trunc, infos = env.step(acts)
            stops.update({(i, a): list(infos[a].get("stop_strings") or []) for a in infos})
            for a in acts:
                if term[a] or trunc[a]:
                    ep = infos[a]["trajectory"]
                    slp = [0.0] * len(ep.token_ids)
                    for pos, lp in lps[(i, a)].items():
                        slp[pos] = lp
                    done[(i, a)] = AgentTrajectory(ep, slp, (i // group_size) * len(agents) + agents.index(a), a)
            if not env.agents:
                stats.success.append(any(done[(i, a)].episode.success for a in agents))
                stats.cycles.append(env.cycle)
                stats.messages.append(len(env.mailbox.log))
        times.env_s += time.perf_counter() - t0
        cycle += 1
    return [done[(i, a)] for i in range(teams.num_envs) for a in agents], times, stats


class TeamRollout:
    """The rollout source of a multi-agent id (``trainers.sources.RolloutSource``): ``TeamEnvs`` of
    ``batch_size`` team envs driven by :func:`collect_multiagent`, greedy team episodes to evaluate."""

    learner_backend: str | None = None

    def __init__(self, cfg: TrainConfig, *, env_factory: Any, policy: Any, backend: GenerationBackend, parallel: Any):
        self.cfg, self.backend = cfg, backend
        env_kwargs = env_factory.kwargs()
        self.envs = TeamEnvs(cfg.rollout.env_id, cfg.rollout.batch_size, env_kwargs)
        self.eval_envs = TeamEnvs(cfg.rollout.env_id, cfg.eval.tasks, {**env_kwargs, **cfg.eval.env_kwargs})
        self.eval_set_envs = {
            name: TeamEnvs(cfg.rollout.env_id, cfg.eval.tasks, {**env_kwargs, **kw})
            for name, kw in cfg.eval.sets.items()
        }
        self.num_tasks = EnvFactory.num_tasks(self.envs)
        self._team_stats = TeamStats()

    def collect(
        self, task_indices: Sequence[int], group_size: int, sampling: SamplingConfig, seed: int, offset: int = 0
    ) -> tuple[list[Trajectory], RolloutTimes]:
        if offset:
            raise ValueError("TeamRollout collects whole iterations (offset 0)")
        trajs, times, self._team_stats = collect_multiagent(
            self.envs, self.backend, task_indices, group_size, sampling, seed
        )
        return list(trajs), times

    def sync_weights(self, policy: Any) -> None:
        """The HF backend samples from the policy module itself; another engine gets the weights."""
        if self.cfg.rollout.backend != "hf":
            self.backend.load_weights(scale.inference_state_dict(policy))

    def metrics(self) -> dict[str, float]:
        """The team statistics of the last ``collect`` (``team/*``)."""
        return self._team_stats.metrics()

    def evaluate(self, sampling: SamplingConfig, num_tasks: int, seed: int) -> dict[str, float]:
        """Greedy team episodes on the first ``num_tasks`` tasks of the eval env and of each eval set."""
        greedy = dataclasses.replace(sampling, temperature=0.0)
        out: dict[str, float] = {}
        for prefix, teams in [("eval/", self.eval_envs)] + [(f"eval/{n}/", e) for n, e in self.eval_set_envs.items()]:
            trajs, _, stats = collect_multiagent(teams, self.backend, list(range(num_tasks)), 1, greedy, seed)
            out.update(eval_keys({**summarize(trajs), **stats.metrics()}, prefix))
        return out

    def close(self) -> None:
        for teams in [self.envs, self.eval_envs, *self.eval_set_envs.values()]:
            teams.close()


__all__ = ["AgentTrajectory", "TeamEnvs", "TeamRollout", "TeamStats", "collect_multiagent"]
