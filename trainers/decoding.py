"""Decoding strategies at inference: best-of-K by the trained critic, and its controls.

``BestOfK`` wraps a generation backend and is itself one (``generate``, ``load_weights``,
``close``), so the rollout loop (``trainers.rollout.collect``) drives it unchanged: each turn,
for each prompt (an env's whole context so far), it samples K candidate actions and returns one.

- ``value-guided``: the candidate with the highest critic value, ties to the lowest index;
- ``random-of-k``: a uniformly random one of the same K candidates (the fair control: the same
  sampling cost and the same candidates, chosen without the critic).

Candidate ``j`` of prompt ``i`` is sampled with seed ``seeds[i]`` for ``j = 0`` and with a seed
derived from ``(seeds[i], j)`` otherwise, so with K = 1 both modes return exactly what the plain
backend samples with the same seed.

What the critic scores. The PPO critic (``trainers.models.Critic``) is trained on the agent's
tokens only: ``values[:, t] = V(ids[:t])`` at each agent token t, and a turn's reward sits on
its last token. A candidate is scored by the value at its last token, ``V(context + candidate[:-1])``,
the critic's estimate of this turn's reward plus what follows, read at a position the critic was
trained at; when the candidate ends with the stop token (the usual case) that token is all it
does not see. The alternative, stepping a deep copy of the env with each candidate and scoring
the context after the env's response, was not chosen: (1) for an answer candidate the env's
response is the outcome reward itself, so it would select on the gold answer, an oracle that
is not available at test time; (2) every candidate's tool calls would run (K times the tool
cost, and side effects for tools that have them: a search API, a sandbox); (3) the critic is
trained at agent tokens, and the first position after a tool response is one only when another
turn follows. Scoring before the env responds needs nothing from the env.

Costs are counted on the wrapper: ``generated_tokens`` (every candidate's tokens),
``critic_tokens`` (tokens run through the critic: context + candidate, per candidate, a full
forward without a cache), and the seconds spent generating and scoring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from trainers.backends.base import Generation, SamplingConfig
from trainers.rollout import pad_rows

MODES = ("value-guided", "random-of-k")


def candidate_seed(seed: int, j: int) -> int:
    """The sampling seed of candidate ``j`` of a request seeded ``seed`` (candidate 0 keeps it)."""
    if j == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), j]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass
class DecodeCost:
    generated_tokens: int = 0
    critic_tokens: int = 0
    generate_s: float = 0.0
    critic_s: float = 0.0


class BestOfK:
    """A ``GenerationBackend`` that returns one of K sampled candidates per prompt.

    backend: the backend that samples (``HFBackend``, ``VLLMBackend``).
    k: candidates per prompt (>= 1).
    mode: ``value-guided`` (needs ``critic``) or ``random-of-k``.
    critic: a ``trainers.models.Critic`` (a module mapping (B, T) ids and mask to (B, T) values).
    critic_batch: candidates per critic forward.
    """

    def __init__(
        self,
        backend: Any,
        k: int,
        mode: str,
        critic: torch.nn.Module | None = None,
        pad_token_id: int = 0,
        critic_batch: int = 64,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if mode == "value-guided" and critic is None:
            raise ValueError("value-guided decoding needs a critic (a PPO checkpoint's); got none")
        self.backend, self.k, self.mode, self.critic = backend, k, mode, critic
        self.pad_token_id = int(pad_token_id)
        self.critic_batch = critic_batch
        self.cost = DecodeCost()
        self.last_values: list[list[float]] = []
        """The critic values of each prompt's candidates at the last call (value-guided)."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        n, k = len(prompts), self.k
        extra = {} if stop_strings is None else {"stop_strings": [s for s in stop_strings for _ in range(k)]}
        if seeds is None:
            seeds = torch.randint(0, 2**31 - 1, (n,)).tolist()
        if len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
        if sampling.temperature == 0 and k > 1:
            raise ValueError("best-of-K with temperature 0 samples K identical candidates; set a temperature > 0")
        t0 = time.perf_counter()
        # Row i * k + j is candidate j of prompt i.
        gens = self.backend.generate(
            [p for p in prompts for _ in range(k)],
            sampling,
            seeds=[candidate_seed(s, j) for s in seeds for j in range(k)],
            **extra,
        )
        self.cost.generate_s += time.perf_counter() - t0
        self.cost.generated_tokens += sum(len(g.token_ids) for g in gens)
        if self.mode == "random-of-k":
            picks = [int(np.random.default_rng([int(s), k, 1]).integers(k)) for s in seeds]
        else:
            values = self.score([p for p in prompts for _ in range(k)], [g.token_ids for g in gens])
            self.last_values = [values[i * k : (i + 1) * k] for i in range(n)]
            picks = [int(np.argmax(v)) for v in self.last_values]
        return [gens[i * k + j] for i, j in enumerate(picks)]

    @torch.no_grad()
    def score(self, contexts: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]) -> list[float]:
        """The critic's value at each candidate's last token: V(context + candidate[:-1])."""
        t0 = time.perf_counter()
        self.critic.eval()
        rows = [list(c) + list(a) for c, a in zip(contexts, candidates)]
        device = next(self.critic.parameters()).device
        out: list[float] = []
        for s in range(0, len(rows), self.critic_batch):
            chunk = rows[s : s + self.critic_batch]
            ids = pad_rows(chunk, self.pad_token_id, torch.long)  # (b, T) right-padded
            mask = pad_rows([[1] * len(r) for r in chunk], 0, torch.long)  # (b, T)
            values = self.critic(ids.to(device), mask.to(device))  # (b, T): values[:, t] = V(ids[:, :t])
            last = torch.tensor([len(r) - 1 for r in chunk], device=device)  # (b,) each candidate's last token
            out.extend(values.gather(1, last[:, None]).squeeze(1).tolist())
            self.cost.critic_tokens += sum(len(r) for r in chunk)
        self.cost.critic_s += time.perf_counter() - t0
        return out

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        self.backend.load_weights(state_dict)

    def close(self) -> None:
        self.backend.close()


__all__ = ["BestOfK", "DecodeCost", "MODES", "candidate_seed"]
