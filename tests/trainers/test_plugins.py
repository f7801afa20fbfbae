"""Plugins (trainers/plugins.py): a module outside the project registers an advantage estimator
with its own hyperparameter, a loss aggregation with its own keyword and an env; a config names
them (``plugins: [...]``), and training runs with them in-process and with 2 Ray rollout workers
(which must import the plugin themselves: they rebuild the config and the env in a fresh process)."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

from trainers.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = textwrap.dedent('''
    """A user's module: nothing of it lives in the project."""
    import os

    import gymnasium as gym
    import torch

    from agent_gym.env import ToolEnv
    from agent_gym.tools import tool
    from trainers.algos import get_adv_est, register_adv_est, register_agg

    SEEN = {"tau": [], "scale": []}
    """What the registered functions were called with (in the process that calls them)."""


    @register_adv_est("scaled_grpo", needs_groups=True)
    def scaled_grpo(*, token_rewards, loss_mask, values, group_ids, gamma, lam, norm_by_std=True, tau=1.0):
        """GRPO's advantages times ``tau``: a hyperparameter of this estimator only (adv_kwargs)."""
        SEEN["tau"].append(tau)
        adv, ret, m = get_adv_est("grpo")(token_rewards=token_rewards, loss_mask=loss_mask, values=values,
                                          group_ids=group_ids, gamma=gamma, lam=lam, norm_by_std=norm_by_std)
        return adv * tau, ret, {**m, "adv/tau": torch.tensor(float(tau))}


    @register_agg("scaled-token-mean", units=lambda mask: (mask > 0).sum())
    def scaled_token_mean(loss_mat, mask, scale=1.0):
        """token-mean times ``scale`` (loss_kwargs)."""
        SEEN["scale"].append(scale)
        m = mask > 0
        return scale * torch.where(m, loss_mat, torch.zeros_like(loss_mat)).sum() / m.sum().clamp_min(1)


    @tool(description="Echo the text.", parameters={"type": "object", "properties": {"text": {"type": "string"}},
                                                     "required": ["text"], "additionalProperties": False})
    def echo(text: str) -> str:
        return text


    class EchoEnv(ToolEnv):
        """Answer with the word of the question (the echo tool returns it)."""

        WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]

        def __init__(self, **kw):
            super().__init__(tools=[echo], **kw)
            # Which process built it: the Ray workers' envs are built there, after importing this module.
            with open(os.environ["PLUGIN_TEST_LOG"], "a") as f:
                f.write(f"{os.getpid()}\\n")

        def num_tasks(self):
            return len(self.WORDS)

        def get_task(self, i):
            return {"id": str(i), "question": f"Say {self.WORDS[i]}.", "answer": self.WORDS[i]}

        def score_answer(self, answer, task):
            return {"em": float(answer.strip() == task["answer"])}

        def demonstration(self, task):
            return [f"<answer>{task['answer']}</answer>"]


    gym.register("PluginTest/Echo-v0", entry_point=f"{__name__}:EchoEnv")
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module written to tmp_path, which goes on sys.path and PYTHONPATH (what Ray's
    workers inherit); the registries and gym's registry are restored afterwards."""
    import gymnasium as gym

    from trainers import plugins
    from trainers.algos import registry

    name = f"user_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("PLUGIN_TEST_LOG", str(tmp_path / "env_pids.log"))
    tables = [
        registry.ADV_ESTIMATORS,
        registry.USES_CRITIC,
        registry.NEEDS_GROUPS,
        registry.ADV_PARAMS,
        registry.AGGREGATIONS,
        registry.AGG_UNITS,
        registry.AGG_PARAMS,
    ]
    saved = [dict(t) for t in tables]
    yield name
    for t, s in zip(tables, saved):
        t.clear()
        t.update(s)
    gym.registry.pop("PluginTest/Echo-v0", None)
    sys.modules.pop(name, None)
    if name in plugins.LOADED:
        plugins.LOADED.remove(name)


def _config(tmp_path, name, run, **rollout):
    p = tmp_path / f"{run}.yaml"
    p.write_text(
        json.dumps(
            {
                "plugins": [name],
                "run": {
                    "run_dir": str(tmp_path / run),
                    "iterations": 1,
                    "checkpoint_every": 100,
                    "log_trajectories": 0,
                    "tensorboard": False,
                    "progress_bar": False,
                    "gc_freeze": False,
                },
                "model": {"torch_threads": 1},
                "rollout": {
                    "env_id": "PluginTest/Echo-v0",
                    "env_kwargs": {"max_turns": 2, "tools_in_prompt": False},
                    "tasks_per_iter": 2,
                    "group_size": 2,
                    "max_turn_tokens": 8,
                    **rollout,
                },
                "algorithm": {
                    "algo": "grpo",
                    "adv_estimator": "scaled_grpo",
                    "adv_kwargs": {"tau": 0.5},
                    "loss_agg": "scaled-token-mean",
                    "loss_kwargs": {"scale": 2.0},
                    "minibatch_size": 4,
                    # The untrained model earns no reward, so every advantage is 0 and the update would
                    # be skipped (trainer.void_update); the entropy bonus, aggregated by the plugin's
                    # aggregation too, keeps it.
                    "entropy_coef": 0.01,
                },
                "eval": {"every": 100, "tasks": 2},
            }
        )
    )
    return p


def test_a_config_names_what_a_plugin_registers_and_its_keywords_are_checked(tmp_path, plugin):
    import gymnasium as gym

    assert "scaled_grpo" not in __import__("trainers.algos").algos.ADV_ESTIMATORS
    with pytest.raises(ConfigError, match="'scaled_grpo' is not registered"):  # without the plugin
        load_config(_config(tmp_path, plugin, "run"), ["plugins=[]"])
    cfg = load_config(_config(tmp_path, plugin, "run"))  # the config's plugins are imported before it is checked
    assert cfg.plugins == [plugin] and cfg.algorithm.adv_kwargs == {"tau": 0.5} and cfg.algorithm.needs_groups
    assert "PluginTest/Echo-v0" in gym.registry
    with pytest.raises(
        ConfigError,
        match=r"algorithm.adv_kwargs.*'tua' \(did you mean 'tau'\?\): not a parameter "
        r"of the advantage estimator 'scaled_grpo', which takes tau",
    ):
        load_config(_config(tmp_path, plugin, "run"), ["algorithm.adv_kwargs={tua: 0.5}"])
    with pytest.raises(ConfigError, match=r"'gamma' \(passed by the trainer itself\)"):
        load_config(_config(tmp_path, plugin, "run"), ["algorithm.adv_kwargs={gamma: 0.5}"])
    with pytest.raises(
        ConfigError,
        match=r"algorithm.loss_kwargs.*'scale': not a parameter of the loss aggregation 'token-mean', which "
        "takes no further keyword arguments",
    ):
        load_config(_config(tmp_path, plugin, "run"), ["algorithm.loss_agg=token-mean"])
    with pytest.raises(
        ConfigError,
        match=r"plugin 'no_such_plugin_mod' not found: put the directory that holds it "
        "on PYTHONPATH",
    ):
        load_config(_config(tmp_path, plugin, "run"), ["plugins=[no_such_plugin_mod]"])


def test_the_generic_estimator_and_aggregation_tests_hold_for_the_plugins(tmp_path, plugin):
    """The registry-parametrised contract tests of test_advantages.py / test_losses.py, on what
    the plugin registered (with its own keyword arguments)."""
    from tests.trainers.test_advantages import check_estimator_contract, check_rewards_off_mask_are_ignored
    from tests.trainers.test_losses import check_aggregation_contract
    from trainers import plugins

    plugins.load([plugin])
    check_estimator_contract("scaled_grpo", tau=0.5)
    check_rewards_off_mask_are_ignored("scaled_grpo", tau=0.5)
    check_aggregation_contract("scaled-token-mean", scale=2.0)


# Two Ray workers must start beside the rest of the suite: under load (two other training processes
# on the 2 cores) starting them once took over 120 s, hence 300 s for start-up and 420 s in all.
@pytest.mark.timeout(420)
def test_training_with_a_plugins_estimator_loss_and_env_in_process_and_with_2_ray_workers(tmp_path, plugin):
    """One iteration in-process, then one with 2 Ray workers: the estimator got tau=0.5 (its
    metric), the aggregation scale=2.0, and the workers built the plugin's env themselves."""
    import os

    pytest.importorskip("ray")
    from trainers.compose import run

    last = run(load_config(_config(tmp_path, plugin, "inproc")))
    mod = sys.modules[plugin]
    assert last["adv/tau"] == 0.5 and mod.SEEN["tau"] == [0.5]
    assert mod.SEEN["scale"] and set(mod.SEEN["scale"]) == {2.0}
    assert set(Path(os.environ["PLUGIN_TEST_LOG"]).read_text().split()) == {str(os.getpid())}
    Path(os.environ["PLUGIN_TEST_LOG"]).unlink()

    ray_last = run(
        load_config(_config(tmp_path, plugin, "ray", workers=2, timeout_s=300))
    )  # worker start-up on a busy 2-core machine
    assert ray_last["adv/tau"] == 0.5 and mod.SEEN["tau"] == [0.5, 0.5]  # the learner estimates
    pids = set(Path(os.environ["PLUGIN_TEST_LOG"]).read_text().split())
    workers = pids - {str(os.getpid())}
    assert len(workers) == 2, pids  # each worker imported the plugin and built its env


def test_the_command_line_loads_plugins_before_the_config_is_checked(tmp_path, plugin, monkeypatch, capsys):
    """``--plugin`` on train_grpo.py and evaluate.py (their ``main``, in this process): a config
    without ``plugins:`` that names the plugin's estimator fails without it (exit 2); an unknown
    plugin is a clear exit 2; with it, evaluate.py runs the plugin env's oracle."""
    from trainers import cli, evaluate

    cfg = json.loads(_config(tmp_path, plugin, "cli").read_text())
    cfg.pop("plugins")
    p = tmp_path / "noplug.yaml"
    p.write_text(json.dumps(cfg))
    assert cli.main("grpo", ["--config", str(p)]) == 2
    assert "'scaled_grpo' is not registered" in capsys.readouterr().err
    assert cli.main("grpo", ["--plugin", "no_such_plugin_mod", "--config", str(p)]) == 2
    assert "plugin 'no_such_plugin_mod' not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--plugin", "no_such_plugin_mod", "--env", "PluginTest/Echo-v0", "--policy", "oracle"])
    assert e.value.code == 2 and "plugin 'no_such_plugin_mod' not found" in capsys.readouterr().err
    assert (
        evaluate.main(
            [
                "--plugin",
                plugin,
                "--env",
                "PluginTest/Echo-v0",
                "--policy",
                "oracle",
                "--tasks",
                "3",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["eval/success_rate"] == 1.0
