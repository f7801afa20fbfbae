"""The generation-backend protocol: token ids in, token ids and their log-probs out.

Every backend (transformers on the CPU, vLLM) implements this. The trainer never decodes text:
prompts are the env's ``input_ids`` and the sampled ids go back to the env verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence, runtime_checkable


class EngineDiedError(RuntimeError):
    """A backend's inference engine died (killed, out of memory, crashed) and was not, or could not
    be, restarted. The message names the engine's process, how it ended and what to do.

    Defined here, without a vllm import, so that code that never imports vllm (the trainer, the Ray
    rollout pool) can catch it; ``trainers.backends.vllm_backend`` raises it."""


@dataclass
class SamplingConfig:
    """How to sample one assistant turn.

    ``max_new_tokens`` caps the turn; ``stop_token_ids`` end it early (the stop token is
    included in the output, as the env expects). ``temperature == 0`` means greedy.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class Generation:
    """One sampled continuation.

    token_ids: (T,) the generated ids, ending with a stop id when ``finish_reason == "stop"``.
    logprobs: (T,) the sampler's log-probability of each generated id (of the distribution it
        sampled from, after temperature), kept to measure backend/trainer mismatch.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


def check_stop_strings(stop_strings: Sequence[Sequence[str]] | None, n: int) -> list[list[str]] | None:
    """``stop_strings`` as n lists of non-empty strings (None when no row has any); else ValueError."""
    if stop_strings is None:
        return None
    if isinstance(stop_strings, str) or len(stop_strings) != n:
        raise ValueError(f"stop_strings must hold one list of strings per prompt ({n}), got {stop_strings!r:.200}")
    out = []
    for row in stop_strings:
        if isinstance(row, str) or not all(isinstance(x, str) and x for x in row):
            raise ValueError(f"each row of stop_strings must be a list of non-empty strings, got {row!r:.200}")
        out.append(list(row))
    return out if any(out) else None


@runtime_checkable
class GenerationBackend(Protocol):
    """Batched token-id generation that can take new policy weights."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
        stop_strings: Sequence[Sequence[str]] | None = None,
    ) -> list[Generation]:
        """Generate one continuation per prompt. ``seeds[i]`` seeds request ``i``; ``stop_strings[i]``
        (optional: only scaffolded envs send them, agent_gym/scaffold.py) are strings that end
        request ``i`` when its text holds one; the token that completes one is kept whole."""
        ...

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Replace the policy weights (a torch ``state_dict`` of the HF causal-LM)."""
        ...

    def close(self) -> None:
        """Release the engine and any worker processes. Idempotent."""
        ...
