"""TRL: ``GRPOTrainer`` trains on an agent_gym env through TRL's ``rollout_func``.

TRL's extension point (read in the installed ``trl/trainer/grpo_trainer.py``, TRL 1.13):
``GRPOTrainer(..., rollout_func=f)`` calls ``f(prompts, trainer)`` with the prompts of one
generation batch, already repeated ``num_generations`` times in a row by TRL's sampler, and
expects a dict with ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one list per prompt).
Any other key is forwarded to the reward functions as a per-sample column, except ``env_mask``,
which TRL takes as its ``tool_mask``: 1 on the model's tokens, 0 on tokens the environment wrote.
TRL multiplies it into the completion mask, so the GRPO loss, the KL term, the entropy and the
token counts see only the model's tokens.

:class:`EnvRollout` is such a function. For each prompt it plays one whole multi-turn episode in
a :class:`~agent_gym.vector.ToolVectorEnv` with TRL's own model (unwrapped from the accelerator),
sampling each turn with the project's transformers backend and
:func:`trainers.rollout.collect`, and hands TRL the env's :class:`~agent_gym.episode.Episode`
unchanged:

- ``prompt_ids``: the episode's first ``prompt_len`` ids (system prompt and question);
- ``completion_ids``: every id after them, exactly as the env appended them: the agent's turns
  verbatim and the env's tokens (tool responses, turn closers) between them;
- ``env_mask``: the env's ``loss_mask`` over the completion (1 exactly on the sampled tokens);
- ``logprobs``: the sampler's log-prob of each agent token, 0.0 on env tokens (masked anyway);
- ``env_reward``: the episode's return (the sum of its step rewards, outcome included), read by
  the reward function :func:`env_reward`; ``env_success`` and ``env_turns`` ride along for logs.

Nothing is decoded and re-encoded: the ids TRL trains on are the ids the env built.

TRL's ``prompt`` column is only a key here: TRL passes ``rollout_func`` the prompts and nothing
else from the row, so :meth:`EnvRollout.dataset` writes each task's rendered prompt text as
``prompt`` and the rollout maps it back to the task. GRPO in TRL scores whole completions, so
per-step process rewards count through the return only (they are not placed on their tokens as the
project's own trainer does).

It lives in ``trainers/`` (it was ``agent_gym.integrations.trl`` until 2026-11-25): a TRL rollout
is torch code by nature, and it reuses the trainer's rollout loop, which already plays episodes
token-exactly; ``agent_gym`` imports neither torch nor ``trainers`` (docs/design.md, "Layers").
Torch, TRL and ``datasets`` are imported when used, not at import. Example and limits:
docs/integrations.md.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from agent_gym.episode import Episode
from agent_gym.factory import EnvFactory
from agent_gym.tokenizer import load_tokenizer

__all__ = ["EnvRollout", "env_reward"]


def env_reward(completions: list, env_reward: list[float], **kwargs: Any) -> list[float]:
    """A TRL reward function: the env's episode return, which :class:`EnvRollout` passes as the
    ``env_reward`` column. Pass it in ``reward_funcs``; TRL logs it as ``rewards/env_reward/mean``,
    and this function logs the env's ``env/success_rate`` and ``env/turns_mean`` through TRL's
    ``log_metric``."""
    if len(env_reward) != len(completions):
        raise ValueError(
            f"got {len(env_reward)} env rewards for {len(completions)} completions; env_reward "
            "reads the column EnvRollout returns, so use it with rollout_func=EnvRollout(...)"
        )
    log_metric = kwargs.get("log_metric")
    if log_metric is not None and kwargs.get("env_success") and kwargs.get("env_turns"):
        log_metric("env/success_rate", float(np.mean(kwargs["env_success"])))
        log_metric("env/turns_mean", float(np.mean(kwargs["env_turns"])))
    return [float(r) for r in env_reward]


class EnvRollout:
    """A TRL ``rollout_func`` that plays whole episodes of ``env_id``.

    Args:
        env_id: a registered id (``AgentR1/FactChain-v0``...).
        env_kwargs: keyword arguments for the env (limits, rewards...), except ``tokenizer`` and
            ``vocab_size``: the env takes the tokenizer given here and the vocabulary size of the
            model TRL passes (its embedding table may be padded past the tokenizer).
        tokenizer: the env's tokenizer (object, path, hub name; None: the built-in one). It must
            be TRL's ``processing_class``, with the same vocabulary; a call checks this.
        max_turn_tokens: the most tokens sampled in one assistant turn (the env's
            ``max_context_tokens`` bounds the whole episode).
        seed: sampling seeds derive from ``(seed, trainer.state.global_step, call)``.
        env_server: ``http://host:port`` of a ``python -m agent_gym.serve`` process serving ``env_id``
            with these env kwargs and the model's vocabulary size: the episodes are played there
            (TRL's OpenEnv pattern); the prompts of :meth:`dataset` are still rendered in-process.

    The envs come from one ``agent_gym.factory.EnvFactory`` (``self.env_factory``); an existing one
    is passed with :meth:`from_factory`.

    After each call, ``last_episodes`` holds the episodes it returned, in order.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        tokenizer: Any = None,
        max_turn_tokens: int = 64,
        seed: int = 0,
        env_server: str | None = None,
    ):
        if env_id not in gym.registry:
            raise ValueError(
                f"unknown env id {env_id!r}; import agent_gym first, or pick one of "
                f"{sorted(k for k in gym.registry if k.startswith('AgentR1/'))}"
            )
        if not isinstance(max_turn_tokens, int) or max_turn_tokens <= 0:
            raise ValueError(f"max_turn_tokens must be a positive integer, got {max_turn_tokens!r}")
        taken = sorted({"tokenizer", "vocab_size"} & set(env_kwargs or {}))
        if taken:
            raise ValueError(
                f"pass the tokenizer as EnvRollout(tokenizer=...), not in env_kwargs {taken}; the "
                "vocabulary size comes from the model TRL trains"
            )
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.tokenizer = load_tokenizer(tokenizer)
        self.env_factory = EnvFactory(env_id, self.env_kwargs, self.tokenizer, server=env_server)
        self._checked_tokenizer: Any = None
        self.max_turn_tokens = max_turn_tokens
        self.seed = int(seed)
        self._vec: Any = None  # ToolVectorEnv, rebuilt when the batch size or the vocabulary changes
        self._vec_key: tuple[int, int | None] | None = None
        self._prompt_to_task: dict[str, int] = {}
        self._calls = 0
        self.last_episodes: list[Episode] = []

    @classmethod
    def from_factory(cls, env_factory: Any, max_turn_tokens: int = 64, seed: int = 0) -> EnvRollout:
        """An ``EnvRollout`` on an existing ``EnvFactory``'s id, env kwargs, tokenizer and server (its
        ``vocab_size`` is not used: it comes from the model TRL trains)."""
        return cls(
            env_factory.env_id,
            env_factory.env_kwargs,
            env_factory.tokenizer,
            max_turn_tokens=max_turn_tokens,
            seed=seed,
            env_server=env_factory.server,
        )

    # -- the dataset TRL iterates --------------------------------------------------------------

    def dataset(self, task_indices: Sequence[int]):
        """A ``datasets.Dataset`` for ``GRPOTrainer(train_dataset=...)``: one row per task, with
        ``prompt`` (the task's rendered prompt text, the key the rollout maps back to the task) and
        ``task_index``. Two indices whose prompts read the same must be the same task (apart from its
        id): the policy cannot tell them apart, and TRL gives the rollout only the prompt."""
        from datasets import Dataset  # optional: datasets (extra trl)

        env = self._envs(1).envs[0]
        prompts, indices = [], []
        for k in task_indices:
            obs, _ = env.reset(options={"task_index": int(k)})
            text = env.tokenizer.decode(obs["input_ids"].tolist(), skip_special_tokens=False)
            first = self._prompt_to_task.setdefault(text, int(k))
            if first != int(k) and _task_body(env.get_task(first)) != _task_body(env.get_task(int(k))):
                raise ValueError(
                    f"tasks {first} and {k} of {self.env_id} render the same prompt but are different "
                    "tasks; the policy cannot tell them apart. Leave one of them out of task_indices."
                )
            prompts.append(text)
            indices.append(int(k))
        if not prompts:
            raise ValueError("task_indices is empty; pass the indices of the tasks to train on")
        return Dataset.from_dict({"prompt": prompts, "task_index": indices})

    # -- the rollout ---------------------------------------------------------------------------

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        from trainers.backends.base import SamplingConfig  # deferred: torch stays out of this module's import
        from trainers.backends.hf_backend import HFBackend  # deferred: torch stays out of this module's import
        from trainers.rollout import collect  # deferred: torch stays out of this module's import

        tasks = []
        for p in prompts:
            if not isinstance(p, str) or p not in self._prompt_to_task:
                raise ValueError(
                    f"prompt {str(p)[:80]!r} is not one of this rollout's tasks: build GRPOTrainer's "
                    "train_dataset with EnvRollout.dataset(task_indices) on the same EnvRollout"
                )
            tasks.append(self._prompt_to_task[p])
        args = trainer.args
        if getattr(trainer, "use_vllm", False):
            raise ValueError("EnvRollout samples in-process with TRL's model; set GRPOConfig(use_vllm=False)")
        for name, off in (("min_p", None), ("repetition_penalty", 1.0), ("generation_kwargs", None)):
            if getattr(args, name, off) not in (off, {}):
                raise ValueError(f"EnvRollout honours temperature, top_p and top_k only; unset GRPOConfig.{name}")
        sampling = SamplingConfig(
            max_new_tokens=self.max_turn_tokens,
            temperature=float(args.temperature),
            top_p=float(args.top_p),
            top_k=int(args.top_k) if args.top_k else -1,
        )
        model = trainer.accelerator.unwrap_model(trainer.model)
        self._check_tokenizer(trainer.processing_class)
        pad = self.env_factory.pad_id
        vocab = int(model.get_output_embeddings().weight.shape[0])
        was_training = model.training  # HFBackend puts the model in eval mode; TRL reads .training after us
        seed = int(np.random.SeedSequence([self.seed, trainer.state.global_step, self._calls]).generate_state(1)[0])
        self._calls += 1
        try:
            backend = HFBackend(
                model, pad_token_id=pad, device=trainer.accelerator.device, tokenizer=trainer.processing_class
            )
            trajs, _ = collect(self._envs(len(tasks), vocab), backend, tasks, 1, sampling, seed=seed & 0x7FFFFFFF)
        finally:
            model.train(was_training)
        out: dict[str, list] = {
            k: []
            for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward", "env_success", "env_turns")
        }
        for tr in trajs:
            ep, n = tr.episode, tr.episode.prompt_len
            out["prompt_ids"].append(ep.token_ids[:n])
            out["completion_ids"].append(ep.token_ids[n:])
            out["env_mask"].append(ep.loss_mask[n:])
            out["logprobs"].append(tr.sampler_logprobs[n:])
            out["env_reward"].append(ep.reward)
            out["env_success"].append(float(ep.success))
            out["env_turns"].append(ep.turns)
        self.last_episodes = [tr.episode for tr in trajs]
        return out

    def _envs(self, n: int, vocab_size: int | None = None):
        """The rollout's vector env (on ``env_server`` when set), or with ``vocab_size=None`` an
        in-process one that renders :meth:`dataset`'s prompts."""
        if self._vec_key != (n, vocab_size):
            if self._vec is not None:
                self._vec.close()
                self._vec, self._vec_key = None, None  # nothing stale if the new one fails
            factory = self.env_factory.replace(vocab_size=vocab_size)
            self._vec = (factory.local() if vocab_size is None else factory).make_vector(n)
            self._vec_key = (n, vocab_size)
        return self._vec

    def _check_tokenizer(self, processing_class: Any) -> None:
        """TRL decodes, pads and logs with its ``processing_class``; the env encodes with ours."""
        if processing_class is self._checked_tokenizer or processing_class is self.tokenizer:
            return
        if getattr(processing_class, "get_vocab", lambda: None)() != self.tokenizer.get_vocab():
            raise ValueError(
                "GRPOTrainer's processing_class has a different vocabulary from the env's tokenizer; "
                "pass the same tokenizer to both (EnvRollout(tokenizer=...), processing_class=...)"
            )
        self._checked_tokenizer = processing_class


def _task_body(task: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in task.items() if k != "id"}
