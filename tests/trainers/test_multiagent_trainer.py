"""The project's trainer on the multi-agent FactChainTeam: a shared tiny policy, one trajectory per
agent, and an update that uses exactly each agent's own sampled tokens."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
from trainers.compose import build_trainer, check, choose_parts  # noqa: E402
from trainers.config import TrainConfig, load_config  # noqa: E402
from trainers.multiagent import TeamRollout  # noqa: E402
from trainers.trainer import Trainer  # noqa: E402

ENV = {"tools_in_prompt": False, "max_cycles": 4, "rewards": {"call_invalid": -0.1, "no_action": -0.1}}


class RecordingTrainer(Trainer):
    """The real trainer, recording what the backend generated in each rollout and the batch each
    update received."""

    def setup(self):
        super().setup()
        self.generated, self.updates = [], []
        generate = self.backend.generate

        def recording_generate(prompts, sampling, seeds=None):
            gens = generate(prompts, sampling, seeds=seeds)
            self.generated.extend((list(p), list(g.token_ids)) for p, g in zip(prompts, gens))
            return gens

        self.backend.generate = recording_generate

    def rollout(self, it):
        self.generated.clear()
        trajs, times = super().rollout(it)
        self.rollout_record = (trajs, list(self.generated))
        return trajs, times

    def update(self, batch, it):
        self.updates.append((self.rollout_record, batch))
        return super().update(batch, it)


@pytest.mark.timeout(300)
def test_grpo_iterations_train_each_agent_on_its_own_tokens(tmp_path):
    cfg = TrainConfig(
        run_dir=str(tmp_path / "run"),
        algo="grpo",
        iterations=2,
        env_id="AgentR1/FactChainTeam-v0",
        env_kwargs=ENV,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=10,
        eval_every=100,
        eval_tasks=2,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        lr=1e-3,
        entropy_coef=0.01,
        checkpoint_every=100,
    )
    check(cfg)  # the multi-agent id is a combination the table allows
    assert choose_parts(cfg).rollout is TeamRollout
    trainer = build_trainer(cfg, trainer_cls=RecordingTrainer)
    trainer.setup()
    assert isinstance(trainer.source, TeamRollout)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    try:
        last = trainer.train()
    finally:
        trainer.cleanup()
    assert len(trainer.updates) == 2
    for (trajs, generated), batch in trainer.updates:
        # one trajectory per agent and team episode; groups per task and seat
        assert len(trajs) == len(batch) == cfg.rollout.batch_size * 2
        assert [t.agent for t in trajs] == ["agent_0", "agent_1"] * cfg.rollout.batch_size
        assert [t.group for t in trajs] == [(i // 2) * 2 + k for i in range(cfg.rollout.batch_size) for k in (0, 1)]
        claimed = set()
        for r, t in enumerate(trajs):
            ids = t.episode.token_ids
            mask = batch.loss_mask[r].numpy()
            assert batch.input_ids[r, : len(ids)].tolist() == ids
            # the generations that were this agent's: its context so far, then what it sampled
            mine = [
                (j, len(p), len(g))
                for j, (p, g) in enumerate(generated)
                if ids[: len(p)] == p and ids[len(p) : len(p) + len(g)] == g and len(p) + len(g) <= len(ids)
            ]
            assert len(mine) == t.episode.turns
            claimed.update(j for j, _, _ in mine)
            expect = np.zeros(mask.shape[0])
            for _, start, n in mine:
                expect[start : start + n] = 1
            # the update's mask is exactly this agent's sampled tokens: nothing of the prompt, the
            # tool results, the env's turn closers or the teammate's turns
            assert np.array_equal(mask, expect)
            assert np.array_equal(batch.sampler_logprobs[r].numpy() != 0, expect > 0)
        assert claimed == set(range(len(generated)))  # every generated token is in exactly one trajectory
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    for key in (
        "team/success_rate",
        "team/cycles_mean",
        "team/messages_per_episode",
        "rollout/agent_tokens_mean",
        "eval/team/success_rate",
    ):
        assert key in last and np.isfinite(last[key]), key
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("team/success_rate" in r for r in rows)


def test_the_yaml_selects_the_multiagent_trainer():
    cfg = load_config("configs/factchain_team_grpo.yaml")
    assert cfg.rollout.env_id == "AgentR1/FactChainTeam-v0" and choose_parts(cfg).rollout is TeamRollout
