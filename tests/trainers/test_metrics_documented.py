"""Every metric a training run logs is in docs/metrics.md: a row names it, or a pattern covers it
(``reward/<component>``, ``time/<phase>_s``, ``eval/<name>`` for every rollout metric and
``eval/<set>/...`` for each evaluation set). One iteration of the tiny model for each algorithm
family, with the optional features that add metrics turned on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.trainers.conftest import tiny_rl_config
from trainers.compose import build_trainer

ROOT = Path(__file__).resolve().parents[2]


def documented() -> list[re.Pattern]:
    """One regular expression per backticked metric name in docs/metrics.md, ``<x>`` standing for
    any one path segment (or part of one). A family named in prose (``rollout/*``) documents
    nothing by itself."""
    text = (ROOT / "docs/metrics.md").read_text()
    names = set(re.findall(r"`([a-z][a-z0-9_]*/[A-Za-z0-9_/<>.-]+|iteration)`", text))
    return [re.compile("[^/]+".join(map(re.escape, re.split(r"<[^>]+>", n)))) for n in names]


def undocumented(keys: set[str], pats: list[re.Pattern]) -> list[str]:
    """The keys no pattern covers. ``eval/<name>`` and ``eval/<set>/<name>`` repeat a metric of the
    sampled episodes for the greedy ones (docs/metrics.md, "Evaluation"): ``<name>`` is documented
    as ``rollout/<name>``, or as itself (``tools/...``, ``reward/...``, ``monitor/...``), or as an
    ``eval/`` row of its own."""

    def known(key: str) -> bool:
        return any(p.fullmatch(key) for p in pats)

    out = []
    for k in sorted(keys):
        candidates = {k}
        for m in (re.fullmatch(r"eval/(.+)", k), re.fullmatch(r"eval/[a-z0-9_]+/(.+)", k)):
            if m:
                candidates |= {m.group(1), "rollout/" + m.group(1), "eval/" + m.group(1)}
        if not any(known(c) for c in candidates):
            out.append(k)
    return out


def test_the_matcher_finds_what_the_docs_leave_out():
    pats = [re.compile(r"reward/[^/]+"), re.compile("rollout/em"), re.compile("iteration")]
    assert undocumented({"reward/hop", "eval/em", "eval/heldout/em", "iteration"}, pats) == []
    assert undocumented({"perf/new_thing", "eval/heldout/new_thing"}, pats) == [
        "eval/heldout/new_thing",
        "perf/new_thing",
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "algo,kw",
    [
        (
            "grpo",
            dict(dynamic_sampling=True, overlong="soft", overlong_max_tokens=60, overlong_buffer=20, kl_coef=0.05),
        ),
        ("ppo", dict(group_size=1, overlong="mask")),
    ],
)
def test_every_logged_metric_is_documented(tmp_path, sft_model, algo, kw):
    cfg = tiny_rl_config(
        tmp_path,
        algo,
        sft_model,
        iterations=2,
        eval_every=1,
        eval_sets={"heldout": {"split": "test"}},
        max_tokens_per_microbatch=512,
        **kw,
    )
    tr = build_trainer(cfg)
    tr.setup()
    try:
        tr.train()
    finally:
        tr.cleanup()
    keys: set[str] = set()
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(line))
    assert {"iteration", "rollout/reward_mean", "perf/rss_gib", "perf/max_microbatch_positions"} <= keys
    assert any(k.startswith("eval/heldout/") for k in keys)
    missing = undocumented(keys, documented())
    assert not missing, f"logged but not in docs/metrics.md: {missing}"
