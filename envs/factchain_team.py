"""AgentR1/FactChainTeam-v0: FactChain questions answered by a team whose members each hold part
of the knowledge base, so that they must pass what they find to each other through messages.

Card
----
Task
    A FactChain question (``envs/factchain.py``: the same KB, the same task ``k`` for the same
    ``kb_seed``, ``split`` and index), shown to every agent. ``num_agents`` agents (default 2,
    ``agent_0``, ``agent_1``...) each hold the facts *about* a part of the entities: the subject
    of hop ``h`` (``path[h]``) is held by ``agent_{h mod num_agents}`` (the first assignment wins
    if an entity comes back in the chain), every other entity by an agent drawn from the task. So
    with 2 hops ``agent_0`` can look up the first hop only and ``agent_1`` the second only, and
    ``agent_1`` cannot know the entity to look up unless ``agent_0`` sends it.
Tools (per agent)
    ``lookup(entity, relation)``: FactChain's lookup on this agent's part of the KB; an entity
    held by a teammate gives ``tool_error`` "... is not in your part of the knowledge base".
    ``send(to, text)`` and ``receive()``: the mailbox of :mod:`agent_gym.multiagent` (a message
    sent in cycle t can be received from cycle t+1 on).
Observation
    Per agent, the token ids of that agent's own conversation (system prompt, question, its turns,
    its tool responses); per-agent loss masks in each agent's ``Episode``.
Reward
    Cooperative: the first ``<answer>`` ends the episode; its exact match with the gold entity
    (``em``, weight 1) is paid to every agent still in the episode on its last step. Other
    components as ``RewardConfig`` (all 0 by default).
Protocol and baselines (120 test tasks, measured by ``tests/envs/test_factchain_team.py``):
    :class:`TeamOracle` (lookup what you hold, send the next entity to its holder as
    ``hop K: Entity``, receive otherwise, answer after the last hop) succeeds on every task in 5
    cycles for 2 hops (1.0 on 120 of 120); a silent team (the same but never sending: it guesses
    an entity when it would have sent) 0.017 (2 of 120, chance is 1/num_entities); random token
    actions 0.0 (0 of 120).
PettingZoo's tests and what random tokens exercise
    With the defaults the env passes PettingZoo's ``api_test`` (AEC), ``parallel_api_test``,
    ``seed_test``, ``parallel_seed_test``, ``max_cycles_test`` and ``render_test``, and runs
    ``performance_benchmark`` (``state_test``, ``save_obs_test`` and ``manual_control_test`` do
    not apply: no global state, no image observations, no keyboard; ``bombardment_test`` fails on
    PettingZoo 1.27's own example env). These tests act with random token ids
    (``action_space.sample()``: a geometric length, mean 4 tokens, ids uniform over the vocabulary).
    Measured over 300 such episodes (4,800 agent turns, defaults): 4,796 turns without a call, 4
    parse errors, no successful call, no message, no answer; every episode ended at
    ``max_cycles``. So random tokens exercise the API contract (spaces, the per-agent dicts,
    agents leaving, seeding, the AEC and Parallel views, rendering), the failed-turn path (nudges,
    ``call_invalid``/``no_action``) and truncation at ``max_cycles``; they cannot reach anything of
    the task: lookups, ``send``/``receive`` and delivery, the team answer and its shared reward, a
    seat leaving on its own. Those are tested with the scripted :class:`TeamOracle` and explicit
    turns (``tests/envs/test_factchain_team.py``) and with the conformance fuzzer, whose actions
    include well-formed calls of every tool, malformed calls and answers
    (``tests/agent_gym/test_conformance_multiagent.py``).
Made with
    ``agent_gym.make_multiagent("AgentR1/FactChainTeam-v0")`` (AEC) or ``(..., parallel=True)``
    (``ParallelEnv``); this module's ``env()`` and ``parallel_env()`` do the same (PettingZoo's
    module convention).
Parameters
    ``num_agents`` (default 2), ``max_cycles`` (default ``3 * num_hops + 2``; it is what ends an
    episode that nobody answers: a seat's ``max_turns`` and ``max_invalid_calls`` default to
    ``max_cycles + 1``), ``system_prompt`` (default: a per-seat prompt that names the seat; a string
    replaces the instructions and is followed by the seat's identity line, "You are agent_0, one of
    a team of 2 agents; your teammate is agent_1."; a dict agent -> prompt is used as given, and a
    configuration whose seats start with identical observations is refused at ``reset``),
    ``max_context_tokens`` (per agent, default 2048: the tool schemas in the prompt are about 500
    tokens), FactChain's ``num_entities``, ``num_relations``, ``num_hops``, ``num_tasks``,
    ``kb_seed``, ``split``, ``question_style``, and every ``MultiAgentToolEnv`` argument
    (tokenizer, limits, rewards, ``tools_in_prompt``, ``render_mode``: ``"ansi"`` or ``"human"``).
Versions
    v0: first release. Changed within v0 (2026-11-25): a given ``system_prompt`` string is followed
    by the seat's identity (it used to replace the per-seat prompt, so both seats started with the
    same ids), indistinguishable seats are refused, and a seat's ``max_invalid_calls`` defaults to
    ``max_cycles + 1`` (was 3: PettingZoo's ``max_cycles_test`` failed with the defaults).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

from agent_gym.multiagent import MultiAgentToolEnv
from agent_gym.tokenizer import load_tokenizer
from agent_gym.tools import ToolResult
from envs.factchain import FactChainEnv, LookupTool, lookup_turn


class PartLookupTool(LookupTool):
    """FactChain's ``lookup``, answering only about the entities this agent holds."""

    def hold(self, entities: set[str]) -> None:
        self.held = set(entities)

    def execute(self, entity: str, relation: str) -> ToolResult:
        e = entity.strip()
        if e in self.entities and e not in self.held:
            return ToolResult(f"{e!r} is not in your part of the knowledge base; a teammate holds it.", ok=False)
        return super().execute(entity, relation)


class FactChainTeamEnv(MultiAgentToolEnv):
    metadata = {**MultiAgentToolEnv.metadata, "name": "factchain_team_v0"}
    required_task_keys = ("question", "answer", "path", "chain")

    def __init__(
        self,
        num_agents: int = 2,
        num_entities: int = 32,
        num_relations: int = 4,
        num_hops: int = 2,
        num_tasks: int = 10000,
        kb_seed: int = 0,
        split: str = "train",
        question_style: str = "nested",
        max_cycles: int | None = None,
        system_prompt: str | dict[str, str] | None = None,
        tokenizer: Any = None,
        max_context_tokens: int = 2048,
        **kwargs: Any,
    ):
        if not isinstance(num_agents, int) or isinstance(num_agents, bool) or num_agents < 2:
            raise ValueError(f"num_agents must be an integer >= 2 (a team), got {num_agents!r}")
        tok = load_tokenizer(tokenizer)
        # The task source: FactChain's own KB and question generation.
        self.source = FactChainEnv(
            num_entities=num_entities,
            num_relations=num_relations,
            num_hops=num_hops,
            num_tasks=num_tasks,
            kb_seed=kb_seed,
            split=split,
            question_style=question_style,
            tokenizer=tok,
        )
        self.num_hops = num_hops
        agents = [f"agent_{i}" for i in range(num_agents)]
        self.lookups = {a: PartLookupTool(self.source.kb, self.source.relations) for a in agents}
        # A given string is shared by the seats and followed by each seat's identity (MultiAgentToolEnv);
        # a dict is used as given. The default names the seat in its first sentence.
        prompts = (
            system_prompt
            if system_prompt is not None
            else {
                a: (
                    f"You are {a}, one of a team of {num_agents} agents answering the same question by following a chain "
                    "of facts. Your lookup tool only knows the facts about the entities in your part of the knowledge "
                    "base; your teammates hold the rest. Send a teammate what they need with send, read messages with "
                    "receive. Look up one hop at a time, innermost relation first. Give only the final entity name in "
                    "<answer></answer>."
                )
                for a in agents
            }
        )
        super().__init__(
            {a: [self.lookups[a]] for a in agents},
            system_prompts=prompts,
            tokenizer=tok,
            max_cycles=max_cycles if max_cycles is not None else 3 * num_hops + 2,
            max_context_tokens=max_context_tokens,
            **kwargs,
        )

    def num_tasks(self) -> int:
        return self.source.num_tasks()

    def get_task(self, index: int) -> dict[str, Any]:
        return self.source.get_task(index)

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return self.source.score_answer(answer, task)

    def holders(self, task: dict[str, Any]) -> dict[str, str]:
        """Entity -> the agent holding its facts: hop h's subject by ``agent_{h mod n}``, the others
        drawn from the task's id (so a task always splits the same way)."""
        n = len(self.possible_agents)
        entities = sorted({e for e, _ in self.source.facts(task)})
        rng = np.random.default_rng(zlib.crc32(str(task.get("id", task["question"])).encode()))
        out = {e: self.possible_agents[int(rng.integers(n))] for e in entities}
        fixed: dict[str, str] = {}
        for h, e in enumerate(task["path"][:-1]):
            fixed.setdefault(e, self.possible_agents[h % n])
        out.update(fixed)
        return out

    def on_reset(self, task: dict[str, Any]) -> None:
        holders = self.holders(task)
        for a, tool in self.lookups.items():
            tool.use_kb(self.source.facts(task))
            tool.hold({e for e, h in holders.items() if h == a})


class TeamOracle:
    """A scripted team that follows the message protocol and reads everything it uses from its own
    context: the start entity and the relations from the question's task (they are in the question),
    every later entity from a ``lookup`` result or a received message. Each agent, each cycle:

    - knows an entity for hop ``h`` and holds it: ``lookup(entity, chain[h])``;
    - just looked up hop ``h``: answer the result after the last hop; else send ``hop h+1: result``
      to the holder of hop ``h+1`` (``agent_{(h+1) mod n}``), or look it up itself if that is it;
    - otherwise ``receive``.

    ``silent=True`` never sends: where it would send, it answers an entity drawn from the KB (the
    no-communication baseline). Use :meth:`act` per agent and cycle (parallel) or :meth:`policy`.
    """

    _MSG = re.compile(r"hop (\d+): (\S+)")

    def __init__(self, env: Any, silent: bool = False, seed: int = 0):
        self.env: FactChainTeamEnv = env.unwrapped
        self.silent = silent
        self.rng = np.random.default_rng(seed)
        self.state: dict[str, dict[str, Any]] = {}

    def _last_response(self, agent: str) -> str:
        seat = self.env.seats[agent]
        role, content = seat.transcript[-1]
        return content if role == "tool" else ""

    def text(self, agent: str) -> str:
        env, task = self.env, self.env.task
        n, chain = len(env.possible_agents), task["chain"]
        st = self.state.setdefault(
            agent, {"todo": (0, task["path"][0]) if agent == env.possible_agents[0] else None, "looked_up": None}
        )
        if st["looked_up"] is not None:  # the last turn was a lookup: its result is in the last tool response
            h = st["looked_up"]
            st["looked_up"] = None
            result = self._last_response(agent).strip()
            if h == len(chain) - 1:
                return f"<answer>{result}</answer>"
            holder = env.possible_agents[(h + 1) % n]
            if holder == agent:
                st["todo"] = (h + 1, result)
            elif self.silent:
                guess = env.source.entities[int(self.rng.integers(len(env.source.entities)))]
                return f"<answer>{guess}</answer>"
            else:
                return env.seats[agent].format.call_text("send", {"to": holder, "text": f"hop {h + 1}: {result}"})
        if st["todo"] is None:
            m = self._MSG.findall(self._last_response(agent))
            if m:
                st["todo"] = (int(m[-1][0]), m[-1][1])
        if st["todo"] is not None:
            h, entity = st["todo"]
            st["todo"], st["looked_up"] = None, h
            return lookup_turn(entity, chain[h], env.seats[agent].format)
        return env.seats[agent].format.call_text("receive", {})

    def reset(self) -> None:
        self.state = {}

    def act(self, agent: str) -> np.ndarray:
        return self.env.seats[agent].encode_turn(self.text(agent))


def play_parallel(env: FactChainTeamEnv, policy: Any, task_index: int) -> dict[str, Any]:
    """One episode of ``env`` (a ParallelEnv) with ``policy(agent, obs) -> action``; returns the
    team's outcome (``success``, ``cycles``, ``messages``) and every agent's final ``Episode``."""
    obs, _ = env.reset(options={"task_index": task_index})
    episodes: dict[str, Any] = {}
    while env.agents:
        actions = {a: policy(a, obs[a]) for a in env.agents}
        obs, _, term, trunc, infos = env.step(actions)
        for a in term:
            if term[a] or trunc[a]:
                episodes[a] = infos[a]["trajectory"]
    return {
        "success": any(ep.success for ep in episodes.values()),
        "cycles": env.cycle,
        "messages": len(env.mailbox.log),
        "episodes": episodes,
    }


def parallel_env(**kwargs: Any) -> FactChainTeamEnv:
    """The ``ParallelEnv`` (PettingZoo's module convention)."""
    return FactChainTeamEnv(**kwargs)


def env(**kwargs: Any):
    """The AEC env: PettingZoo's ``parallel_to_aec`` of :func:`parallel_env`."""
    from pettingzoo.utils.conversions import parallel_to_aec  # optional: pettingzoo (extra pettingzoo)

    return parallel_to_aec(parallel_env(**kwargs))
