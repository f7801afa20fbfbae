"""Perplexity of SmolLM2-135M-Instruct as converted here (Q4_1 GGUF, dequantized to float32) on
real text: the first paragraphs of the shared HotpotQA corpus (Wikipedia, CC BY-SA). Prints and
saves JSON (docs/models/smollm2.md quotes it).

    python benchmarks/experiments/smollm_perplexity.py --docs 64

Each paragraph ("Title\\ntext", as in the corpus's ``contents``) is scored on its own, with the
tokenizer's bos token <|endoftext|> in front and no chat template (the pretraining view of text);
perplexity = exp(total negative log-likelihood / tokens scored), tokens after the first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from agent_gym.provenance import write_raw

DATA = Path(os.environ.get("AGENT_GYM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Perplexity of the converted SmolLM2-135M-Instruct on Wikipedia paragraphs."
    )
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="the model to score (any HF directory too, e.g. the original bf16 SmolLM2-135M-Instruct)",
    )
    ap.add_argument("--corpus", default=str(DATA / "hotpotqa" / "corpus.jsonl"))
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--out", default="runs/smollm_perplexity.json")
    args = ap.parse_args(argv)
    if not Path(args.corpus).is_file():
        raise SystemExit(f"error: corpus {args.corpus} not found (set AGENT_GYM_SHARED_DATA or --corpus)")
    import torch

    from trainers.config import ModelConfig
    from trainers.models import load_policy, load_tokenizer_for

    torch.set_num_threads(args.torch_threads)
    cfg = ModelConfig(name=args.model)
    tok = load_tokenizer_for(cfg)
    model = load_policy(cfg, tok).eval()
    docs = []
    with open(args.corpus) as f:
        for line in f:
            docs.append(json.loads(line)["contents"])
            if len(docs) == args.docs:
                break
    nll, n, t0 = 0.0, 0, time.perf_counter()
    with torch.no_grad():
        for d in docs:
            ids = torch.tensor([[tok.convert_tokens_to_ids("<|endoftext|>")] + tok.encode(d, add_special_tokens=False)])
            logits = model(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
            nll -= float(lp.sum())
            n += ids.shape[1] - 1
    out = {
        "model": args.model,
        "corpus": args.corpus,
        "docs": len(docs),
        "tokens": n,
        "perplexity": math.exp(nll / n),
        "nll_per_token": nll / n,
        "wall_s": time.perf_counter() - t0,
    }
    print(json.dumps(out, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    write_raw(__file__, out, argv=argv, outputs=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
