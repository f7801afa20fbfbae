"""trainers/evaluate.py on any rows file in the normalized layout: ``--env-kwargs
'{data_path: FILE}'`` over a checkpoint's env settings, and ``--tasks`` beyond the file's rows.
Before: a file with fewer rows than ``--tasks`` (default 100) raised "task_index 1 out of range"."""

import json
from pathlib import Path

import pytest

from trainers import evaluate
from trainers.compose import build_trainer
from trainers.config import TrainConfig

QA = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
ROWS = QA / "normalized_dev.jsonl"  # one row: "In which town was the director of The Glass Orchard born?"


def _questions(out: Path) -> list[str]:
    return [json.loads(x)["text"] for x in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_scripted_policy_on_a_short_rows_file(tmp_path):
    assert (
        evaluate.main(
            [
                "--env",
                "AgentR1/HotpotQA-v0",
                "--policy",
                "oracle",
                "--tasks",
                "100",
                "--env-kwargs",
                f"{{data_path: {ROWS}}}",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 1 and summary["eval/success_rate"] == 1.0


@pytest.mark.timeout(300)
def test_checkpoint_on_rows_it_never_saw(tmp_path):
    run = tmp_path / "run"
    cfg = TrainConfig(
        run_dir=str(run),
        algo="grpo",
        env_id="AgentR1/HotpotQA-v0",
        iterations=1,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=8,
        eval_every=100,
        eval_tasks=2,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        checkpoint_every=1,
        env_kwargs={"data_path": str(QA / "hotpotqa"), "max_turns": 2},
        eval_env_kwargs={"split": "dev"},
    )
    tr = build_trainer(cfg)
    tr.setup()
    tr.train()
    tr.cleanup()
    out = tmp_path / "eval"
    assert (
        evaluate.main(
            [
                "--checkpoint",
                str(run),
                "--env-kwargs",
                f"{{data_path: {ROWS}}}",
                "--max-turn-tokens",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_lora_checkpoint_loads_with_its_adapters(tmp_path, algo):
    """A LoRA run saves the adapter-wrapped policy (and critic): ``--checkpoint`` wraps the same way,
    loads, and merges, so the evaluated policy computes what the trained one did. Before: the bare
    model refused the wrapped state dict (every key missing)."""
    import torch

    run = tmp_path / "run"
    cfg = TrainConfig(
        run_dir=str(run),
        algo=algo,
        env_id="AgentR1/HotpotQA-v0",
        iterations=1,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=8,
        eval_every=100,
        eval_tasks=2,
        lr=1e-2,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        checkpoint_every=1,
        lora_r=4,
        env_kwargs={"data_path": str(QA / "hotpotqa"), "max_turns": 2},
        eval_env_kwargs={"split": "dev"},
    )
    tr = build_trainer(cfg)
    tr.setup()
    tr.train()
    # A tiny random model's first update may carry no signal (all advantages 0, lora_B still 0): give
    # the adapters (and the critic's) values of their own, then checkpoint that state.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in [*tr.policy.named_parameters(), *(tr.critic.named_parameters() if tr.critic else [])]:
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    tr.checkpoint(5)
    ids = torch.tensor([[5, 17, 42, 9, 3, 11]])
    with torch.no_grad():
        want = tr.policy(input_ids=ids).logits
        base = tr.policy.get_base_model()
        with tr.policy.disable_adapter():
            untrained = tr.policy(input_ids=ids).logits
    tr.cleanup()
    assert not torch.allclose(want, untrained)  # the adapters learned something
    _, _, _, policy, critic = evaluate.load_checkpoint_models(str(run))
    assert not hasattr(policy, "peft_config") and type(policy) is type(base)  # merged back to a plain model
    with torch.no_grad():
        assert torch.allclose(policy(input_ids=ids).logits, want, atol=1e-5)
    assert (critic is not None) == (algo == "ppo")
    out = tmp_path / "eval"
    assert (
        evaluate.main(
            [
                "--checkpoint",
                str(run),
                "--env-kwargs",
                f"{{data_path: {ROWS}}}",
                "--max-turn-tokens",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
