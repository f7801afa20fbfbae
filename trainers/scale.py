"""Memory and precision for models that do not fit as written: each piece is a config key, off
by default (docs/scaling.md has the memory budget and the multi-GPU commands).

- ``max_tokens_per_microbatch``: a minibatch is cut into micro-batches whose padded size
  (rows x longest row) stays within the budget; their gradients are accumulated with weights that
  make the sum equal to the full minibatch's loss (``microbatches``), so one optimizer step sees
  the same gradient as without micro-batching, up to float rounding. The weights come from the
  ``units`` the aggregation was registered with (``register_agg(name, units=...)``, ``agg_units``).
- ``mixed_precision: bf16``: forwards run under ``torch.autocast(dtype=bfloat16)`` while the
  parameters, their gradients and AdamW's moments stay float32 (master weights). Pure-bf16 AdamW
  loses small updates: bf16 has 8 mantissa bits, so an update of lr=1e-6 to a weight of ~1e-2
  rounds away.
- ``gradient_checkpointing``: transformers' ``gradient_checkpointing_enable`` on the policy and
  the critic's backbone (non-reentrant ``torch.utils.checkpoint``): activations of each decoder
  layer are recomputed in the backward pass instead of kept.
- ``lora_r > 0``: LoRA adapters through ``peft`` on the policy (and on the critic's backbone);
  the base weights are frozen. The KL reference is then the same module with its adapters
  disabled (``AdapterOffReference``): no second copy of the model.
- ``fsdp``: ``fsdp_wrap`` shards a causal LM with torch's FSDP2 (``fully_shard``), one unit per
  decoder layer, the decoder and the head (untied embeddings) and the root; tested on 2 CPU processes (gloo), where the gathered gradients equal
  the single-process ones. The Trainer runs it under torchrun with the ``trainers.distributed.FSDP`` strategy
  (``trainers.compose.REFUSALS`` refuses the keys it does not combine with).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn

from agent_gym.cli_errors import UserError
from agent_gym.heap import libc_function
from trainers.algos.registry import AGG_UNITS, resolve
from trainers.config import agg_units_problem
from trainers.hf_save import save_policy
from trainers.models import MIN_SHARED_PREFIX, frozen_copy, shared_prefix_len, token_logprobs


class ScaleConfigError(UserError, ValueError):
    pass


def agg_units(agg: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ``units`` an aggregation was registered with (``register_agg(name, units=...)``): a
    function of the (B, T) loss mask counting its denominator, by which micro-batches and FSDP
    ranks re-weight their losses to the minibatch's. Raises ``ScaleConfigError`` when ``agg`` has none
    (such a run is refused at start: ``trainers.compose.REFUSALS``, ``trainers.config.agg_units_problem``)."""
    problem = agg_units_problem(agg)
    if problem is not None:
        raise ScaleConfigError(problem)
    return resolve(AGG_UNITS, agg)


# ----------------------------------------------------------------------------- micro-batches


def pack_by_tokens(lengths: list[int], max_tokens: int | None) -> list[list[int]]:
    """Rows grouped into micro-batches whose padded size, rows x longest row, is at most
    ``max_tokens``; longest rows first, so that rows of similar length share a micro-batch (less
    padding). A row longer than the budget gets a micro-batch of its own (it cannot be split).
    ``max_tokens=None``: one micro-batch with every row, in order."""
    if max_tokens is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)  # the first row of a micro-batch is its longest
        else:
            out.append([i])
    return out


def pack_by_prefix(
    lengths: list[int], group_ids: list[int], prefix_lens: dict[int, int], max_tokens: int | None
) -> list[list[int]]:
    """Rows grouped into micro-batches of one group each (rows of a group share its prompt,
    ``scale.share_prefix``), in order of first appearance; a group whose shared cost, prefix +
    rows x (longest row - prefix), exceeds ``max_tokens`` is cut into several, longest rows first.
    ``prefix_lens``: each group's shared prefix length."""
    order: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        order.setdefault(g, []).append(i)
    out: list[list[int]] = []
    for g, rows in order.items():
        p = prefix_lens.get(g, 0)
        rows = sorted(rows, key=lambda i: -lengths[i])
        part: list[int] = []
        for i in rows:  # the first row of a part is its longest
            if part and max_tokens is not None and p + (len(part) + 1) * (lengths[part[0]] - p) > max_tokens:
                out.append(part)
                part = []
            part.append(i)
        out.append(part)
    return out


def prefix_parts(mb: Any, max_tokens: int | None) -> list[list[int]]:
    """``pack_by_prefix`` of a ``RolloutBatch``: its groups (``group_ids``), each group's shared
    prefix measured on its rows' tokens (``shared_prefix_len``). The rows of groups that share
    less than ``MIN_SHARED_PREFIX`` tokens (a group of one row, prompts that differ) gain nothing
    from a micro-batch of their own: they are packed together by tokens (``pack_by_tokens``)."""
    lengths = [int(n) for n in mb.attention_mask.sum(-1).tolist()]
    gids = [int(g) for g in mb.group_ids.tolist()]
    prefix, loose = {}, []
    for g in dict.fromkeys(gids):
        rows = [i for i, x in enumerate(gids) if x == g]
        n = shared_prefix_len(mb.input_ids[rows], mb.attention_mask[rows])
        if n >= MIN_SHARED_PREFIX:
            prefix[g] = n
        else:
            loose += rows
    shared = [i for i, g in enumerate(gids) if g in prefix]
    parts = pack_by_prefix([lengths[i] for i in shared], [gids[i] for i in shared], prefix, max_tokens)
    parts = [[shared[j] for j in part] for part in parts]
    if loose:
        parts += [[loose[j] for j in part] for part in pack_by_tokens([lengths[i] for i in loose], max_tokens)]
    return parts


def microbatches(mb: Any, max_tokens: int | None, agg: str, by_prefix: bool = False) -> list[tuple[Any, float]]:
    """``(micro_batch, weight)`` pairs for a minibatch ``mb`` (a ``RolloutBatch``), each micro-batch
    trimmed to its longest row. ``sum(weight * aggregate(loss, micro.loss_mask))`` equals
    ``aggregate(loss, mb.loss_mask)`` for an aggregation registered with ``units`` (``agg_units``):
    the weight is the micro-batch's share of the denominator (loss tokens for token-mean, rows with
    a loss token for the seq-mean modes). Without a budget: ``[(mb trimmed, 1.0)]``, the plain path.
    ``by_prefix``: one group per micro-batch (``pack_by_prefix``), the budget counting a group's
    shared prefix once."""
    if by_prefix:
        groups = prefix_parts(mb, max_tokens)
    else:
        groups = pack_by_tokens([int(n) for n in mb.attention_mask.sum(-1).tolist()], max_tokens)
    if len(groups) == 1:
        return [(trim(mb), 1.0)]
    units = agg_units(agg)
    total = float(units(mb.loss_mask))
    out = []
    for g in groups:
        part = trim(mb.select(torch.tensor(g)))
        out.append((part, float(units(part.loss_mask)) / total if total > 0 else 1.0 / len(groups)))
    return out


def trim(mb: Any) -> Any:
    """Cut a batch's right padding to its longest row."""
    t = int(mb.attention_mask.sum(-1).max())
    kw = {k: (v[:, :t] if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in mb.__dict__.items()}
    return type(mb)(**kw)


def forward_positions(mb: Any, share_prefix: bool) -> int:
    """The positions a forward over micro-batch ``mb`` runs (padding included): ``B x T``, or with
    ``share_prefix`` and a shared prefix of ``n >= MIN_SHARED_PREFIX`` tokens ``n + B x (T - n)``
    (``decoder_hidden``). The activations a training forward keeps grow with it."""
    b, t = mb.input_ids.shape
    n = shared_prefix_len(mb.input_ids, mb.attention_mask) if share_prefix else 0
    return n + b * (t - n) if n >= MIN_SHARED_PREFIX else b * t


def combine_metrics(parts: list[tuple[dict[str, Any], float]]) -> dict[str, float]:
    """A minibatch's metrics from its micro-batches': the weighted sum (a token or row mean under
    the aggregation's weights), except ``*_max`` keys, which take the maximum."""
    out: dict[str, float] = {}
    for m, w in parts:
        for k, v in m.items():
            v = float(v)
            if k.endswith("_max"):
                out[k] = max(out.get(k, v), v)
            else:
                out[k] = out.get(k, 0.0) + w * v
    return out


# ----------------------------------------------------------------------------- precision


def autocast(mixed_precision: str, device: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(bfloat16)`` on ``device``'s type with ``mixed_precision`` ``bf16``
    (``scale.mixed_precision``), else nothing."""
    if mixed_precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer updates (all of them, or the adapters under LoRA)."""
    return [p for p in module.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- models


def prepare_models(cfg: Any, policy: nn.Module, critic: nn.Module | None) -> tuple[nn.Module, nn.Module | None, Any]:
    """Apply LoRA and gradient checkpointing as configured; return ``(policy, critic, reference)``
    where the reference is None without ``kl_coef``, the policy with adapters off under LoRA, and a
    frozen copy of the starting policy otherwise."""
    if cfg.scale.gradient_checkpointing:
        enable_checkpointing(policy)
        if critic is not None:
            enable_checkpointing(critic.backbone)
    if cfg.scale.lora_r > 0:
        policy = add_lora(policy, cfg.scale)
        if critic is not None:
            critic.backbone = add_lora(critic.backbone, cfg.scale)
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = AdapterOffReference(policy) if cfg.scale.lora_r > 0 else frozen_copy(policy)
    return policy, critic, ref


def prepare_process(model_cfg: Any, scale_cfg: Any) -> None:
    """What a training process sets before it loads a model: ``model.torch_threads`` and
    ``scale.release_freed_memory`` (``release_freed_memory``)."""
    if model_cfg.torch_threads:
        torch.set_num_threads(model_cfg.torch_threads)
    if scale_cfg.release_freed_memory:
        release_freed_memory()


MMAP_THRESHOLD = 1 << 20
"""Allocations of this many bytes or more get their own mapping, returned to the system when freed."""


def release_freed_memory() -> bool:
    """Fix glibc malloc's mmap threshold and trim threshold at ``MMAP_THRESHOLD``, so that large
    blocks (a step's activations and logits) go back to the system when torch frees them. glibc's
    default threshold starts at 128 KiB but rises to the size of each mmapped block freed (up to
    32 MiB), after which such blocks come from the heap and stay resident, fragmented: the process
    then holds a step's transient peak long after the step. Returns whether it applied (False on a
    C library without ``mallopt``: musl, macOS, Windows)."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, MMAP_THRESHOLD))


def enable_checkpointing(model: nn.Module) -> None:
    if not hasattr(model, "gradient_checkpointing_enable"):
        raise ScaleConfigError(
            f"gradient_checkpointing: {type(model).__name__} is not a transformers model "
            "(it has no gradient_checkpointing_enable)"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "config"):
        model.config.use_cache = False  # a KV cache is useless when training and warns under checkpointing


def add_lora(model: nn.Module, scale: Any) -> nn.Module:
    """``peft.get_peft_model`` with ``LoraConfig(r, lora_alpha, lora_dropout, target_modules)`` of the
    ``scale`` section (``ScaleConfig``); the base weights are frozen and the adapters are float32
    (peft upcasts them from a bf16 base)."""
    try:
        from peft import LoraConfig, get_peft_model  # optional: peft (extra scale)
    except ImportError as e:
        raise ScaleConfigError("lora_r > 0 needs peft: pip install -e '.[scale]'") from e
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in scale.lora_target_modules if t not in names]
    if missing:
        raise ScaleConfigError(
            f"lora_target_modules {missing} are not module names of {type(model).__name__}; "
            f"its linear layers include {sorted(n for n in names if n.endswith('_proj'))}"
        )
    lcfg = LoraConfig(
        r=scale.lora_r,
        lora_alpha=scale.lora_alpha,
        lora_dropout=scale.lora_dropout,
        target_modules=list(scale.lora_target_modules),
        bias="none",
    )
    return get_peft_model(model, lcfg)


class AdapterOffReference:
    """The KL reference under LoRA: the policy's own module with its adapters disabled (peft's
    ``disable_adapter`` context), i.e. the frozen base model, without a copy."""

    def __init__(self, policy: nn.Module):
        self.policy = policy

    @contextlib.contextmanager
    def active(self) -> Iterator[nn.Module]:
        with self.policy.disable_adapter():
            yield self.policy


def ref_logprobs(ref: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw: Any) -> torch.Tensor:
    """``token_logprobs`` under the reference (a frozen module or an ``AdapterOffReference``)."""
    if isinstance(ref, AdapterOffReference):
        with ref.active() as model:
            return token_logprobs(model, input_ids, attention_mask, **kw)[0]
    return token_logprobs(ref, input_ids, attention_mask, **kw)[0]


def is_peft(model: Any) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def inference_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under plain transformers names, for an inference engine (vLLM's
    ``load_weights``, a saved HF directory). Under LoRA: every adapted weight merged,
    ``W + scale * B @ A``, computed out of place (the trained module is not touched)."""
    if not is_peft(policy):
        return policy.state_dict()
    from peft.tuners.lora import LoraLayer  # optional: peft (extra scale)

    base = policy.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    lora_prefixes = []
    for name, mod in base.named_modules():
        if isinstance(mod, LoraLayer):
            lora_prefixes.append(name + ".")
            w = mod.get_base_layer().weight
            delta = sum(mod.get_delta_weight(a) for a in mod.active_adapters)
            merged[name + ".weight"] = (w + delta.to(w.dtype)).detach()
            if mod.get_base_layer().bias is not None:
                merged[name + ".bias"] = mod.get_base_layer().bias.detach()
    for k, v in base.state_dict().items():
        if any(k.startswith(p) for p in lora_prefixes):
            continue  # base_layer / lora_A / lora_B entries: replaced by the merged weight above
        merged[k] = v
    return merged


def save_for_inference(policy: nn.Module, tokenizer: Any, path: Any) -> str:
    """``models.save_policy`` for a plain or a LoRA policy (the latter saved merged)."""
    if not is_peft(policy):
        return save_policy(policy, tokenizer, path)
    return save_policy(policy.get_base_model(), tokenizer, path, state_dict=inference_state_dict(policy))


# ----------------------------------------------------------------------------- FSDP


def fsdp_wrap(model: nn.Module, mesh: Any = None, mp_bf16: bool = False) -> nn.Module:
    """Shard a transformers causal LM with FSDP2 (``torch.distributed.fsdp.fully_shard``): each
    decoder layer is one unit (its parameters are gathered just before its forward and freed
    after); with untied embeddings the decoder (embeddings, final norm) and the output head are
    units of their own, so ``models.token_logprobs``'s masked path, which calls the decoder and the
    head directly, works; the root holds what is left. With tied embeddings the head shares the
    embedding's parameter, so both stay in the root unit and callers must go through the root's
    forward (``token_logprobs`` without ``loss_mask``). Needs an initialised process group
    (``torchrun``). ``mp_bf16``: bf16 compute with float32 sharded master weights and float32
    gradient reduction (``MixedPrecisionPolicy``). FSDP averages gradients over ranks: a rank's
    loss must be its share of the global loss times the world size for the sum to come out."""
    from torch.distributed.fsdp import (  # deferred: ~1 s of import, only with scale.fsdp
        MixedPrecisionPolicy,
        fully_shard,
    )

    kw: dict[str, Any] = {"mesh": mesh} if mesh is not None else {}
    if mp_bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ScaleConfigError(f"fsdp_wrap: {type(model).__name__} has no decoder .layers to shard")
    for layer in layers:
        fully_shard(layer, **kw)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and decoder is not model and head.weight is not model.get_input_embeddings().weight:
        fully_shard(decoder, **kw)
        fully_shard(head, **kw)
    fully_shard(model, **kw)
    return model


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as a full (unsharded) tensor; FSDP2 keeps them as DTensors."""
    out = {}
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad
        out[n] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out
