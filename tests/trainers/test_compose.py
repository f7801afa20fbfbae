"""Every "these keys cannot be combined" rule is one row of ``trainers.compose.REFUSALS``: this test
walks the table. For each row it builds a config that trips it (the config itself builds: a section
checks only its own keys one at a time), checks that this row, not an earlier one, refuses it, and
that the message still says what it said where the rule lived before (a section, ``TrainConfig``,
``choose_parts``, ``Trainer.__init__``, ``trainers/cli.py`` or the FSDP strategy)."""

import dataclasses

import pytest

import agent_gym
from trainers.compose import REFUSALS, Setting, check
from trainers.config import ConfigError, TrainConfig, config_fields
from trainers.parallel import SingleProcess

FACTCHAIN = "AgentR1/FactChain-v0"
TEAM = "AgentR1/FactChainTeam-v0"
SERVER = "http://127.0.0.1:8000"

# row name -> (the config's sections, check()'s keyword arguments, torchrun's WORLD_SIZE, a needle of its message)
TRIPS = {
    "env_arguments_taken": (
        {"eval": {"sets": {"heldout": {"split": "test", "num_hopz": 3}}}},
        {},
        None,
        "eval.sets.heldout: AgentR1/FactChain-v0 takes no argument 'num_hopz' (did you mean 'num_hops'?)",
    ),
    "recompute_needs_top_p_1": (
        {"rollout": {"recompute_logprobs": False, "top_p": 0.9}},
        {},
        None,
        "recompute_logprobs=false needs top_p: 1.0",
    ),
    "workers_divide_tasks": (
        {"rollout": {"workers": 3, "tasks_per_iter": 4}},
        {},
        None,
        "rollout.workers=3 must divide tasks_per_iter=4",
    ),
    "scaffold_drop_in_process_single_agent": (
        {"rollout": {"scaffold_drop": [1.0, 0.0], "env_server": SERVER}},
        {},
        None,
        "rollout.scaffold_drop reaches in-process and Ray envs only",
    ),
    "async_needs_vllm": (
        {"rollout": {"mode": "async"}},
        {},
        None,
        "rollout.mode: async does not combine with backend: 'hf'",
    ),
    "async_without_workers": (
        {"rollout": {"mode": "async", "backend": "vllm", "workers": 2}},
        {},
        None,
        "rollout.mode: async does not combine with workers: 2",
    ),
    "async_without_env_server": (
        {"rollout": {"mode": "async", "backend": "vllm", "env_server": SERVER}},
        {},
        None,
        "rollout.mode: async does not combine with env_server",
    ),
    "async_single_agent": (
        {"rollout": {"mode": "async", "backend": "vllm", "env_id": TEAM}},
        {},
        None,
        "rollout.mode: async does not combine with the multi-agent env_id",
    ),
    "env_server_single_agent": (
        {"rollout": {"env_server": SERVER, "env_id": TEAM}},
        {},
        None,
        "rollout.env_server serves single-agent envs",
    ),
    "soft_overlong_needs_lengths": (
        {"algorithm": {"overlong": "soft", "overlong_max_tokens": 100}},
        {},
        None,
        "overlong: soft needs overlong_max_tokens",
    ),
    "overlong_lengths_need_soft": (
        {"algorithm": {"overlong": "mask", "overlong_buffer": 10}},
        {},
        None,
        "apply to overlong: soft only",
    ),
    "lora_needs_alpha": ({"scale": {"lora_r": 4, "lora_alpha": 0.0}}, {}, None, "lora_alpha must be positive"),
    "minibatch_divides_batch": (
        {"algorithm": {"minibatch_size": 48}},
        {},
        None,
        "minibatch_size=48 must divide the batch of rollout.tasks_per_iter * rollout.group_size = 16 * 4 = 64",
    ),
    "groups_need_two": (
        {"algorithm": {"algo": "grpo", "minibatch_size": 16}, "rollout": {"group_size": 1}},
        {},
        None,
        "group_size must be at least 2",
    ),
    "dynamic_sampling_needs_groups": (
        {"algorithm": {"algo": "ppo", "dynamic_sampling": True}},
        {},
        None,
        "adv_estimator: 'gae', which has no groups",
    ),
    "dynamic_sampling_without_staleness": (
        {"algorithm": {"algo": "grpo", "dynamic_sampling": True}, "rollout": {"max_staleness": 1}},
        {},
        None,
        "does not combine with rollout.max_staleness: 1",
    ),
    "dynamic_sampling_without_workers": (
        {"algorithm": {"algo": "grpo", "dynamic_sampling": True}, "rollout": {"workers": 2}},
        {},
        None,
        "does not combine with rollout.workers: 2",
    ),
    "dynamic_sampling_without_fsdp": (
        {"algorithm": {"algo": "grpo", "dynamic_sampling": True}, "scale": {"fsdp": True}},
        {},
        None,
        "does not combine with scale.fsdp: true",
    ),
    "microbatches_need_agg_units": (
        {"algorithm": {"loss_agg": "sum-only"}, "scale": {"max_tokens_per_microbatch": 128}},
        {},
        None,
        "loss_agg='sum-only' was registered without units=",
    ),
    "fsdp_needs_hf": (
        {"scale": {"fsdp": True}, "rollout": {"backend": "vllm"}},
        {},
        None,
        "fsdp: true does not combine with backend",
    ),
    "fsdp_without_workers": (
        {"scale": {"fsdp": True}, "rollout": {"workers": 2}},
        {},
        None,
        "fsdp: true does not combine with rollout.workers",
    ),
    "fsdp_without_lora": ({"scale": {"fsdp": True, "lora_r": 8}}, {}, None, "fsdp: true does not combine with lora_r"),
    "fsdp_needs_agg_units": (
        {"scale": {"fsdp": True}, "algorithm": {"loss_agg": "sum-only"}},
        {},
        None,
        "fsdp: true: loss_agg='sum-only' was registered without units=",
    ),
    "staleness_without_fsdp": (
        {"rollout": {"max_staleness": 1}, "scale": {"fsdp": True}},
        {},
        None,
        "does not combine with scale.fsdp",
    ),
    "bf16_needs_float32_weights": (
        {"scale": {"mixed_precision": "bf16"}, "model": {"dtype": "bfloat16"}},
        {},
        None,
        "float32 master weights",
    ),
    "team_without_fsdp": (
        {"rollout": {"env_id": TEAM}, "scale": {"fsdp": True}},
        {},
        None,
        "scale.fsdp: true with the multi-agent env_id",
    ),
    "team_without_staleness": (
        {"rollout": {"env_id": TEAM, "max_staleness": 1}},
        {},
        None,
        "rollout.max_staleness: 1 is not supported with the multi-agent env",
    ),
    "team_without_workers": (
        {"rollout": {"env_id": TEAM, "workers": 2}},
        {},
        None,
        "rollout.workers: 2 is not supported with the multi-agent env",
    ),
    "fsdp_needs_sharding_strategy": (
        {"scale": {"fsdp": True}},
        {"parallel": SingleProcess()},
        None,
        "scale.fsdp: true needs a parallelism strategy that shards the models",
    ),
    "command_runs_the_algo": (
        {"algorithm": {"algo": "grpo"}},
        {"script": "ppo", "prog": "train_ppo.py"},
        None,
        "config key 'algorithm.algo' is 'grpo', which train_ppo.py does not run; use "
        "train_grpo.py or set algorithm.algo to one of ('ppo',)",
    ),
    "fsdp_shares_even": (
        {
            "scale": {"fsdp": True},
            "rollout": {"tasks_per_iter": 4, "group_size": 2},
            "algorithm": {"minibatch_size": 8},
        },
        {},
        "3",
        "fsdp: true with 3 processes: tasks_per_iter=4 must be a multiple of the number of processes",
    ),
}


@pytest.fixture
def sum_only():
    """An aggregation registered without units (removed after the test)."""
    from trainers import algos

    before = dict(algos.AGGREGATIONS), dict(algos.AGG_UNITS)
    algos.register_agg("sum-only")(lambda loss, mask: (loss * mask).sum())
    yield
    for reg, old in zip((algos.AGGREGATIONS, algos.AGG_UNITS), before):
        reg.clear()
        reg.update(old)


def _config(sections):
    rollout = {"env_id": FACTCHAIN, **sections.get("rollout", {})}
    return TrainConfig(**{**sections, "rollout": rollout})


def test_every_row_has_a_config_that_trips_it_and_names_real_keys():
    assert [r.name for r in REFUSALS] == list(dict.fromkeys(r.name for r in REFUSALS))  # names are unique
    assert set(TRIPS) == {r.name for r in REFUSALS}
    keys = set(config_fields(TrainConfig))
    for rule in REFUSALS:
        assert rule.keys and set(rule.keys) <= keys, rule.name


@pytest.mark.parametrize("rule", REFUSALS, ids=lambda r: r.name)
def test_each_refusal_trips_on_its_config_with_its_message(rule, sum_only, monkeypatch):
    sections, kw, world, needle = TRIPS[rule.name]
    env_id = sections.get("rollout", {}).get("env_id", FACTCHAIN)
    if env_id not in agent_gym.ENV_IDS and env_id not in agent_gym.MULTIAGENT_IDS:
        pytest.skip(f"{env_id} is not registered here (the multi-agent ids need pettingzoo)")
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    check(_config({}))  # the base config passes every row
    cfg = _config(sections)  # builds: no section refuses a combination
    with pytest.raises(ConfigError) as err:
        check(cfg, **kw)
    assert str(err.value) == rule.message(Setting(cfg, **kw)), "an earlier row refused it"
    assert needle in str(err.value)
    # without the combination's trigger the same config passes: the base config of this section set
    assert rule.when(Setting(cfg, **kw)) and not rule.when(Setting(_config({}), **kw))


def test_a_row_is_data_that_check_reads():
    """A config no row refuses passes; one that trips two rows names the first in the table's order."""
    cfg = _config({"scale": {"fsdp": True, "lora_r": 8}, "rollout": {"backend": "vllm"}})
    with pytest.raises(ConfigError, match="fsdp: true does not combine with backend"):
        check(cfg)
    fixed = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend="hf"))
    with pytest.raises(ConfigError, match="fsdp: true does not combine with lora_r"):
        check(fixed)
