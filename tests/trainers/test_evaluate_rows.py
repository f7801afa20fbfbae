"""trainers/evaluate.py on any rows file in the normalized layout (issue 18): ``--env-kwargs
'{data_path: FILE}'`` over a checkpoint's env settings, and ``--tasks`` beyond the file's rows.
Before: a file with fewer rows than ``--tasks`` (default 100) raised "task_index 1 out of range"."""

import json
from pathlib import Path

import pytest

from trainers import evaluate
from trainers.config import TrainConfig
from trainers.trainer import Trainer

QA = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
ROWS = QA / "normalized_dev.jsonl"  # one row: "In which town was the director of The Glass Orchard born?"


def _questions(out: Path) -> list[str]:
    return [json.loads(x)["text"] for x in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_scripted_policy_on_a_short_rows_file(tmp_path):
    assert evaluate.main(["--env", "AgentR1/HotpotQA-v0", "--policy", "oracle", "--tasks", "100",
                          "--env-kwargs", f"{{data_path: {ROWS}}}", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["eval/success_rate"] == 1.0


@pytest.mark.timeout(300)
def test_checkpoint_on_rows_it_never_saw(tmp_path):
    run = tmp_path / "run"
    cfg = TrainConfig(run_dir=str(run), algo="grpo", env_id="AgentR1/HotpotQA-v0", iterations=1, tasks_per_iter=2,
                      group_size=2, minibatch_size=4, max_turn_tokens=8, eval_every=100, eval_tasks=2,
                      tensorboard=False, progress_bar=False, torch_threads=1, checkpoint_every=1,
                      env_kwargs={"data_path": str(QA / "hotpotqa"), "max_turns": 2}, eval_env_kwargs={"split": "dev"})
    tr = Trainer(cfg)
    tr.setup()
    tr.train()
    tr.cleanup()
    out = tmp_path / "eval"
    assert evaluate.main(["--checkpoint", str(run), "--env-kwargs", f"{{data_path: {ROWS}}}", "--max-turn-tokens", "8",
                          "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["env"] == "AgentR1/HotpotQA-v0" and summary["checkpoint"]
    row = json.loads(ROWS.read_text().splitlines()[0])
    assert all(row["question"] in q for q in _questions(out))
    # A truncated state.pt named directly is refused with one clear line naming it, not a traceback.
    ckpt = sorted((run / "checkpoints").glob("iter_*"))[-1]
    data = (ckpt / "state.pt").read_bytes()
    (ckpt / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit, match=r"error: --checkpoint .*iter_\d+: checkpoint .*Pass the run directory"):
        evaluate.main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "eval2")])
