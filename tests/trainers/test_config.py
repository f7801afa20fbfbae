import warnings
from pathlib import Path

import pytest

from trainers.compose import check
from trainers.config import ConfigDeprecationWarning, ConfigError, TrainConfig, load_config
from trainers.sft import SFTConfig

CONFIGS = sorted(Path(__file__).resolve().parents[2].glob("configs/*.yaml"))
ENV = ["rollout.env_id=AgentR1/FactChain-v0"]  # no default names an env


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_yaml_loads_and_says_how_to_run_it(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# python trainers/train_"), f"{path.name} must start with the command that runs it"
    cls = SFTConfig if "train_sft" in first else TrainConfig
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the project's configs are written in sections: no flat key warns
        cfg = load_config(path, cls=cls)
    assert isinstance(cfg, cls)
    if cls is TrainConfig:
        check(cfg)  # and none combines keys that cannot be combined (trainers.compose.REFUSALS)
        script = first.split()[2]
        assert script == ("trainers/train_ppo.py" if cfg.algorithm.algo == "ppo" else "trainers/train_grpo.py")


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) 'learning_rate'"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"'minibatchsize' \(did you mean 'algorithm.minibatch_size'\?\)"):
        load_config(None, ["minibatchsize=4"])


@pytest.mark.parametrize(
    "override,needle",
    [
        (["algorithm.lr=fast"], "config key 'algorithm.lr': expected float"),
        (["algorithm.algo=ddpg"], "config key 'algorithm.algo': expected one of 'ppo', 'grpo'"),
        (["run.iterations=2.5"], "config key 'run.iterations': expected int"),
        (["algorithm.use_action_mask=maybe"], "config key 'algorithm.use_action_mask': expected bool"),
        (
            ["algorithm.minibatch_size=48"],
            r"minibatch_size=48 must divide the batch of rollout.tasks_per_iter \* "
            r"rollout.group_size = 16 \* 4 = 64",
        ),
        (
            ["algorithm.algo=grpo", "rollout.group_size=1", "algorithm.minibatch_size=16"],
            "group_size must be at least 2",
        ),
        (["algorithm.dual_clip_c=0.5"], "algorithm.dual_clip_c must be > 1"),
        (["algorithm.lam=1.05"], r"algorithm.lam must be in \[0, 1\], got 1.05"),
        (["algorithm.gamma=-0.1"], r"algorithm.gamma must be in \[0, 1\], got -0.1"),
        (["rollout.recompute_logprobs=false", "rollout.top_p=0.9"], "recompute_logprobs=false needs top_p: 1.0"),
        (["eval.sets={fresh: 3}"], "eval.sets: 'fresh' must map to a mapping of env_kwargs overrides"),
        (["eval.sets={a/b: {kb_seed: 1}}"], "a set's name must be a non-empty string without '/'"),
        (["eval.sets=[kb_seed]"], "config key 'eval.sets': expected dict"),
        (["lr=fast"], "config key 'algorithm.lr': expected float"),  # a flat key: named at its new place
        (["rollout=3"], "config key 'rollout' is a section: expected a mapping of its keys"),
        (["rollout.env_id=null"], "rollout.env_id is required"),
    ],
)
def test_bad_values_fail_at_start_naming_the_key(override, needle):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ConfigError, match=needle):
            check(load_config(None, [*ENV, *override]))  # a key's own value at load, a combination at check


def test_overrides_parse_as_yaml_and_algo_sets_estimator():
    cfg = load_config(None, [*ENV, "algorithm.algo=grpo", "algorithm.lr=1e-5", "rollout.env_kwargs={num_hops: 3}"])
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.uses_critic and cfg.algorithm.lr == 1e-5
    assert cfg.rollout.env_kwargs == {"num_hops": 3}
    assert load_config(None, [*ENV, "algorithm.algo=ppo"]).algorithm.uses_critic


def test_a_dotted_override_sets_one_key_of_a_mapping_and_keeps_the_rest(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "rollout: {env_id: AgentR1/FactChain-v0, env_kwargs: {num_hops: 2, rewards: {extra: {hop: 0.2}, format: 0.1}}}\n"
        "eval: {sets: {heldout: {split: test}}}\n"
    )
    cfg = load_config(
        f,
        [
            "rollout.env_kwargs.num_hops=3",
            "rollout.env_kwargs.rewards.extra.hop=0.5",
            "eval.sets.heldout.exclude_train_tasks=64",
            "eval.sets.fresh.kb_seed=1000",  # a new set
            "rollout.vllm_kwargs.max_model_len=4096",  # from the field's default ({})
        ],
    )
    assert cfg.rollout.env_kwargs == {"num_hops": 3, "rewards": {"extra": {"hop": 0.5}, "format": 0.1}}
    assert cfg.eval.sets == {"heldout": {"split": "test", "exclude_train_tasks": 64}, "fresh": {"kb_seed": 1000}}
    assert cfg.rollout.vllm_kwargs == {"max_model_len": 4096}
    # after a whole-mapping override, a dotted one sets its key on that mapping; the file is not read again
    cfg = load_config(f, ["rollout.env_kwargs={num_hops: 4}", "rollout.env_kwargs.kb_seed=7"])
    assert cfg.rollout.env_kwargs == {"num_hops": 4, "kb_seed": 7}
    with pytest.raises(ConfigError, match=r"rollout\.env_kwargs\.num_hops is 2, not a mapping, so it has no key 'x'"):
        load_config(f, ["rollout.env_kwargs.num_hops.x=1"])
    with pytest.raises(
        ConfigError, match=r"unknown config key\(s\) 'algorithm\.lr\.x' \(did you mean 'algorithm\.lr'\?\)"
    ):
        load_config(f, ["algorithm.lr.x=1"])  # not a mapping field: the unknown-key error, as before


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig])
def test_a_model_name_override_keeps_the_rest_of_the_model_section(tmp_path, cls):
    # model=PATH (the flat spelling of model.name) names the model; the file's dtype and device
    # stay. It used to replace the whole section with its defaults (float32, the CPU).
    f = tmp_path / "c.yaml"
    env = "rollout: {env_id: AgentR1/FactChain-v0}\n" if cls is TrainConfig else "env_id: AgentR1/FactChain-v0\n"
    f.write_text("model: {name: Qwen/Qwen2.5-3B-Instruct, dtype: bfloat16, device: cuda}\n" + env)
    with pytest.warns(ConfigDeprecationWarning, match=r"model -> model\.name"):
        cfg = load_config(f, ["model=/models/qwen"], cls=cls)
    assert (cfg.model.name, cfg.model.dtype, cfg.model.device) == ("/models/qwen", "bfloat16", "cuda")
    cfg = load_config(f, ["model.name=/models/qwen", "model.dtype=float32"], cls=cls)
    assert (cfg.model.name, cfg.model.dtype, cfg.model.device) == ("/models/qwen", "float32", "cuda")
    # the other way round: a file's flat model name, a dotted override beside it
    f.write_text("model: tiny\n" + env)
    with pytest.warns(ConfigDeprecationWarning, match=r"model -> model\.name"):
        cfg = load_config(f, ["model.device=cpu", "model.dtype=bfloat16"], cls=cls)
    assert (cfg.model.name, cfg.model.device, cfg.model.dtype) == ("tiny", "cpu", "bfloat16")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_env_kwargs_are_arguments_of_the_env(path):
    """Without building the env (no data, no model): every env_kwargs key is a constructor
    argument somewhere in the env class's hierarchy (``agent_gym.env_arguments.env_arguments``)."""
    from agent_gym.env_arguments import env_arguments

    first = path.read_text().splitlines()[0]
    cfg = load_config(path, cls=SFTConfig if "train_sft" in first else TrainConfig)
    env = cfg if isinstance(cfg, SFTConfig) else cfg.rollout  # SFT's env keys are its own, RL's the rollout's
    accepted = env_arguments(env.env_id)
    assert accepted and {"max_turns", "max_context_tokens", "system_prompt"} <= accepted
    for key in {
        **env.env_kwargs,
        **cfg.eval.env_kwargs,
        **{k: v for kw in cfg.eval.sets.values() for k, v in kw.items()},
    }:
        assert key in accepted, f"{path.name}: env argument {key!r} is not accepted by {env.env_id}"


def test_a_run_whose_env_takes_no_such_argument_is_refused_before_it_starts(tmp_path, capsys):
    from trainers import cli

    run_dir = tmp_path / "run"
    args = ["--config", "configs/factchain_grpo.yaml", f"run.run_dir={run_dir}", "rollout.env_kwargs.max_turnz=3"]
    assert cli.main("grpo", args) == 2
    err = capsys.readouterr().err
    assert "rollout.env_kwargs: AgentR1/FactChain-v0 takes no argument 'max_turnz' (did you mean 'max_turns'?)" in err
    assert not run_dir.exists()  # nothing was started or written


@pytest.fixture
def scratch_registrations():
    from trainers import algos
    from trainers.algos import registry

    regs = (
        algos.ADV_ESTIMATORS,
        algos.USES_CRITIC,
        algos.NEEDS_GROUPS,
        algos.AGGREGATIONS,
        algos.AGG_UNITS,
        algos.KL_KINDS,
        registry.ADV_PARAMS,
        registry.AGG_PARAMS,
    )
    before = [dict(r) for r in regs]
    yield algos
    for r, b in zip(regs, before):
        r.clear()
        r.update(b)


def test_registered_names_are_selectable_from_yaml(tmp_path, scratch_registrations):
    algos = scratch_registrations

    @algos.register_adv_est("mine", uses_critic=True)
    def mine(**kw):
        return algos.get_adv_est("gae")(**kw)

    @algos.register_agg("my-sum")
    def my_sum(loss_mat, mask):
        return (loss_mat * mask).sum()

    @algos.register_kl("abs")
    def kl_abs(d):
        return d.abs()

    p = tmp_path / "c.yaml"
    p.write_text(
        "rollout: {env_id: AgentR1/FactChain-v0}\n"
        "algorithm: {algo: grpo, adv_estimator: mine, loss_agg: my-sum, kl_kind: abs, kl_coef: 0.1}\n"
    )
    cfg = load_config(p)
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.loss_agg, cfg.algorithm.kl_kind) == ("mine", "my-sum", "abs")
    assert cfg.algorithm.uses_critic  # from the registration, not from the name
    assert not load_config(None, [*ENV, "algorithm.algo=grpo"]).algorithm.uses_critic


def test_group_size_check_comes_from_the_registration(scratch_registrations):
    algos = scratch_registrations

    @algos.register_adv_est("my-baseline", needs_groups=True)
    def mine(**kw):
        return algos.get_adv_est("rloo")(**kw)

    algos.register_adv_est("my-solo")(mine)
    one = [*ENV, "rollout.group_size=1", "rollout.tasks_per_iter=16", "algorithm.minibatch_size=16"]
    grpo = [*ENV, "algorithm.algo=grpo"]
    with pytest.raises(
        ConfigError,
        match="group_size must be at least 2 for adv_estimator='my-baseline', got 1 "
        r"\(.*needs_groups=True\)",
    ):
        check(load_config(None, [*grpo, "algorithm.adv_estimator=my-baseline", *one]))
    assert load_config(
        None, [*grpo, "algorithm.adv_estimator=my-baseline", "rollout.group_size=2", "algorithm.minibatch_size=16"]
    ).algorithm.needs_groups
    assert not load_config(
        None, [*grpo, "algorithm.adv_estimator=my-solo", *one]
    ).algorithm.needs_groups  # the same fn, no groups
    for name, groups in (("grpo", True), ("rloo", True), ("reinforce_pp", False), ("gae", False)):
        assert algos.NEEDS_GROUPS[name] is groups, name
    with pytest.raises(ValueError, match="'my-baseline' is already registered with needs_groups=True"):
        algos.register_adv_est("my-baseline")(mine)


@pytest.mark.parametrize(
    "key,value,valid",
    [
        ("adv_estimator", "mine2", "gae, grpo, reinforce_pp, rloo"),
        ("loss_agg", "sum", "seq-mean-token-mean, seq-mean-token-sum, token-mean"),
        ("kl_kind", "k9", "k1, k2, k3"),
    ],
)
def test_unregistered_names_fail_listing_the_registered(key, value, valid):
    with pytest.raises(
        ConfigError, match=f"config key 'algorithm.{key}': '{value}' is not registered; registered: {valid}"
    ):
        load_config(None, [*ENV, f"algorithm.{key}={value}"])


def test_a_taken_name_cannot_be_registered_again_differently(scratch_registrations):
    algos = scratch_registrations
    gae = algos.get_adv_est("gae")
    assert algos.register_adv_est("gae", uses_critic=True)(gae) is gae  # the same entry again: a no-op
    with pytest.raises(ValueError, match="'gae' is already registered"):
        algos.register_adv_est("gae", uses_critic=True)(lambda **kw: None)
    with pytest.raises(ValueError, match="already registered with uses_critic=True"):
        algos.register_adv_est("gae")(gae)
    with pytest.raises(ValueError, match="'token-mean' is already registered"):
        algos.register_agg("token-mean")(lambda m, k: m)
    with pytest.raises(ValueError, match="KL kind 'k3' is already registered"):
        algos.register_kl("k3")(lambda d: d)


def test_sft_and_evaluate_refuse_an_env_argument_the_env_does_not_take(tmp_path, capsys):
    from trainers import evaluate, train_sft

    run_dir = tmp_path / "sft"
    assert (
        train_sft.main(["--config", "configs/factchain_sft.yaml", f"run_dir={run_dir}", "env_kwargs.num_hopz=3"]) == 2
    )
    assert "env_kwargs: AgentR1/FactChain-v0 takes no argument 'num_hopz' (did you mean 'num_hops'?)" in (
        capsys.readouterr().err
    )
    assert not run_dir.exists()
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--env", "AgentR1/FactChain-v0", "--policy", "oracle", "--env-kwargs", "{max_turnz: 3}"])
    assert e.value.code == 2
    assert "--env-kwargs: AgentR1/FactChain-v0 takes no argument 'max_turnz' (did you mean 'max_turns'?)" in (
        capsys.readouterr().err
    )
