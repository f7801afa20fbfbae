"""benchmarks/analysis/run_summary.py on a hand-made run directory: the per-window means, the agent's
tokens per turn and the share of turns at the limit from the logged trajectories, and the share of
sampled groups that dynamic sampling dropped, against values worked by hand."""

import json

import pytest

from benchmarks.analysis.run_summary import summarize_run


def make_run(tmp_path, records, spans_by_iter):
    (tmp_path / "config.yaml").write_text("rollout:\n  max_turn_tokens: 10\n")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "trajectories").mkdir()
    for it, spans in spans_by_iter.items():
        lines = [json.dumps({"step_spans": s}) for s in spans]
        (tmp_path / "trajectories" / f"iter_{it:05d}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_windows_turns_and_dropped_groups(tmp_path):
    records = [
        {
            "iteration": 0,
            "rollout/f1": 0.1,
            "time/iteration_s": 60.0,
            "dynamic/dropped_groups": 3,
            "dynamic/kept_groups": 3,
        },
        {
            "iteration": 1,
            "rollout/f1": 0.3,
            "time/iteration_s": 120.0,
            "dynamic/dropped_groups": 1,
            "dynamic/kept_groups": 3,
        },
        {"iteration": 2, "rollout/f1": 0.5, "time/iteration_s": 60.0, "eval/f1": 0.25, "eval/em": 0.125},
    ]
    spans = {0: [[[0, 4], [6, 16]], [[0, 2], [5, 8]]], 2: [[[0, 10]]]}  # turn lengths 4, 10; 2, 3; 10
    out = summarize_run(make_run(tmp_path, records, spans), window=2, turn_limit=None)

    assert out["turn_limit"] == 10 and out["iterations"] == 3
    assert out["wall_min"] == pytest.approx(4.0)
    first, second = out["windows"]
    assert first["iterations"] == [0, 1] and second["iterations"] == [2, 2]
    assert first["rollout/f1"] == pytest.approx(0.2) and second["rollout/f1"] == pytest.approx(0.5)
    assert first["dynamic/dropped_groups"] == pytest.approx(2.0)
    assert first["no_spread_group_share"] == pytest.approx(4 / 10)
    assert second["no_spread_group_share"] is None  # no dynamic sampling logged there
    assert second["dynamic/dropped_groups"] is None
    assert first["agent_tokens_by_turn"] == {"1": 3.0, "2": 6.5}
    assert first["logged_trajectories"] == 2
    assert first["turns_at_token_limit"] == pytest.approx(1 / 4)
    assert second["turns_at_token_limit"] == pytest.approx(1.0)
    assert out["evals"] == [{"iteration": 2, "eval/f1": 0.25, "eval/em": 0.125}]


def test_an_empty_metrics_file_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit, match="holds no records"):
        summarize_run(tmp_path, window=2, turn_limit=None)
