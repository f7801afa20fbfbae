"""Multi-agent ToolEnvs for PettingZoo, in the same token-in/token-out contract.

A :class:`MultiAgentToolEnv` is a team of *seats*. Each seat is a full :class:`~agent_gym.env.ToolEnv`
(:class:`SeatEnv`) with its own context, its own tools and its own loss mask: agent ``a`` observes
``{"input_ids": ...}``, the ids of *its* conversation only, and acts with the ids of one assistant turn,
exactly as a single-agent ToolEnv. Seats talk through two tools bound to a shared :class:`Mailbox`:

- ``send(to, text)`` posts a message to a teammate;
- ``receive()`` returns the messages delivered to this seat since its last ``receive`` (or
  ``No new messages.``), oldest first, one per line as ``<sender>: <text>``.

Messages sent during a cycle are delivered at the end of that cycle (after every live seat has
acted), so a message can be received from the next cycle on. This makes the env simultaneous-move
and the AEC and Parallel views agree exactly (``metadata["is_parallelizable"]``).

The env is a PettingZoo ``ParallelEnv`` (one ``step`` = one cycle: every live agent's turn). Its
AEC view is PettingZoo's own conversion, ``pettingzoo.utils.conversions.parallel_to_aec`` (see
:func:`agent_gym.registration.make_multiagent`). Episode rules:

- The first ``<answer>`` ends the episode for the whole team (several answers in one cycle: the
  first seat in ``possible_agents`` order gives the team's answer). The team's answer is scored by
  :meth:`MultiAgentToolEnv.score_answer`, and every seat still live in that cycle gets the outcome
  components (``em``...) on its last step: a cooperative reward. Every such seat's ``Episode`` has
  the team's ``answer``, ``answer_scores`` and ``success``.
- A seat that truncates on its own (its ``max_turns``, ``max_invalid_calls``, tool budget or
  context) leaves the episode with its own ``Episode``; the others go on.
- After ``max_cycles`` cycles every live seat is truncated with ``truncation_reason="max_cycles"``.
  ``max_cycles`` is what bounds a team episode: by default a seat's own ``max_turns`` and
  ``max_invalid_calls`` are ``max_cycles + 1``, so a seat whose calls fail stays in the team (it
  is still the only one that can look up its part or receive its messages; ``call_invalid``
  penalises the failed calls). Pass ``max_invalid_calls=3`` for the single-agent behaviour.
- Every seat knows which seat it is: a single ``system_prompts`` string is shared by the seats and
  followed by each seat's identity (:meth:`MultiAgentToolEnv.seat_identity`), and ``reset`` refuses
  (``ValueError``) a configuration in which two seats' first observations are the same ids (a
  dict of identical prompts, or ``seat_messages`` that leave the seat out), since a shared policy
  could not tell which seat it plays.

On the step where an agent's episode ends, ``infos[agent]["trajectory"]`` is its
:class:`~agent_gym.episode.Episode`; its ``loss_mask`` marks exactly that agent's sampled tokens.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from agent_gym.env import RewardConfig, ToolEnv
from agent_gym.episode import Episode
from agent_gym.formats import CallOutcome
from agent_gym.tokenizer import load_tokenizer
from agent_gym.tools import Tool, ToolResult

_RESET_OPTIONS = ("task", "task_index")


class Mailbox:
    """Messages between seats: ``post`` queues one, ``deliver`` (end of a cycle) moves the queue to
    the recipients' inboxes, ``take`` empties one inbox. ``log`` keeps every delivered message."""

    def __init__(self, seats: Sequence[str]):
        self.seats = list(seats)
        self.clear()

    def clear(self) -> None:
        self.pending: list[tuple[str, str, str]] = []
        self.inbox: dict[str, list[tuple[str, str]]] = {s: [] for s in self.seats}
        self.log: list[dict[str, Any]] = []
        self.cycle = 0

    def post(self, sender: str, to: str, text: str) -> None:
        self.pending.append((sender, to, text))

    def deliver(self) -> None:
        for sender, to, text in self.pending:
            self.inbox[to].append((sender, text))
            self.log.append({"cycle": self.cycle, "from": sender, "to": to, "text": text})
        self.pending = []
        self.cycle += 1

    def take(self, seat: str) -> list[tuple[str, str]]:
        msgs, self.inbox[seat] = self.inbox[seat], []
        return msgs


@dataclasses.dataclass
class _MailboxState:
    """A copy of a :class:`Mailbox`'s contents (for the team's transactional reset)."""

    pending: list[tuple[str, str, str]]
    inbox: dict[str, list[tuple[str, str]]]
    log: list[dict[str, Any]]
    cycle: int


class SendTool(Tool):
    name = "send"
    description = (
        "Send a text message to a teammate. It is delivered at the end of this round; the "
        "teammate reads it with receive."
    )

    def __init__(self, mailbox: Mailbox, sender: str, recipients: Sequence[str], max_chars: int = 200):
        self.mailbox, self.sender = mailbox, sender
        self.parameters = {
            "type": "object",
            "properties": {
                "to": {"type": "string", "enum": list(recipients), "description": "the teammate's name"},
                "text": {"type": "string", "maxLength": int(max_chars), "description": "the message"},
            },
            "required": ["to", "text"],
            "additionalProperties": False,
        }

    def execute(self, to: str, text: str) -> ToolResult:
        self.mailbox.post(self.sender, to, text)
        return ToolResult(f"Sent to {to}.", metadata={"to": to})


class ReceiveTool(Tool):
    name = "receive"
    description = "Read the messages your teammates sent you since your last receive."
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def __init__(self, mailbox: Mailbox, seat: str):
        self.mailbox, self.seat = mailbox, seat

    def execute(self) -> ToolResult:
        msgs = self.mailbox.take(self.seat)
        if not msgs:
            return ToolResult("No new messages.", metadata={"messages": 0})
        return ToolResult("\n".join(f"{s}: {t}" for s, t in msgs), metadata={"messages": len(msgs)})


class SeatEnv(ToolEnv):
    """One seat of a team: a ``ToolEnv`` whose tasks, opening messages and process rewards come from
    the team env. It never scores an answer itself (``score_answer`` returns no scores): the team
    scores the first answer and shares the outcome (:class:`MultiAgentToolEnv`)."""

    def __init__(self, team: MultiAgentToolEnv, agent: str, tools: Sequence[Tool], **kwargs: Any):
        self.team, self.agent = team, agent
        self.required_task_keys = team.required_task_keys
        super().__init__(tools=tools, **kwargs)

    def num_tasks(self) -> int:
        return self.team.num_tasks()

    def get_task(self, index: int) -> dict[str, Any]:
        return self.team.get_task(index)

    def task_messages(self, task: dict[str, Any]) -> list[dict[str, str]]:
        return self.team.seat_messages(self.agent, self.system_prompt, task)

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return {}

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        return False

    def process_components(self, outcome: CallOutcome, task: dict[str, Any]) -> dict[str, float]:
        return self.team.process_components(self.agent, outcome, task)

    def end_episode(
        self, answer_scores: dict[str, float], truncation_reason: str | None, outcome: dict[str, float] | None = None
    ) -> Episode:
        """End this seat's episode from outside (the team ended it) and return its ``Episode``;
        ``outcome`` components are added to its last step (and its reward)."""
        if outcome:
            self.step_reward_components[-1].update(outcome)
            self.step_rewards[-1] = float(sum(self.step_reward_components[-1].values()))
        self._done = True
        return self.episode(answer_scores, truncation_reason)

    def render_text(self) -> str:
        """This seat's transcript as text (whatever its ``render_mode``)."""
        return "\n\n".join(f"[{role}]\n{content}" for role, content in self.transcript) + "\n"


class MultiAgentToolEnv(ParallelEnv):
    """Base class of the multi-agent tool envs (see the module docstring for the rules).

    Args:
        seat_tools: agent name -> the tools of that seat (``send``/``receive`` are added when
            ``messaging`` and there are two seats or more). Names like ``agent_0``.
        system_prompts: one prompt shared by every seat, to which each seat's identity is added
            (:meth:`seat_identity`), or agent name -> prompt (used as given; the seats' first
            observations must still differ, see ``reset``).
        max_cycles: cycles (rounds in which every live agent takes one turn) before truncation.
        max_turns: each seat's own turn limit; default ``max_cycles + 1``, so ``max_cycles`` rules.
        max_invalid_calls: each seat's limit on consecutive turns without a successful call;
            default ``max_cycles + 1`` (a seat is not dropped from the team for failed calls).
        messaging: give every seat ``send`` and ``receive``.
        max_message_chars: the longest ``text`` that ``send`` accepts (longer: ``bad_arguments``).
        tokenizer, rewards: as for ``ToolEnv``, shared by the seats.
        render_mode: ``None``, ``"ansi"`` (``render`` returns every seat's transcript) or
            ``"human"`` (``render`` prints it).
        seat_kwargs: every other ``ToolEnv`` argument (``tool_format``, ``max_context_tokens``,
            ``max_tool_calls``, ``eot_token``, ``vocab_size``, ``tools_in_prompt``), applied to
            each seat.

    Subclasses implement ``num_tasks``, ``get_task``, ``score_answer`` and may override
    ``seat_messages``, ``is_success``, ``process_components`` and ``on_reset``.
    """

    metadata = {"render_modes": ["ansi", "human"], "name": "multiagent_tool_env", "is_parallelizable": True}
    required_task_keys: tuple[str, ...] = ("question", "answer")

    def __init__(
        self,
        seat_tools: dict[str, Sequence[Tool]],
        system_prompts: str | dict[str, str] = "You are a helpful assistant.",
        tokenizer: Any = None,
        max_cycles: int = 8,
        max_turns: int | None = None,
        max_invalid_calls: int | None = None,
        rewards: RewardConfig | dict | None = None,
        render_mode: str | None = None,
        messaging: bool = True,
        max_message_chars: int = 200,
        **seat_kwargs: Any,
    ):
        if not isinstance(seat_tools, dict) or not seat_tools:
            raise ValueError("seat_tools must be a non-empty dict of agent name -> list of tools")
        for a in seat_tools:
            if not isinstance(a, str) or not a:
                raise ValueError(f"agent names must be non-empty strings, got {a!r}")
        if not isinstance(max_cycles, (int, np.integer)) or isinstance(max_cycles, bool) or max_cycles <= 0:
            raise ValueError(f"max_cycles must be a positive integer, got {max_cycles!r}")
        if isinstance(system_prompts, dict):
            missing = sorted(set(seat_tools) - set(system_prompts))
            if missing:
                raise ValueError(f"system_prompts has no prompt for agent(s) {missing}")
        elif not isinstance(system_prompts, str):
            raise ValueError(
                f"system_prompts must be a string (shared, each seat's identity added) or a dict of "
                f"agent name -> prompt, got {type(system_prompts).__name__}"
            )
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.possible_agents: list[str] = list(seat_tools)
        self.render_mode = render_mode
        self.max_cycles = int(max_cycles)
        self.reward_cfg = RewardConfig.from_any(rewards)
        for key, on in (
            ("format_gate", self.reward_cfg.format_gate is not None),
            ("process_needs_answer", self.reward_cfg.process_needs_answer),
            ("call_in_answer", self.reward_cfg.call_in_answer is not None),
        ):
            if on:
                raise ValueError(
                    f"rewards.{key} is for single-agent envs: a team scores its answer once for every seat, and "
                    "a seat that did not answer ends without an answer of its own; remove the key"
                )
        self.tokenizer = load_tokenizer(tokenizer)
        self.mailbox = Mailbox(self.possible_agents)
        self.seats: dict[str, SeatEnv] = {}
        for a in self.possible_agents:
            tools = list(seat_tools[a])
            if messaging and len(self.possible_agents) > 1:
                others = [b for b in self.possible_agents if b != a]
                tools += [SendTool(self.mailbox, a, others, max_message_chars), ReceiveTool(self.mailbox, a)]
            if isinstance(system_prompts, dict):
                prompt = system_prompts[a]
            else:
                prompt = (
                    f"{system_prompts.rstrip()}\n\n{self.seat_identity(a)}"
                    if system_prompts.strip()
                    else self.seat_identity(a)
                )
            self.seats[a] = SeatEnv(
                self,
                a,
                tools,
                tokenizer=self.tokenizer,
                system_prompt=prompt,
                rewards=self.reward_cfg,
                max_turns=max_turns if max_turns is not None else self.max_cycles + 1,
                max_invalid_calls=max_invalid_calls if max_invalid_calls is not None else self.max_cycles + 1,
                **seat_kwargs,
            )
        first = self.seats[self.possible_agents[0]]
        self.vocab_size = first.vocab_size
        self.stop_token_ids = list(first.stop_token_ids)
        self.observation_spaces = {a: s.observation_space for a, s in self.seats.items()}
        self.action_spaces = {a: s.action_space for a, s in self.seats.items()}
        self.agents: list[str] = []
        self._broken = False
        self.np_random, self._np_random_seed = seeding.np_random()

    # -- hooks for subclasses ----------------------------------------------------------------

    def seat_identity(self, agent: str) -> str:
        """The line that tells a seat who it is, added to a shared system prompt."""
        others = [b for b in self.possible_agents if b != agent]
        if not others:
            return f"You are {agent}."
        return (
            f"You are {agent}, one of a team of {len(self.possible_agents)} agents; your "
            f"teammate{'s are' if len(others) > 1 else ' is'} {', '.join(others)}."
        )

    def num_tasks(self) -> int:
        raise NotImplementedError

    def get_task(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def seat_messages(self, agent: str, system_prompt: str, task: dict[str, Any]) -> list[dict[str, str]]:
        """The opening messages of ``agent``'s context; by default its system prompt and the question."""
        return [{"role": "system", "content": system_prompt}, {"role": "user", "content": task["question"]}]

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        """The team answer's raw scores in [0, 1], e.g. ``{"em": 1.0}``."""
        raise NotImplementedError

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        return float(answer_scores.get("em", 0.0)) >= 1.0

    def process_components(self, agent: str, outcome: CallOutcome, task: dict[str, Any]) -> dict[str, float]:
        """Extra weighted process-reward components for one successful call of ``agent``."""
        return {}

    def on_reset(self, task: dict[str, Any]) -> None:
        """Called after the task is chosen and before the seats reset (e.g. to give each seat its data)."""

    # -- PettingZoo API ------------------------------------------------------------------------

    def observation_space(self, agent: str):
        return self.observation_spaces[agent]

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start a team episode. ``options`` may pick the task: ``{"task": row}`` or
        ``{"task_index": k}``; other keys are ignored with a warning (PettingZoo's ``api_test``
        passes ``{"options": 1}`` to check that ``options`` is accepted).

        Transactional for the whole team, like :meth:`ToolEnv.reset` for one env: if anything
        raises (a bad task, a seat's reset, ``on_reset``, seats that start alike), every seat, the
        mailbox, the team's attributes and its RNG are put back as they were, and :meth:`step`
        refuses until a reset succeeds. (A seat failing after others had reset used to leave the
        team half in the new episode.) What ``on_reset`` did to the tools is not undone, as for a
        single env; the refusal keeps the old episode from running on with it."""
        saved = (
            dict(self.__dict__),
            self._mailbox_state(),
            self.np_random.bit_generator.state,
            {a: s._reset_checkpoint() for a, s in self.seats.items()},
        )
        try:
            out = self._reset(seed, options)
        except BaseException as e:
            attrs, mail, rng_state, seats = saved
            self.__dict__.clear()
            self.__dict__.update(attrs)
            self._restore_mailbox(mail)
            self.np_random.bit_generator.state = rng_state
            for a, st in seats.items():
                self.seats[a]._reset_rollback(st)
                self.seats[a].__dict__["_reset_failed"] = f"the team's reset failed ({type(e).__name__})"
            self._reset_failed = f"{type(e).__name__}: {str(e)[:300]}"
            raise
        self._reset_failed = None
        return out

    def _mailbox_state(self) -> _MailboxState:
        m = self.mailbox
        return _MailboxState(list(m.pending), {k: list(v) for k, v in m.inbox.items()}, list(m.log), m.cycle)

    def _restore_mailbox(self, st: _MailboxState) -> None:
        m = self.mailbox
        m.pending, m.inbox, m.log, m.cycle = st.pending, st.inbox, st.log, st.cycle

    def _reset(self, seed: int | None, options: dict[str, Any] | None):
        if seed is not None:
            self.np_random, self._np_random_seed = seeding.np_random(seed)
        options = dict(options or {})
        unknown = sorted(set(options) - set(_RESET_OPTIONS))
        if unknown:
            warnings.warn(
                f"{type(self).__name__}.reset: ignoring unknown option(s) {unknown}; valid: {list(_RESET_OPTIONS)}",
                stacklevel=2,
            )
        first = self.seats[self.possible_agents[0]]
        if "task" in options:
            task, self.task_index = first.check_task(options["task"]), -1
            seat_options: dict[str, Any] = {"task": task}
        else:
            n = self.num_tasks()
            k = options.get("task_index")
            k = int(self.np_random.integers(n)) if k is None else k
            if not isinstance(k, (int, np.integer)) or not 0 <= int(k) < n:
                raise ValueError(f"task_index {k!r} out of range: this env has {n} tasks")
            self.task_index = int(k)
            task = self.get_task(self.task_index)
            seat_options = {"task_index": self.task_index}
        self.task = task
        self.mailbox.clear()
        self.on_reset(task)
        self.cycle = 0
        self.team_answer: str | None = None
        self.team_scores: dict[str, float] = {}
        self._broken = False
        self.agents = list(self.possible_agents)
        obs, infos = {}, {}
        for a in self.agents:
            obs[a], infos[a] = self.seats[a].reset(options=seat_options)
            infos[a]["agent"] = a
        self._check_seats_differ(obs)
        return obs, infos

    def _check_seats_differ(self, obs: dict[str, dict[str, np.ndarray]]) -> None:
        """Two seats whose first observations are the same ids are indistinguishable to a shared
        policy: refuse (the episode is not started) naming them and the fix."""
        seen: dict[bytes, str] = {}
        for a in self.possible_agents:
            key = np.asarray(obs[a]["input_ids"], dtype=np.int64).tobytes()
            if key in seen:
                self.agents = []
                raise ValueError(
                    f"{type(self).__name__}: agents {seen[key]!r} and {a!r} start with the same observation "
                    f"({len(obs[a]['input_ids'])} identical token ids), so a policy shared by the seats could not "
                    "know which one it plays. Give each seat its own system prompt (pass one string, to which each "
                    "seat's identity is added, or a dict whose prompts differ) or make seat_messages() name the agent."
                )
            seen[key] = a

    def step(self, actions: dict[str, Any]):
        """One cycle: every live agent's turn, in ``possible_agents`` order, then the mailbox
        delivers. Every action is checked before any seat steps; a missing or extra agent raises
        ``ValueError`` naming it."""
        failed = self.__dict__.get("_reset_failed")
        if failed:
            raise RuntimeError(
                f"the last reset() failed ({failed}) and changed nothing; step() refuses to go on "
                "with whatever came before it; call reset() again and let it succeed first."
            )
        if self._broken:
            raise RuntimeError("a seat's step raised during the last cycle; call reset() before stepping again")
        if not self.agents:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict of agent name -> token ids, got {type(actions).__name__}")
        extra = sorted(set(actions) - set(self.agents), key=str)
        if extra:
            raise ValueError(f"actions for agent(s) {extra} that are not live; live agents: {self.agents}")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"no action for live agent(s) {missing}; every live agent acts each cycle")
        ids = {}
        for a in self.agents:
            try:
                ids[a] = self.seats[a].check_action(actions[a])
            except ValueError as e:
                raise ValueError(f"agent {a!r}: {e}") from None
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        answered_by = None
        try:
            for a in self.agents:
                obs[a], rew[a], term[a], trunc[a], infos[a] = self.seats[a].step(ids[a])
                infos[a]["agent"] = a
                if term[a] and answered_by is None:
                    answered_by = a
        except BaseException:
            self._broken = True
            raise
        self.mailbox.deliver()
        self.cycle += 1
        if answered_by is not None:
            self._share_outcome(infos[answered_by]["answer"], rew, term, trunc, infos)
        elif self.cycle >= self.max_cycles:
            for a in self.agents:
                if not (term[a] or trunc[a]):
                    trunc[a] = True
                    infos[a]["truncation_reason"] = "max_cycles"
                    infos[a]["trajectory"] = self.seats[a].end_episode({}, "max_cycles")
        for a in self.agents:
            infos[a]["cycle"] = self.cycle
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, infos

    def _share_outcome(self, answer: str, rew: dict, term: dict, trunc: dict, infos: dict) -> None:
        """The team's answer ends the episode for every seat that did not truncate this cycle:
        each gets the outcome components on its last step and the team's answer in its Episode."""
        scores = {k: float(v) for k, v in self.score_answer(answer, self.task).items()}
        success = bool(self.is_success(scores, self.task))
        outcome = {k: w * scores.get(k, 0.0) for k, w in self.reward_cfg.answer_weights.items()}
        self.team_answer, self.team_scores = answer, scores
        for a in self.agents:
            if trunc[a]:
                continue  # this seat left on its own this cycle
            seat = self.seats[a]
            ep = seat.end_episode(scores, None, outcome)
            rew[a], term[a] = seat.step_rewards[-1], True
            info = infos[a]
            info["reward_components"] = dict(seat.step_reward_components[-1])
            info["answer"], info["answer_scores"] = answer, dict(scores)
            info["trajectory"] = dataclasses.replace(
                ep,
                answer=answer,
                answer_scores=dict(scores),
                success=success,
                answer_holds_call=seat._holds_call(answer),  # the team's answer, read in this seat's format
            )

    def render(self) -> str | None:
        """Every seat's transcript: returned (``"ansi"``), printed (``"human"``), or nothing."""
        if self.render_mode is None:
            return None
        text = "\n".join(f"===== {a} =====\n{s.render_text()}" for a, s in self.seats.items())
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        for s in self.seats.values():
            s.close()


__all__ = ["Mailbox", "MultiAgentToolEnv", "ReceiveTool", "SeatEnv", "SendTool"]
