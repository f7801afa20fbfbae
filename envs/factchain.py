"""AgentR1/FactChain-v0: synthetic multi-hop questions over a knowledge base of invented entities.

Card
----
Task
    'Who is the mentor of the rival of "Karimel"?' (``question_style="nested"``, the default) or
    'Who is "Karimel"'s rival's mentor?' (``"possessive"``: the relations in the order they are
    looked up). The start entity is quoted as it is in a tool call's arguments, so that with the
    default tokenizer its tokens are the same in the question, the call and a tool result (a
    relation name, unquoted in the question, differs there in its first token only: `Ġri v al`
    for " rival", `ri v al` in the call; until 2026-11-25 the default tokenizer's corpus held
    FactChain's relations as single tokens): a tiny model copies names token for token. The knowledge base (KB) maps every
    (entity, relation) pair to another entity. A question with H hops names a start entity and a
    chain of H relations; the answer is the entity at the end of the chain. Entities are invented
    names, so nothing can be answered from prior knowledge.
Tools
    ``lookup(entity, relation)`` returns the single entity that ``relation`` points to from
    ``entity``, or an error for an unknown entity. Each hop needs its own call, because the
    intermediate entities appear nowhere in the question: a question with H hops cannot be
    answered correctly (except by chance, 1 in ``num_entities``) with fewer than H calls.
Observation
    The token ids of the conversation: system prompt with tool schema, the question, every
    assistant turn and every tool response (``tool_format="hermes"`` by default).
Reward
    Outcome: exact match of ``<answer>`` with the gold entity (``em``, weight 1). Process
    rewards and penalties are configurable through ``rewards=`` (see ``RewardConfig``); all are 0
    by default so that the outcome alone defines success. FactChain's own process component is
    ``hop`` (``rewards={"extra": {"hop": w}}``): paid once per hop for the first lookup of that
    hop's gold (entity, relation), the analogue of retrieving a supporting paragraph.
Data
    None read from disk. The KB and the tasks are generated from ``kb_seed``; task ``k`` of a
    split is a pure function of ``(kb_seed, split, k)``, so runs are reproducible and two envs
    with the same arguments agree exactly. ``split="train"`` and ``split="test"`` draw task
    indices from disjoint random streams. A task given as ``reset(options={"task": ...})`` goes
    through the same check as every generated one (``FactChainEnv.validate_task``), at reset and
    before the env changes: a non-blank ``question``, ``kb`` (optional, default 0) one of the
    env's KBs, ``chain`` a non-empty list of the env's relations, ``path`` the ``len(chain) + 1``
    entities that chain visits in that KB, and ``answer`` the last of them; anything else raises
    ``ValueError`` naming the key (``answer: None`` used to raise at the answer step).
Parameters
    ``num_entities`` (default 32), ``num_relations`` (1 to 6, default 4), ``num_hops`` (default 2),
    ``num_tasks`` (default 10000), ``kb_seed`` (default 0), ``num_kbs`` (default 1: with N > 1, task
    ``k`` is asked over KB ``k % N``, the KBs of seeds ``kb_seed`` .. ``kb_seed + N - 1``, and the
    lookup tool answers from that task's KB; training over several KBs teaches the lookup skill
    rather than one KB's names; KBs are built when a task first uses one, about 0.5 ms each, and
    a process keeps the last 1,024 used, shared by its envs, so ``num_kbs=100000`` costs no more
    than 1), ``split``,
    ``system_prompt``,
    ``question_style``, ``exclude_train_tasks`` (default 0; with ``split="test"``, N > 0 redraws
    every test question that is one of the first N train questions, so that the test split is
    held out from a training pool of ``num_tasks=N``: the trainer's ``eval.sets`` use it), and every
    ``ToolEnv`` argument (tokenizer, limits, rewards, render_mode, ``tools_in_prompt``). The CPU
    demo uses ``tools_in_prompt=False`` and a one-line system prompt: about 60 prompt tokens
    instead of about 350, because a tiny model learns the call format from its SFT warm start.
Versions
    v0: first release. Changed within v0 (before any release): the start entity is quoted in
    the question.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from agent_gym.env import ToolEnv, check_env_kwargs
from agent_gym.formats import CallOutcome, HermesFormat, ToolCallFormat
from agent_gym.scoring import exact_match
from agent_gym.tools import Tool, ToolResult

RELATIONS = ("mentor", "rival", "employer", "sibling", "founder", "spouse")
_SYLLABLES = (
    "ka ri to mel van dor sil bra quen lo zar fin ta mur eth ol pra ves nu kor "
    "bel tis gor ven ash lin ro mal dun sha vel tor"
).split()
_SPLITS = {"train": 0, "test": 1}
_QUESTION_STYLES = ("nested", "possessive")
_NAMES = tuple((a + b).capitalize() for a in _SYLLABLES for b in _SYLLABLES if a != b)
KB_CACHE_SIZE = 1024
"""How many built KBs a process keeps (``FactChainEnv.kb_at``, shared by all its envs: about 14 KB
each); the others are rebuilt when asked for."""


def make_kb(num_entities: int, num_relations: int, seed: int) -> tuple[list[str], dict[tuple[str, str], str]]:
    """Invent ``num_entities`` names and a random relation graph (no self loops)."""
    rng = np.random.default_rng([seed, 7919])
    if num_entities > len(_NAMES):
        raise ValueError(f"num_entities must be at most {len(_NAMES)}, got {num_entities}")
    names = [_NAMES[i] for i in rng.choice(len(_NAMES), size=num_entities, replace=False)]
    kb: dict[tuple[str, str], str] = {}
    for i, e in enumerate(names):
        for r in RELATIONS[:num_relations]:
            j = int(rng.integers(num_entities - 1))
            kb[(e, r)] = names[j if j < i else j + 1]
    return names, kb


@functools.lru_cache(maxsize=KB_CACHE_SIZE)
def shared_kb(num_entities: int, num_relations: int, seed: int) -> tuple[list[str], dict[tuple[str, str], str]]:
    """``make_kb``, built once per process and shared by every env that asks (read-only: nothing
    mutates a KB). A GRPO group's envs and an RL run's rollout and eval envs ask for the same KBs;
    with a cache per env each of them rebuilt each KB (about half the env time of the demo's RL)."""
    return make_kb(num_entities, num_relations, seed)


class LookupTool(Tool):
    name = "lookup"
    description = "Look up one fact: the entity that `relation` points to from `entity`."

    def __init__(self, kb: dict[tuple[str, str], str], relations: tuple[str, ...]):
        self.use_kb(kb)
        self.parameters = {
            "type": "object",
            "properties": {
                "entity": {"type": "string", "description": "an entity name"},
                "relation": {"type": "string", "enum": list(relations)},
            },
            "required": ["entity", "relation"],
            "additionalProperties": False,
        }

    def use_kb(self, kb: dict[tuple[str, str], str]) -> None:
        """Answer from ``kb`` from now on (a multi-KB env switches it at each reset)."""
        self.kb = kb
        self.entities = {e for e, _ in kb}

    def execute(self, entity: str, relation: str) -> ToolResult:
        e = entity.strip()
        if e not in self.entities:
            return ToolResult(f"No entity named {e!r}.", ok=False)
        return ToolResult(self.kb[(e, relation)], metadata={"entity": e, "relation": relation})


class FactChainEnv(ToolEnv):
    required_task_keys = ("question", "answer", "path", "chain")
    episode_state = ("_hops_found",)
    """The hops already paid (``process_components``): restored when a step raises."""

    def __init__(
        self,
        num_entities: int = 32,
        num_relations: int = 4,
        num_hops: int = 2,
        num_tasks: int = 10000,
        kb_seed: int = 0,
        num_kbs: int = 1,
        split: str = "train",
        max_turns: int | None = None,
        max_context_tokens: int = 1024,
        system_prompt: str | None = None,
        question_style: str = "nested",
        exclude_train_tasks: int = 0,
        **kwargs: Any,
    ):
        limits = {
            "max_context_tokens": max_context_tokens,
            **({"max_turns": max_turns} if max_turns is not None else {}),
        }
        check_env_kwargs(type(self), {**kwargs, **limits})
        if not 1 <= num_relations <= len(RELATIONS):
            raise ValueError(f"num_relations must be in 1..{len(RELATIONS)}, got {num_relations}")
        for name, v in (
            ("num_entities", num_entities),
            ("num_hops", num_hops),
            ("num_tasks", num_tasks),
            ("num_kbs", num_kbs),
        ):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if num_entities < 2:
            raise ValueError("num_entities must be at least 2")
        if question_style not in _QUESTION_STYLES:
            raise ValueError(f"question_style must be one of {_QUESTION_STYLES}, got {question_style!r}")
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
        if not isinstance(exclude_train_tasks, int) or exclude_train_tasks < 0:
            raise ValueError(f"exclude_train_tasks must be a non-negative integer, got {exclude_train_tasks!r}")
        if exclude_train_tasks and split != "test":
            raise ValueError(
                "exclude_train_tasks applies to split='test' only (it removes the questions of the "
                f"first {exclude_train_tasks} train tasks from the test split); got split={split!r}"
            )
        self.num_hops = num_hops
        self.relations = RELATIONS[:num_relations]
        self.kb_seed = kb_seed
        self.split = split
        self.question_style = question_style
        self._num_tasks = num_tasks
        self.exclude_train_tasks = exclude_train_tasks
        self.num_entities = num_entities
        self.num_kbs = num_kbs
        self.entities, self.kb = self.kb_at(0)
        self._excluded = {self._draw("train", k, 0) for k in range(exclude_train_tasks)}
        if len(self._excluded) >= num_kbs * num_entities * num_relations**num_hops:
            raise ValueError(
                f"exclude_train_tasks={exclude_train_tasks} covers every one of the "
                f"{num_entities * num_relations**num_hops} questions of this KB: nothing is held out"
            )
        system = system_prompt or (
            "Answer the question by following the chain of facts. Use the lookup tool "
            "once per hop, innermost relation first. Give only the final entity name in "
            "<answer></answer>."
        )
        super().__init__(
            tools=[LookupTool(self.kb, self.relations)],
            system_prompt=system,
            max_turns=max_turns if max_turns is not None else num_hops + 2,
            max_context_tokens=max_context_tokens,
            **kwargs,
        )

    def num_tasks(self) -> int:
        return self._num_tasks

    def kb_at(self, i: int) -> tuple[list[str], dict[tuple[str, str], str]]:
        """KB ``i`` of this env (seed ``kb_seed + i``): its names and facts. Built when first asked for
        (about 0.5 ms) and kept in a process-wide cache of the last ``KB_CACHE_SIZE`` used
        (``shared_kb``), so an env over 100,000 KBs costs no more to build or hold than an env over one."""
        if not 0 <= i < self.num_kbs:
            raise IndexError(f"KB index {i} out of range: this env has num_kbs={self.num_kbs}")
        return shared_kb(self.num_entities, len(self.relations), self.kb_seed + i)

    def _draw(self, split: str, index: int, attempt: int) -> tuple[int, str, tuple[str, ...]]:
        """The (KB, start entity, relation chain) of task ``index`` of ``split``: KB ``index % num_kbs``,
        the rest a pure function of ``(that KB's seed, split, index)`` (``attempt`` > 0 only when a
        held-out draw is redrawn)."""
        kb = int(index) % self.num_kbs
        key = [self.kb_seed + kb, _SPLITS[split], int(index)] + ([attempt] if attempt else [])
        rng = np.random.default_rng(key)
        entities = self.kb_at(kb)[0]
        start = entities[int(rng.integers(len(entities)))]
        return kb, start, tuple(self.relations[int(i)] for i in rng.integers(len(self.relations), size=self.num_hops))

    def get_task(self, index: int) -> dict[str, Any]:
        attempt = 0
        kb, start, chain = self._draw(self.split, index, 0)
        while (kb, start, chain) in self._excluded:  # a held-out test question is never one of the training pool's
            attempt += 1
            kb, start, chain = self._draw(self.split, index, attempt)
        chain = list(chain)
        path = [start]
        facts = self.kb_at(kb)[1]
        for r in chain:
            path.append(facts[(path[-1], r)])
        if self.question_style == "nested":
            question = "Who is " + " of ".join(f"the {r}" for r in reversed(chain)) + f' of "{start}"?'
        else:
            question = f'Who is "{start}"' + "".join(f"'s {r}" for r in chain) + "?"
        task = {
            "id": f"factchain-{self.split}-{index}",
            "question": question,
            "answer": path[-1],
            "aliases": [],
            "chain": chain,
            "path": path,
            "kb": kb,
        }
        return self.validate_task(task, f"task {index}")

    def check_task(self, task: Any) -> dict[str, Any]:
        """A task given as ``reset(options={"task": ...})``: the keys (``ToolEnv.check_task``), then
        the same :meth:`validate_task` as every generated task, before the env changes."""
        return self.validate_task(super().check_task(task), "options['task']")

    def validate_task(self, task: dict[str, Any], where: str) -> dict[str, Any]:
        """``task`` if it is a FactChain task this env can run, else ``ValueError`` naming ``where``
        and the key: a non-blank ``question``; ``kb`` (optional, default 0) one of this env's KBs;
        ``chain`` a non-empty list of this env's relations; ``path`` the entities the chain visits
        in that KB, ``len(chain) + 1`` of them from a known start entity; ``answer`` the last of
        them (EM is scored against ``answer``, the hop reward against ``path`` and ``chain``, so
        they must agree)."""

        def bad(key: str, problem: str) -> ValueError:
            return ValueError(f"FactChain {where}: {key!r} {problem}")

        if not isinstance(task.get("question"), str) or not task["question"].strip():
            raise bad("question", f"must be a non-blank string, got {task.get('question')!r:.80}")
        kb = task.get("kb", 0)
        if isinstance(kb, bool) or not isinstance(kb, (int, np.integer)) or not 0 <= int(kb) < self.num_kbs:
            raise bad("kb", f"must be a KB index in [0, {self.num_kbs}) (num_kbs), got {kb!r:.80}")
        chain, path, answer = task["chain"], task["path"], task["answer"]
        if not isinstance(chain, (list, tuple)) or not chain or any(r not in self.relations for r in chain):
            raise bad("chain", f"must be a non-empty list of relations from {list(self.relations)}, got {chain!r:.120}")
        if (
            not isinstance(path, (list, tuple))
            or len(path) != len(chain) + 1
            or not all(isinstance(e, str) for e in path)
        ):
            raise bad(
                "path",
                f"must be a list of {len(chain) + 1} entity names (the start entity and one per "
                f"hop of the chain), got {path!r:.120}",
            )
        facts = self.kb_at(int(kb))[1]
        for h, (entity, relation) in enumerate(zip(path, chain)):
            reached = facts.get((entity, relation))
            if reached is None:
                raise bad(
                    "path",
                    f"starts from {entity!r}, which is no entity of KB {int(kb)}"
                    if h == 0
                    else f"holds {entity!r} at hop {h}, which is no entity of KB {int(kb)}",
                )
            if path[h + 1] != reached:
                raise bad(
                    "path", f"says the {relation} of {entity!r} is {path[h + 1]!r}; in KB {int(kb)} it is {reached!r}"
                )
        if not isinstance(answer, str) or answer != path[-1]:
            raise bad("answer", f"must be the entity at the end of the path, {path[-1]!r}; got {answer!r:.80}")
        return task

    def facts(self, task: dict[str, Any]) -> dict[tuple[str, str], str]:
        """The KB that ``task`` is asked over (KB 0 for a task given without one)."""
        return self.kb_at(task.get("kb", 0))[1]

    def score_answer(self, answer: str, task: dict[str, Any]) -> dict[str, float]:
        return {"em": exact_match(answer, [task["answer"]])}

    def is_success(self, answer_scores: dict[str, float], task: dict[str, Any]) -> bool:
        """Success is naming the entity at the end of the chain: exact match."""
        return answer_scores.get("em", 0.0) >= 1.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)  # a bad task raises here, nothing changed
        self._hops_found: set[int] = set()
        self.tools["lookup"].use_kb(self.facts(self.task))
        return obs, info

    def protocol_demonstration(self, task: dict[str, Any], rng: np.random.Generator) -> list[str]:
        """A demonstration that follows the tool protocol but not the question: one lookup per hop,
        each on the entity the previous lookup returned (the start entity first), with a relation
        drawn uniformly at random, then the last result as the answer. It teaches the call format,
        copying entities and chaining; it does not teach which relation to use or in which order,
        so a policy trained on it succeeds about ``num_relations ** -num_hops`` of the time
        (6% with the defaults). The CPU demo's SFT warm start uses it; RL has to learn the rest."""
        entity, turns = task["path"][0], []
        for _ in range(self.num_hops):
            relation = self.relations[int(rng.integers(len(self.relations)))]
            turns.append(lookup_turn(entity, relation, self.format))
            entity = self.facts(task)[(entity, relation)]
        turns.append(f"<answer>{entity}</answer>")
        return turns

    def reversed_demonstration(self, task: dict[str, Any], rng: np.random.Generator) -> list[str]:
        """A demonstration with one systematic mistake: it looks the relations up in reverse order,
        outermost first (reading "the mentor of the rival of X" left to right), then answers with the
        last result. Calls, copying and chaining are right, so it succeeds only when reversing the
        chain does not change the answer (for 2 hops: when both relations are the same, or by
        chance). ``rng`` is unused; it is there for the common ``DemoPolicy`` signature."""
        entity, turns = task["path"][0], []
        for relation in reversed(task["chain"]):
            turns.append(lookup_turn(entity, relation, self.format))
            entity = self.facts(task)[(entity, relation)]
        turns.append(f"<answer>{entity}</answer>")
        return turns

    def demonstrations(self) -> dict[str, Any]:
        """``oracle``, ``protocol`` and ``reversed`` (``ToolEnv.demonstrations``)."""
        return {
            **super().demonstrations(),
            "protocol": self.protocol_demonstration,
            "reversed": self.reversed_demonstration,
        }

    def process_components(self, outcome: CallOutcome, task: dict[str, Any]) -> dict[str, float]:
        """``hop``: paid once per hop, for the first lookup of that hop's (entity, relation)."""
        args = outcome.call.arguments
        key = (str(args.get("entity", "")).strip(), args.get("relation"))
        for h, step in enumerate(zip(task["path"], task["chain"])):
            if key == step and h not in self._hops_found:
                self._hops_found.add(h)
                return {"hop": self.reward_cfg.extra.get("hop", 0.0)}
        return {}


def lookup_turn(entity: str, relation: str, fmt: ToolCallFormat | None = None) -> str:
    """The assistant turn that calls ``lookup(entity, relation)`` in the tool format ``fmt``
    (hermes when none is given)."""
    return (fmt or HermesFormat()).call_text("lookup", {"entity": entity, "relation": relation})


def oracle_turns(task: dict[str, Any], fmt: ToolCallFormat | None = None) -> list[str]:
    """The assistant turns of a correct episode in the tool format ``fmt`` (hermes when none is
    given): one lookup per hop, then the answer. Used for SFT demonstrations and for
    scripted-policy tests."""
    return [lookup_turn(e, r, fmt) for e, r in zip(task["path"], task["chain"])] + [
        f"<answer>{task['answer']}</answer>"
    ]


def _demonstration(self: FactChainEnv, task: dict[str, Any]) -> list[str]:
    """The oracle (``oracle_turns``) in this env's own tool format."""
    return oracle_turns(task, self.format)


FactChainEnv.demonstration = _demonstration
