"""Policy, critic and reference models.

- the policy is an ``AutoModelForCausalLM`` from a hub name or a local directory, ``tiny``: a
  small Qwen2 built in code (tests and the CPU demo; no download), or a named model
  (``smollm2-135m-instruct``: ``trainers/smollm.py``, converted once into a cache directory);
- the critic (PPO) is a backbone plus a scalar head, ``Critic``; it starts from the policy's
  weights, as is usual for PPO on language models;
- the reference model for KL is a frozen copy of the starting policy.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from typing import Any

import torch
from torch import nn

from agent_gym.cli_errors import UserError
from agent_gym.tokenizer import load_tokenizer
from trainers import smollm
from trainers.algos import entropy_from_logits, logprobs_from_logits
from trainers.config import ModelConfig
from trainers.hf_save import save_policy  # noqa: F401  (its callers import it from here too)
from trainers.tiny_model import build_tiny_qwen2


class ModelLoadError(UserError, ValueError):
    pass


MODEL_CHOICES = (
    "a model directory (e.g. runs/RUN/model, written by agent-gym-sft), tiny, smollm2-135m-instruct, "
    "or a hub name such as Qwen/Qwen2.5-3B-Instruct (online)"
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
"""A hub repository id, ``owner/name``."""


def check_model_source(name: str, what: str = "model", choices: str = MODEL_CHOICES) -> None:
    """Raise ``ModelLoadError`` naming ``name`` and what to pass (``choices``), before transformers
    looks at the network, when ``name`` is none of: ``tiny``, a named model, an existing model directory
    (one with ``config.json``), a hub id ``owner/name`` (with ``HF_HUB_OFFLINE=1``: one in the local
    cache). A name that looks like a path (``./x``, ``/x``, ``~/x``, ``a/b/c``) or is a bare word that is
    no directory here is a missing directory, not a hub name."""
    if name == "tiny" or smollm.is_alias(name):
        return
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return
        if os.path.isfile(os.path.join(path, "model", "config.json")):
            hint = f"pass {os.path.join(name, 'model')} (the run's model directory)"
        elif os.path.isdir(os.path.join(path, "checkpoints")):
            hint = f"it is an RL run: agent-gym-eval --checkpoint {name} evaluates its policy; or pass {choices}"
        else:
            hint = f"pass {choices}"
        raise ModelLoadError(f"{what} {name!r} is a directory but not a model directory (no config.json); {hint}")
    if os.path.exists(path):
        raise ModelLoadError(f"{what} {name!r} is a file, not a model directory; pass {choices}")
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or ".." in name or not HUB_ID.match(name):
        raise ModelLoadError(
            f"{what} {name!r} does not exist (no directory {os.path.abspath(path)}, and not a hub "
            f"name owner/name); pass {choices}"
        )
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache  # deferred: transformers' dependency, for offline runs

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ModelLoadError(
                f"{what} {name!r}: no such directory here, and the hub model is not in the local cache "
                f"while HF_HUB_OFFLINE=1; download it online first (unset HF_HUB_OFFLINE) or pass "
                f"{choices}"
            )


def named_model(name: str | None) -> str | None:
    """A named model's local directory (``smollm2-135m-instruct``: converted once into the cache,
    ``trainers/smollm.py``), else ``name`` unchanged."""
    if name is not None and smollm.is_alias(name):
        try:
            return smollm.ensure_converted()
        except smollm.SmolLMUnavailable as e:
            raise ModelLoadError(str(e)) from e
    return name


def load_tokenizer_for(model: ModelConfig):
    """The tokenizer of the model section ``model`` (``tokenizer``, else the model's own)."""
    m = model
    init_from = named_model(m.init_from)
    if init_from and not os.path.isdir(os.path.expanduser(init_from)):
        raise ModelLoadError(
            f"init_from path {m.init_from!r} does not exist. Pass an existing HF model "
            "directory (e.g. the model/ folder of an SFT run: make demo writes runs/factchain_sft_stream/model)."
        )
    if m.tokenizer is not None:
        return load_tokenizer(m.tokenizer)
    if m.name == "tiny":
        return load_tokenizer(init_from) if init_from else load_tokenizer(None)
    check_model_source(m.name, "model.name")
    source = named_model(m.name)
    try:
        return load_tokenizer(source)
    except ValueError as e:  # a hub name that could not be fetched, a directory without a tokenizer
        raise ModelLoadError(f"model.name {m.name!r}: {e}") from e


def load_policy(model: ModelConfig, tokenizer: Any, seed: int = 0) -> nn.Module:
    """The trainable policy of the model section ``model``, in train mode, on ``model.device``;
    ``seed`` initialises the ``tiny`` model (the RL trainer passes ``run.seed``)."""
    m = model
    if str(m.device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"model.device is {m.device!r}, but torch sees no CUDA GPU on this machine "
            f"(torch {torch.__version__}); pass model.device=cpu, or run on a GPU machine"
        )
    dtype = getattr(torch, m.dtype)
    source = named_model(m.init_from or (None if m.name == "tiny" else m.name))
    if source is None:
        policy = build_tiny_qwen2(
            tokenizer,
            seed=seed,
            hidden_size=m.tiny_hidden_size,
            num_layers=m.tiny_layers,
            num_heads=max(2, m.tiny_hidden_size // 32),
            num_kv_heads=1,
            head_dim=32,
        )
    else:
        policy = _from_pretrained(source, dtype)
    use_gqa_sdpa(policy)
    return policy.to(device=m.device, dtype=dtype).train()


GQA_SDPA = "agent_gym_sdpa"
"""transformers' SDPA attention, except that on the CPU grouped-query attention with a mask runs as
one SDPA call with ``enable_gqa`` instead of keys and values repeated to every head (``use_gqa_sdpa``)."""


def _gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """``sdpa_attention_forward`` with one change: a CPU call with a mask and grouped KV heads passes
    ``enable_gqa=True`` to SDPA rather than materializing ``repeat_kv``'s (B, heads, T, D) copies,
    which a training forward keeps for the backward (with 9 query heads over 3 KV heads, three times
    the keys' and values' memory). transformers repeats them whenever a mask is given, because CUDA's
    fused kernels reject a mask with ``enable_gqa``; torch's CPU flash kernel takes both (the
    outputs are identical: tests/trainers/test_gqa_sdpa.py). The boolean mask, the same tensor in every
    layer, goes to SDPA as an additive float mask made once per forward (``_additive``): given the
    boolean one, the CPU kernel converts it in every layer and keeps each copy for the backward."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # deferred: transformers

    groups = getattr(module, "num_key_value_groups", 1)
    if (
        query.device.type != "cpu"
        or attention_mask is None
        or groups == 1
        or kw.get("position_bias") is not None
        or kw.get("cache") is not None
        or kw.get("output_attentions", False)
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kw)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=_additive(attention_mask, query.dtype),
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as SDPA's additive one (0 where attended, -inf elsewhere, as torch
    converts it), made once per mask tensor: kept on the boolean tensor, which lives as long as the
    forward that built it."""
    if mask.dtype != torch.bool:
        return mask
    cached = getattr(mask, "_agent_gym_additive", None)
    if cached is None or cached.dtype != dtype:
        cached = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        mask._agent_gym_additive = cached
    return cached


def use_gqa_sdpa(model: nn.Module) -> None:
    """Switch a transformers model that attends with ``sdpa`` to ``GQA_SDPA`` (registered with
    transformers' ``AttentionInterface`` and, with SDPA's masks, ``AttentionMaskInterface``). Other
    implementations (eager, flash-attention) are left as they are."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return
    from transformers import AttentionInterface  # deferred: transformers
    from transformers.masking_utils import (  # deferred: transformers
        ALL_MASK_ATTENTION_FUNCTIONS,
        AttentionMaskInterface,
        sdpa_mask,
    )

    if GQA_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(GQA_SDPA, _gqa_sdpa_forward)
        AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
    model.set_attn_implementation(GQA_SDPA)


def _from_pretrained(source: str, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM  # deferred: transformers (seconds) stays out of the trainer's import

    check_model_source(source)
    try:
        return AutoModelForCausalLM.from_pretrained(os.path.expanduser(source), dtype=dtype)
    except Exception as e:
        raise ModelLoadError(
            f"could not load model {source!r}: {type(e).__name__}: {e}. Check the path or hub "
            "name, and that the hub is reachable (set HF_HUB_OFFLINE=1 with a local cache)."
        ) from e


class Critic(nn.Module):
    """V(tokens_<t): a causal-LM backbone with a scalar head on each position's hidden state."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    share_prefix = False
    """Run the rows' common prefix once (``decoder_hidden``; the trainer sets it from ``scale.share_prefix``)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T) values, where values[:, t] = V(ids[:, :t]) and values[:, 0] = 0."""
        h = decoder_hidden(self.backbone, input_ids, attention_mask, self.share_prefix)  # (B, T, H)
        # (B, T-1): hidden at t-1 scores token t; a bf16 backbone's hidden goes to the float32 head
        v = self.head(h[:, :-1].to(self.head.weight.dtype)).squeeze(-1).float()
        return torch.nn.functional.pad(v, (1, 0))  # (B, T)


def frozen_copy(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


MIN_SHARED_PREFIX = 32
"""The shortest common prefix ``decoder_hidden`` computes once for all rows; below it the plain
batched forward is as cheap (two forwards instead of one have their own overhead)."""


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading positions every row of a right-padded batch shares, token for token (all
    real tokens), capped so that every row keeps at least one token of its own after it."""
    if input_ids.shape[0] < 2:
        return 0
    same = ((input_ids == input_ids[:1]) & (attention_mask > 0)).all(0)  # (T,)
    n = int(same.long().cumprod(0).sum())  # the leading run of positions where every row agrees
    return max(0, min(n, int(attention_mask.sum(-1).min()) - 1))


def decoder_hidden(
    decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefix: bool = False
) -> torch.Tensor:
    """The decoder's last hidden states, (B, T, H). ``share_prefix``: when the rows begin with the
    same ``P >= MIN_SHARED_PREFIX`` tokens (a GRPO group's prompt, ``shared_prefix_len``), those
    are run once, as one row, and the rest of every row runs on top of their keys and values,
    expanded to the batch; the prefix's hidden states are the same for every row and its gradient is
    the sum of the rows' (autograd through the expansion). The values equal the plain forward's up
    to float rounding (the matmuls' shapes differ). Under gradient checkpointing (training) both
    passes are checkpointed layer by layer (``_shared_prefix_caches``); a decoder whose layers are not
    transformers' checkpointing layers runs the plain forward there. The plain forward where the
    rows share less."""
    n = shared_prefix_len(input_ids, attention_mask) if share_prefix else 0
    checkpointing = decoder.training and getattr(decoder, "gradient_checkpointing", False)
    if n < MIN_SHARED_PREFIX or (checkpointing and not _checkpoints_with_cache(decoder)):
        # no KV cache: HF builds one when the config's use_cache is on (it is, outside checkpointing),
        # keeping every layer's keys and values to the end of a no-grad scoring forward, and a
        # compiled layer would recompile for each of its entries
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    record, read_only = _shared_prefix_caches()
    b, t = input_ids.shape
    layers = list(decoder.layers) if checkpointing else []
    use_cache = not checkpointing  # the caches are ours either way; under checkpointing HF would warn of it
    for layer in layers:  # keep the caches under checkpointing: they are never written twice (below)
        layer._can_checkpoint_with_cache = True
    try:
        cache = record()
        head = decoder(
            input_ids=input_ids[:1, :n],
            attention_mask=attention_mask[:1, :n],
            past_key_values=cache,
            use_cache=use_cache,
        ).last_hidden_state  # (1, n, H)
        rows = read_only()
        for i, layer in enumerate(cache.layers):  # the prefix's keys and values, a view for every row
            rows.keep(layer.keys.expand(b, -1, -1, -1), layer.values.expand(b, -1, -1, -1), i)
        rest = decoder(
            input_ids=input_ids[:, n:],
            attention_mask=attention_mask,  # prefix and rest: the cache's positions come first
            past_key_values=rows,
            use_cache=use_cache,
            position_ids=torch.arange(n, t, device=input_ids.device)[None].expand(b, -1),
        ).last_hidden_state  # (B, T - n, H)
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class's False
    return torch.cat([head.expand(b, -1, -1), rest], 1)


def trains_with_shared_prefix(model: nn.Module, gradient_checkpointing: bool) -> bool:
    """Whether a training forward of ``model`` (a causal LM, LoRA-wrapped or not) with
    ``share_prefix`` runs the shared prompt once (``decoder_hidden``): always without gradient
    checkpointing; under it, only when its decoder's layers are transformers' checkpointing layers.
    Otherwise that forward is the plain one, every row at its full length."""
    return not gradient_checkpointing or _checkpoints_with_cache(model.get_decoder())


def _checkpoints_with_cache(decoder: nn.Module) -> bool:
    """Whether every layer of ``decoder`` is a transformers ``GradientCheckpointingLayer`` (the
    class whose ``_can_checkpoint_with_cache`` keeps a cache under checkpointing)."""
    from transformers.modeling_layers import GradientCheckpointingLayer  # deferred: transformers, on this path only

    layers = list(getattr(decoder, "layers", []))
    return bool(layers) and all(isinstance(x, GradientCheckpointingLayer) for x in layers)


@functools.cache
def _shared_prefix_caches() -> tuple[type, type]:
    """The two caches of ``decoder_hidden``, transformers' ``DynamicCache`` with ``update`` changed
    so that a layer recomputed by gradient checkpointing sees what it saw the first time:

    - the prefix pass's cache records each layer's keys and values on the layer's first call and
      returns the states it is given (the prefix has no past); the backward's recompute of that
      layer calls it again and gets its own states back, nothing recorded twice;
    - the rows' cache holds the prefix's states (``keep``) and returns them followed by the states
      it is given, recording nothing, so the forward and its recompute read the same keys.

    The tensors kept carry their autograd history, so the prefix's gradient is the rows' sum."""
    from transformers import DynamicCache  # deferred: transformers' cache, on this path only

    class RecordOnce(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx >= len(self.layers) or not self.layers[layer_idx].is_initialized:
                super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return key_states, value_states

    class ReadOnly(DynamicCache):
        def keep(self, keys, values, layer_idx):  # the states themselves (views stay views), not a copy
            super().update(keys[..., :0, :], values[..., :0, :], layer_idx)
            self.layers[layer_idx].keys, self.layers[layer_idx].values = keys, values

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            layer = self.layers[layer_idx]
            return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)

    return RecordOnce, ReadOnly


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    with_entropy: bool = False,
    temperature: float = 1.0,
    loss_mask: torch.Tensor | None = None,
    entropy_grad: bool = True,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(ids[:, t] | ids[:, :t]) for every t, (B, T) with column 0 = 0; optionally the
    entropy of each position's distribution, (B, T). ``entropy_grad=False`` computes the entropy
    without autograd (a monitor, not a loss term: no (B, T, V) intermediates kept for a backward).

    ``temperature`` divides the logits, so the policy being scored and optimized is the one the
    backend sampled from (``temperature == 0``, greedy, scores the plain softmax).

    With ``loss_mask`` (B, T), only the positions under it are scored (0 elsewhere): the output
    projection and softmax run on those hidden states alone. On a tiny model the vocabulary
    projection is most of the compute, and agent tokens are a minority of a multi-turn context
    (about 30% on the CPU demo), so this is the fast path for the trainer's losses. The values
    under the mask are the same as without it (up to float rounding). ``share_prefix`` (with
    ``loss_mask``): the rows' common prefix runs once (``decoder_hidden``; ``scale.share_prefix``)."""
    head = model.get_output_embeddings() if loss_mask is not None else None
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        lp = torch.nn.functional.pad(logprobs_from_logits(logits, input_ids[:, 1:]), (1, 0))  # (B, T)
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = torch.nn.functional.pad(entropy_from_logits(logits), (1, 0))
        return lp, ent
    hidden = decoder_hidden(model.get_decoder(), input_ids, attention_mask, share_prefix)  # (B, T, H)
    sel = loss_mask[:, 1:] > 0  # (B, T-1): position t-1 predicts token t
    logits = head(hidden[:, :-1][sel]).float()  # (N, V)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    lp = torch.zeros(input_ids.shape, dtype=logits.dtype, device=logits.device)
    lp[:, 1:][sel] = logprobs_from_logits(logits[None], input_ids[:, 1:][sel][None])[0]
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = torch.zeros_like(lp)
            ent[:, 1:][sel] = entropy_from_logits(logits[None])[0]
    return lp, ent
