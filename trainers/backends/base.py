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


@runtime_checkable
class GenerationBackend(Protocol):
    """Batched token-id generation that can take new policy weights."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Generate one continuation per prompt. ``seeds[i]`` seeds request ``i``."""
        ...

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Replace the policy weights (a torch ``state_dict`` of the HF causal-LM)."""
        ...

    def close(self) -> None:
        """Release the engine and any worker processes. Idempotent."""
        ...
