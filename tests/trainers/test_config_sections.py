"""The sectioned config (trainers/config.py): sections that check themselves, old flat keys
mapped with a deprecation warning (configs and checkpoints written before the sections resume),
one spelling per key once built (no flat alias), no env named by any default, no torch to check a
config."""

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from trainers.config import (
    FLAT_KEYS,
    AlgorithmConfig,
    ConfigDeprecationWarning,
    ConfigError,
    EvalConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    ScaleConfig,
    TrainConfig,
    from_dict,
    load_config,
    to_dict,
)
from trainers.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SECTIONS = (ModelConfig, RolloutConfig, AlgorithmConfig, ScaleConfig, RunConfig, EvalConfig)


def _cls(path):
    return SFTConfig if "train_sft" in path.read_text().splitlines()[0] else TrainConfig


def _flatten(d, cls):
    """A sectioned config dict written the old way: every key flat, by its old name."""
    from trainers.config import flat_keys

    old = {v: k for k, v in flat_keys(cls).items()}
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and any((key, k) in old for k in value):
            out.update({old[(key, k)]: v for k, v in value.items()})
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_written_flat_loads_the_same_with_a_warning_naming_the_new_places(path, tmp_path):
    cls = _cls(path)
    cfg = load_config(path, cls=cls)
    flat = _flatten(yaml.safe_load(path.read_text()), cls)
    assert not any(
        isinstance(v, dict) and k in ("model", "rollout", "algorithm", "run", "scale") for k, v in flat.items()
    )
    (tmp_path / "flat.yaml").write_text(yaml.safe_dump(flat))
    with pytest.warns(
        ConfigDeprecationWarning, match=r"flat config keys are deprecated; read as .*model -> model\.name"
    ):
        old = load_config(tmp_path / "flat.yaml", cls=cls)
    assert old == cfg


def test_a_config_from_before_the_sections_loads_with_each_key_in_its_place():
    with pytest.warns(ConfigDeprecationWarning) as rec:
        cfg = load_config(DATA / "flat_factchain_ppo.yaml")
    msg = str(rec[0].message)
    for moved in (
        "lr -> algorithm.lr",
        "env_kwargs -> rollout.env_kwargs",
        "eval_sets -> eval.sets",
        "eval_env_kwargs -> eval.env_kwargs",
        "model -> model.name",
        "init_from -> model.init_from",
        "iterations -> run.iterations",
        "eval_every -> eval.every",
        "torch_threads -> model.torch_threads",
    ):
        assert moved in msg, moved
    assert (cfg.algorithm.lr, cfg.algorithm.algo, cfg.algorithm.warmup_steps) == (0.0003, "ppo", 8)
    assert cfg.rollout.env_id == "AgentR1/FactChain-v0" and cfg.rollout.env_kwargs["num_tasks"] == 64
    assert cfg.eval.sets["fresh_kb"] == {"split": "test", "kb_seed": 1000} and cfg.eval.env_kwargs == {"split": "train"}
    assert (cfg.model.name, cfg.model.init_from, cfg.run.iterations, cfg.eval.every) == (
        "tiny",
        "runs/factchain_sft/model",
        1000,
        5,
    )
    assert cfg == load_config(ROOT / "configs" / "factchain_ppo.yaml")  # the sectioned file says the same
    with pytest.warns(ConfigDeprecationWarning, match="eval_tasks -> eval.tasks"):
        sft = load_config(DATA / "flat_factchain_sft.yaml", cls=SFTConfig)
    assert isinstance(sft.model, ModelConfig) and isinstance(sft.eval, EvalConfig)
    assert sft.eval.every == 0 and sft.eval.tasks == 64 and sft.model.name == "tiny" and sft.lr == 0.003
    assert sft.eval.env_kwargs == {}  # the old default {split: test} named FactChain: the current config says it


def test_a_run_saved_with_flat_keys_resumes_and_takes_flat_or_dotted_overrides(tmp_path):
    from trainers.compose import resume_config

    old = yaml.safe_load((DATA / "flat_factchain_ppo.yaml").read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.warns(ConfigDeprecationWarning):
        cfg = resume_config(tmp_path, {"iterations": 7, "algorithm.lr": 1e-5})
    assert cfg.run.iterations == 7 and cfg.algorithm.lr == 1e-5 and cfg.rollout.tasks_per_iter == 32
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))  # what a run saves now: sections
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume_config(tmp_path) == cfg


def test_checking_a_config_imports_no_torch():
    code = (
        "import sys\nfrom pathlib import Path\nfrom trainers.config import load_config, TrainConfig\n"
        "from trainers.sft import SFTConfig\n"
        "for p in sorted(Path('configs').glob('*.yaml')):\n"
        "    load_config(p, cls=SFTConfig if 'train_sft' in p.read_text().splitlines()[0] else TrainConfig)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_default_names_an_env():
    with pytest.raises(ConfigError, match="rollout.env_id is required"):
        RolloutConfig()
    with pytest.raises(ConfigError, match="rollout.env_id is required"):
        TrainConfig()
    with pytest.raises(ConfigError, match="env_id is required"):
        SFTConfig()
    assert EvalConfig().env_kwargs == {} and EvalConfig().sets == {}
    for cls in (*SECTIONS, SFTConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert "FactChain" not in repr(default) and "split" not in repr(default), (cls.__name__, f.name)


def test_sections_check_themselves():
    with pytest.raises(ConfigError, match="config key 'algorithm.lr': expected float"):
        AlgorithmConfig(lr="fast")
    with pytest.raises(ConfigError, match="algorithm.gamma must be in"):
        AlgorithmConfig(gamma=2.0)
    with pytest.raises(ConfigError, match="run.iterations must be positive"):
        RunConfig(iterations=0)
    with pytest.raises(ConfigError, match="lora_dropout must be in"):
        ScaleConfig(lora_dropout=1.0)
    with pytest.raises(ConfigError, match="eval.tasks must be positive"):
        EvalConfig(tasks=0)
    from trainers.compose import check

    rollout = RolloutConfig(env_id="x", tasks_per_iter=4, workers=3)  # two keys: refused where the run is put together
    with pytest.raises(ConfigError, match="rollout.workers=3 must divide tasks_per_iter=4"):
        check(TrainConfig(rollout=rollout))
    with pytest.raises(ConfigError, match="model.tiny_layers must be positive"):
        dataclasses.replace(ModelConfig(), tiny_layers=0)  # replace re-checks
    assert AlgorithmConfig(algo="rloo").adv_estimator == "rloo" and AlgorithmConfig().uses_critic


def test_one_spelling_per_key_and_replace_copies():
    cfg = TrainConfig(env_id="AgentR1/FactChain-v0", lr=1e-5, rollout_workers=2, eval_tasks=8)  # flat: converted once
    assert cfg.algorithm.lr == 1e-5 and cfg.rollout.workers == 2 and cfg.eval.tasks == 8
    assert cfg.rollout.env_id == "AgentR1/FactChain-v0" and cfg.model.name == "tiny"
    for flat in [*FLAT_KEYS, "batch_size", "uses_critic", "needs_groups"]:  # read through the section only
        if flat != "model":
            assert not hasattr(cfg, flat), flat
    assert cfg.rollout.batch_size == 16 * 4 and cfg.algorithm.uses_critic
    other = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend="vllm"))
    assert other.rollout.backend == "vllm" and cfg.rollout.backend == "hf" and other.algorithm == cfg.algorithm
    assert other.algorithm is not cfg.algorithm  # sections are copied, never shared
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_sft_and_evaluation_reuse_the_model_and_eval_sections():
    sft = SFTConfig(env_id="AgentR1/FactChain-v0", model={"name": "tiny", "tiny_layers": 1}, eval={"tasks": 4})
    assert type(sft.model) is ModelConfig and type(sft.eval) is EvalConfig and sft.eval.every == 0
    assert {f.name for f in dataclasses.fields(SFTConfig)}.isdisjoint(
        {f.name for f in dataclasses.fields(ModelConfig)} | {"eval_tasks", "eval_every", "eval_sets", "tokenizer"}
    )
    with pytest.raises(ConfigError, match=r"'model.layers' \(did you mean 'model.tiny_layers'\?\)"):
        SFTConfig(env_id="x", model={"layers": 1})
