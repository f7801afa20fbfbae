"""``fsdp: true`` (trainers/distributed.py): two torchrun processes on the CPU (gloo) run the same
iterations as one process with the same seed, for GRPO and for PPO with a critic: the same batch
statistics (rewards, tokens, turns) per iteration, the same advantage and loss metrics, and after
the updates the same policy, critic and AdamW state (within float rounding) in rank 0's checkpoint,
which is in the single-process layout. Plus the errors of a wrong launch or combination.

The tiny model is random, so every episode gets the same reward: GRPO's advantages are 0 and its
update comes from the entropy bonus and the KL loss (both aggregated over the batch, so the
ranks' re-weighting is exercised); PPO's rewards (a penalty per turn without an action) give the
critic targets and whitened GAE advantages over the whole batch. PPO also runs micro-batches
(uneven per rank: zero-weight fillers), seq-mean-token-mean aggregation, KL in the reward and
clipping at a gradient norm the update exceeds. GRPO then goes on for a third iteration twice from the
2-process run's checkpoint: resumed under torchrun, and resumed by one process without fsdp; both
match the uninterrupted single-process run's third iteration."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import torch
import yaml

from tests.helpers import kill_all
from trainers.backends import process_guard
from trainers.config import ConfigError, TrainConfig

ROOT = Path(__file__).resolve().parents[2]

COMMON = dict(
    env_id="AgentR1/FactChain-v0",
    eval_env_kwargs={"split": "test"},
    iterations=2,
    tasks_per_iter=4,
    group_size=2,
    minibatch_size=4,
    max_turn_tokens=12,
    eval_every=100,
    eval_tasks=1,
    tensorboard=False,
    progress_bar=False,
    torch_threads=1,
    lr=1e-3,
    kl_coef=0.05,
    # AdamW's default eps 1e-8 turns float32 rounding in the reduction order into updates of a
    # sizeable part of lr where a gradient is ~1e-8 (embedding rows of tokens seen only in tool
    # results: second moment ~1e-15); with the word-free tokenizer (9f39328) such rows moved by
    # up to 1.9e-4 between the two layouts. 1e-6 damps them; the FSDP arithmetic is unchanged.
    adam_eps=1e-6,
    env_kwargs={"num_tasks": 16, "tools_in_prompt": False, "rewards": {"no_action": -0.1, "call_invalid": -0.2}},
)
RUNS = {
    "grpo": dict(algo="grpo", entropy_coef=0.01, kl_mode="loss"),
    "ppo": dict(
        algo="ppo", kl_mode="reward", loss_agg="seq-mean-token-mean", max_tokens_per_microbatch=400, max_grad_norm=0.1
    ),
}
PARAM_ATOL = 2e-5  # float32, lr 1e-3; measured max |difference|: GRPO policy 3.0e-6 (3 iterations), PPO 2.1e-7 (2)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_state(run_dir: Path) -> dict:
    from trainers.checkpoint import latest_checkpoint, load_checkpoint

    return load_checkpoint(latest_checkpoint(run_dir))


@contextlib.contextmanager
def torchrun(*args: str) -> Iterator[subprocess.Popen]:
    """``torchrun --standalone --nproc_per_node 2 *args`` on the CPU, output (both streams) piped.
    torchrun starts each rank in a session of its own, so killing torchrun's process group misses
    them: every process it starts carries a token in its environment (process_guard's mark, which a
    rank keeps when re-parented), and whatever still runs when the block ends is killed."""
    token = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        process_guard.ENV_VAR: token,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_all(process_guard.marked_pids(token))  # the ranks (none left after a clean exit)
        if proc.returncode is None:
            proc.communicate(timeout=30)  # the pipe closes now that no rank holds it


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both algorithms, each as one process and as two torchrun processes (launched first, so the
    single-process runs go on while they start); GRPO's 2-process run resumed for a third
    iteration by 2 processes and, from a copy, by one (the single-process run does 3 at once)."""
    from trainers.compose import resume_config, run

    tmp = tmp_path_factory.mktemp("fsdp")
    steps = []
    for algo, kw in RUNS.items():
        path = tmp / f"{algo}.yaml"
        path.write_text(yaml.safe_dump({**COMMON, **kw, "run_dir": str(tmp / f"{algo}_fsdp")}))
        steps.append([algo, "--config", str(path), "fsdp=true"])
    steps += [
        ["copy", str(tmp / "grpo_fsdp"), str(tmp / "grpo_resumed_single")],
        ["grpo", "--resume", str(tmp / "grpo_fsdp"), "iterations=3"],
    ]
    with torchrun("tests/trainers/fsdp_trainer_worker.py", *map(json.dumps, steps)) as proc:
        for algo, kw in RUNS.items():
            run(
                TrainConfig(
                    **{**COMMON, **kw, "run_dir": str(tmp / f"{algo}_single"), "iterations": 3 if algo == "grpo" else 2}
                )
            )
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    copy = tmp / "grpo_resumed_single"
    run(resume_config(copy, {"iterations": 3, "fsdp": False, "run_dir": str(copy)}), resume=True)
    return tmp, out


def assert_same_iterations(a: list[dict], b: list[dict]) -> None:
    assert [m["iteration"] for m in a] == [m["iteration"] for m in b]
    for ma, mb in zip(a, b):
        for k, v in ma.items():
            if k.startswith(("rollout/", "tools/", "reward/")):  # the batch: rewards, tokens, turns
                assert mb[k] == v, (ma["iteration"], k, v, mb[k])
            elif k.startswith(("adv/", "policy/", "value/", "kl", "eval/")):
                assert mb[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (ma["iteration"], k, v, mb[k])


def max_param_diff(sa: dict, sb: dict, key: str) -> float:
    assert sb[key].keys() == sa[key].keys()
    return max(float((sb[key][k] - sa[key][k]).abs().max()) for k in sa[key])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("algo", list(RUNS))
def test_two_fsdp_processes_match_one_process(runs, algo):
    tmp, out = runs
    single, fsdp = tmp / f"{algo}_single", tmp / f"{algo}_fsdp"
    a, b = metrics(single), metrics(fsdp)
    assert len(b) == len(a) == (3 if algo == "grpo" else 2)  # GRPO's third: resumed under torchrun
    assert_same_iterations(a, b)
    assert a[-1]["rollout/agent_tokens_mean"] > 0 and a[-1]["policy/total_loss"] != 0

    sa, sb = final_state(single), final_state(fsdp)
    assert sa["iteration"] == sb["iteration"] == len(a) - 1
    from trainers.models import load_policy, load_tokenizer_for

    cfg = TrainConfig(**{**COMMON, **RUNS[algo]})
    start = load_policy(
        cfg.model, load_tokenizer_for(cfg.model), seed=cfg.run.seed
    ).state_dict()  # the seed's initial weights
    for key in ("policy", "critic") if algo == "ppo" else ("policy",):
        diff = max_param_diff(sa, sb, key)
        assert diff <= PARAM_ATOL, (key, diff)
        print(f"{algo} {key}: max |fsdp - single| = {diff:.3g}")
    moved = max(float((sa["policy"][k] - start[k]).abs().max()) for k in start)
    assert moved > 50 * PARAM_ATOL  # the updates are far larger than the tolerance
    # the gathered optimizer state is in the single-process layout: it loads into a plain AdamW
    policy = load_policy(cfg.model, load_tokenizer_for(cfg.model), seed=cfg.run.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.algorithm.lr)
    opt.load_state_dict(sb["opt"])
    for i, st in sa["opt"]["state"].items():
        torch.testing.assert_close(opt.state_dict()["state"][i]["exp_avg_sq"], st["exp_avg_sq"], rtol=1e-3, atol=1e-12)
    assert yaml.safe_load((fsdp / "config.yaml").read_text())["scale"]["fsdp"] is True and not (fsdp / "tb").exists()


@pytest.mark.timeout(400)
def test_one_process_resumes_a_fsdp_checkpoint(runs):
    tmp, _ = runs
    single, resumed = tmp / "grpo_single", tmp / "grpo_resumed_single"
    assert_same_iterations(metrics(single), metrics(resumed))
    diff = max_param_diff(final_state(single), final_state(resumed), "policy")
    assert diff <= PARAM_ATOL
    print(f"grpo resumed by one process from the fsdp checkpoint: max |difference| = {diff:.3g}")


@pytest.mark.timeout(300)
def test_the_training_script_under_torchrun_exits_zero_and_reports(tmp_path):
    """``torchrun ... trainers/train_grpo.py --config C fsdp=true``, as a user runs it (the other tests
    drive the trainer through fsdp_trainer_worker.py): both ranks exit 0, ending through
    ``exit_rank`` (docs/scaling.md "Exit"), and rank 0's summary line, the first iteration's
    logged reward, reaches the pipe."""
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump({**COMMON, **RUNS["grpo"], "iterations": 1, "run_dir": str(tmp_path / "run")}))
    with torchrun("trainers/train_grpo.py", "--config", str(path), "fsdp=true") as proc:
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-4000:]
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and set(summaries[0]) >= {"rollout/reward_mean", "eval/success_rate"}, out[-4000:]
    assert summaries[0]["rollout/reward_mean"] == pytest.approx(
        metrics(tmp_path / "run")[0]["rollout/reward_mean"], abs=1e-4
    )


def test_fsdp_without_torchrun_names_the_command(monkeypatch, capsys, tmp_path):
    from trainers.cli import main

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert main("grpo", [f"run.run_dir={tmp_path}", "rollout.env_id=AgentR1/FactChain-v0", "scale.fsdp=true"]) == 2
    err = capsys.readouterr().err
    assert "torchrun --nproc_per_node" in err and "WORLD_SIZE" in err
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "kw,key",
    [(dict(backend="vllm"), "backend"), (dict(rollout_workers=2), "rollout.workers"), (dict(lora_r=8), "lora_r")],
)
def test_fsdp_refuses_a_wrong_combination_naming_the_key(kw, key):
    from trainers.compose import check

    with pytest.raises(ConfigError, match=f"fsdp: true does not combine with {key}"):
        check(TrainConfig(fsdp=True, env_id="AgentR1/FactChain-v0", **kw))


def test_fsdp_shares_must_divide_evenly(monkeypatch):
    from trainers.compose import build_trainer, check
    from trainers.parallel import SingleProcess

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    cfg = TrainConfig(fsdp=True, env_id="AgentR1/FactChain-v0", tasks_per_iter=4, group_size=2, minibatch_size=8)
    with pytest.raises(ConfigError, match="tasks_per_iter=4 must be a multiple of the number of processes"):
        check(cfg)
    with pytest.raises(ConfigError, match="tasks_per_iter=4 must be a multiple of the number of processes"):
        build_trainer(cfg)  # the trainer gets the FSDP strategy the config asks for
    with pytest.raises(ConfigError, match="scale.fsdp: true needs a parallelism strategy that shards the models"):
        build_trainer(cfg, parallel=SingleProcess())  # a single-process strategy refuses to run fsdp
    with pytest.raises(ConfigError, match="multi-agent"):
        check(TrainConfig(fsdp=True, env_id="AgentR1/FactChainTeam-v0"))
