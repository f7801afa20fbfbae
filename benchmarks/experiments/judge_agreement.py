"""How often does an LLM judge (agent_gym/judge.py) agree with exact match on HotpotQA answers?
SmolLM2-135M-Instruct on vLLM's OpenAI-compatible CPU server judges 100 dev rows, each with four
kinds of candidate answer; the figure is the share of verdicts equal to EM (a figure, not a goal).

    .venv-vllm/bin/python benchmarks/experiments/judge_agreement.py                  # starts vLLM's server
    python benchmarks/experiments/judge_agreement.py --base-url http://127.0.0.1:8000/v1 --model NAME

Data: the first ``--rows`` rows of ``../shared/data/hotpotqa/dev_sample.jsonl`` (HotpotQA dev,
distractor setting; ``--data``). Candidates per row (``KINDS``):

- ``gold``: the gold answer verbatim (EM 1);
- ``gold_surface``: the gold upper-cased with a full stop (``"PARIS."``; EM 1 after the official
  normalization);
- ``gold_sentence``: ``"The answer is <gold>."`` (EM 0, though it means the gold: here a judge
  that disagrees with EM is right);
- ``wrong``: the gold of another row (the next row whose gold differs after normalization, a
  yes/no gold getting the other of yes/no: EM 0, and wrong).

Reported per kind and overall: EM, the judge's yes rate, agreement with EM, Cohen's kappa against
EM, accuracy against the intended label (yes for the three gold kinds, no for ``wrong``), failed
judgments by kind, and the wall time. The judge is the env's (``judge=`` kwarg of the QA envs):
the default rubric (``agent_gym.judge.DEFAULT_RUBRIC``; ``--rubric``), greedy, ``--concurrency``
requests at once, the reply restricted to ``yes`` or ``no`` by vLLM's structured outputs
(``extra_body: {structured_outputs: {choice: [yes, no]}}``; ``--no-choice`` for free text, where a
reply without a verdict is a failed judgment).
Without ``--base-url`` the script serves ``--model-path`` (the converted SmolLM2 directory of
``trainers/smollm.py``) with ``--python``'s vLLM (default: this interpreter) on loopback and stops
it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_gym.provenance import write_raw

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("AGENT_GYM_SHARED_DATA", REPO.parent / "shared" / "data")) / "hotpotqa" / "dev_sample.jsonl"
MODEL = (
    Path(os.environ.get("AGENT_GYM_CACHE") or Path.home() / ".cache" / "agent_gym") / "models" / "smollm2-135m-instruct"
)  # trainers/smollm.py's converted directory
KINDS = ("gold", "gold_surface", "gold_sentence", "wrong")
INTENDED = {"gold": 1.0, "gold_surface": 1.0, "gold_sentence": 1.0, "wrong": 0.0}
CHOICE = {"structured_outputs": {"choice": ["yes", "no"]}}
"""vLLM's structured outputs: the reply is ``yes`` or ``no`` (a free reply of SmolLM2 often has
no verdict: "The gold answer is no.")."""


def candidates(tasks: list[Any]) -> list[dict[str, Any]]:
    """Four candidates per row (``KINDS``), each with its EM against the row's golds."""
    from agent_gym.scoring import exact_match, normalize_answer

    out = []
    for i, t in enumerate(tasks):
        golds = [t.answer, *t.aliases]
        g = normalize_answer(t.answer)
        if g in ("yes", "no"):
            wrong = "no" if g == "yes" else "yes"
        else:
            wrong = next(
                u.answer
                for u in tasks[i + 1 :] + tasks[:i]
                if normalize_answer(u.answer) not in ("yes", "no", g) and not exact_match(u.answer, golds)
            )
        texts = {
            "gold": t.answer,
            "gold_surface": t.answer.upper() + ".",
            "gold_sentence": f"The answer is {t.answer}.",
            "wrong": wrong,
        }
        for kind in KINDS:
            out.append(
                {
                    "row": i,
                    "id": t.id,
                    "question": t.question,
                    "golds": golds,
                    "kind": kind,
                    "answer": texts[kind],
                    "em": exact_match(texts[kind], golds),
                }
            )
    return out


def kappa(pairs: list[tuple[float, float]]) -> float | None:
    """Cohen's kappa of two binary raters."""
    n = len(pairs)
    if not n:
        return None
    po = sum(a == b for a, b in pairs) / n
    pa, pb = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return None if pe == 1 else (po - pe) / (1 - pe)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["failed"] is None]
    pairs = [(r["judge"], r["em"]) for r in ok]
    return {
        "n": len(rows),
        "judged": len(ok),
        "failed": dict(Counter(r["failed"] for r in rows if r["failed"])),
        "em": sum(r["em"] for r in rows) / max(len(rows), 1),
        "judge_yes": sum(r["judge"] for r in ok) / max(len(ok), 1),
        "agreement_with_em": sum(a == b for a, b in pairs) / max(len(pairs), 1),
        "kappa_vs_em": kappa(pairs),
        "accuracy_vs_intended": sum(r["judge"] == INTENDED[r["kind"]] for r in ok) / max(len(ok), 1),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, model: str, name: str, log_path: Path, timeout: float = 600.0):
    """vLLM's OpenAI-compatible server on loopback (float32, eager, a 128 MiB KV cache: the CPU
    settings of docs/vllm.md); returns (process, base URL) once /health answers."""
    port = _free_port()
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--generation-config",
        "vllm",
        "--seed",
        "0",
        "--max-model-len",
        "2048",
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
        "--kv-cache-memory-bytes",
        str(128 << 20),
    ]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM's server exited {proc.returncode}; its log: {log_path}")
        if time.monotonic() > deadline:
            stop_server(proc)
            raise SystemExit(f"vLLM's server not up in {timeout:g} s; its log: {log_path}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(1)


def stop_server(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA), help="HotpotQA rows (a file or folder load_qa reads)")
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server's /v1 URL (default: start vLLM's)")
    ap.add_argument("--model", default="smollm2", help="the served model's name")
    ap.add_argument("--model-path", default=str(MODEL), help="what to serve when the script starts the server")
    ap.add_argument("--python", default=sys.executable, help="the python whose vLLM serves it")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument(
        "--no-choice",
        action="store_true",
        help="free-text verdicts (default: vLLM's structured outputs restrict the reply to yes or no)",
    )
    ap.add_argument("--rubric", default=None, help="the judge's rubric template (default: DEFAULT_RUBRIC)")
    ap.add_argument("--out", default=None, help="also write every verdict as JSONL here")
    args = ap.parse_args(argv)

    from agent_gym.datasets import load_qa
    from agent_gym.judge import DEFAULT_RUBRIC, Judge, JudgeConfig

    tasks = load_qa("hotpotqa", data_path=args.data, split="dev", limit=args.rows)
    cands = candidates(tasks)
    proc = None
    log_path = Path(tempfile.gettempdir()) / f"judge_agreement_vllm_{os.getpid()}.log"
    try:
        t0 = time.monotonic()
        url = args.base_url
        if url is None:
            proc, url = start_server(args.python, args.model_path, args.model, log_path)
        start_s = time.monotonic() - t0
        spec = {
            "base_url": url,
            "model": args.model,
            "timeout_s": args.timeout_s,
            "retries": 1,
            "max_concurrency": args.concurrency,
            "cooldown_s": 0,
            "rubric": args.rubric or DEFAULT_RUBRIC,
        }
        if not args.no_choice:
            spec["extra_body"] = CHOICE
        cfg = JudgeConfig.from_any(spec)
        judge = Judge(cfg)
        t1 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            verdicts = list(pool.map(lambda c: judge.judge(c["question"], c["golds"], c["answer"]), cands))
        judge_s = time.monotonic() - t1
        judge.close()
    finally:
        if proc is not None:
            stop_server(proc)
    log_path.unlink(missing_ok=True)  # kept only when the server failed (its path is in the error)
    rows = [{**c, "judge": v.score, "failed": v.failed, "reply": v.reply} for c, v in zip(cands, verdicts)]
    result = {
        "overall": summarize(rows),
        "by_kind": {k: summarize([r for r in rows if r["kind"] == k]) for k in KINDS},
        "replies": dict(Counter((r["reply"] or "").strip()[:20] for r in rows).most_common(10)),
        "rows": len(tasks),
        "candidates": len(rows),
        "server_start_s": round(start_s, 1),
        "judge_s": round(judge_s, 1),
        "judgments_per_s": round(len(rows) / judge_s, 2),
        "settings": {
            **vars(args),
            "rubric": cfg.rubric,
            "extra_body": cfg.extra_body,
            "temperature": 0.0,
            "max_tokens": cfg.max_tokens,
        },
    }
    o = result["overall"]
    print(
        f"{len(tasks)} rows x {len(KINDS)} kinds = {len(rows)} judgments in {judge_s:.0f} s "
        f"(server start {start_s:.0f} s); failed {o['failed'] or 0}"
    )
    print(f"{'kind':<14} {'EM':>5} {'judge yes':>9} {'agree w/ EM':>11} {'vs intended':>11}")
    for k in (*KINDS, "overall"):
        s = result["by_kind"][k] if k != "overall" else o
        print(
            f"{k:<14} {s['em']:>5.2f} {s['judge_yes']:>9.2f} {s['agreement_with_em']:>11.2f} "
            f"{s['accuracy_vs_intended']:>11.2f}"
        )
    print(f"Cohen's kappa vs EM: {o['kappa_vs_em']}")
    outputs = []
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        outputs.append(args.out)
    write_raw(__file__, result, argv=argv, outputs=outputs)
    return result


if __name__ == "__main__":
    main()
