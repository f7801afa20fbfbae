"""The entropy monitor: ``policy/entropy``, the policy's mean entropy over the agent's tokens (the
loss mask), is logged on every update, also when ``algorithm.entropy_coef`` is 0 (then it is a
measurement only: it adds nothing to the loss and carries no gradient). Checked against a hand
computation from the model's full logits on a small padded batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from trainers.compose import build_trainer
    from trainers.config import from_dict

    cfg = from_dict(
        {
            "run": {
                "run_dir": str(tmp_path_factory.mktemp("entropy") / "run"),
                "iterations": 1,
                "tensorboard": False,
                "progress_bar": False,
            },
            "model": {"name": "tiny", "tiny_layers": 1, "torch_threads": 1},
            "rollout": {
                "env_id": "AgentR1/FactChain-v0",
                "tasks_per_iter": 2,
                "group_size": 2,
                "max_turn_tokens": 8,
                "temperature": TEMPERATURE,
            },
            "algorithm": {"algo": "grpo", "minibatch_size": 4, "entropy_coef": 0.0},
            "eval": {"every": 100, "tasks": 1},
        }
    )
    tr = build_trainer(cfg)
    tr.setup()
    yield tr
    tr.cleanup()


def _batch(tr):
    """Three rows of random ids, the last one padded, agent tokens scattered among the others."""
    from trainers.models import token_logprobs
    from trainers.rollout import RolloutBatch

    g = torch.Generator().manual_seed(0)
    vocab = tr.policy.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (3, 7), generator=g)
    attn = torch.ones(3, 7, dtype=torch.long)
    attn[2, 5:] = 0
    ids[2, 5:] = tr.pad_id
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1], [0, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0, 0]], dtype=torch.float32)
    with torch.no_grad():
        old = token_logprobs(tr.policy, ids, attn, temperature=TEMPERATURE, loss_mask=mask)[0]
    adv = torch.tensor([[1.0], [-0.5], [0.25]]) * mask
    zeros = torch.zeros(3, 7)
    return RolloutBatch(ids, attn, mask, zeros, zeros, torch.tensor([0, 0, 1]), old_logprobs=old, advantages=adv)


def _hand_entropy(tr, b) -> float:
    """-sum_v p log p of the sampling distribution (logits / temperature) that predicts each agent
    token (position t-1 predicts token t), averaged over the 10 agent tokens, in float64."""
    with torch.no_grad():
        logits = tr.policy(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1].double()
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    h = -(logp.exp() * logp).sum(-1)  # (B, T-1)
    m = b.loss_mask[:, 1:].double()
    assert int(m.sum()) == 10
    return float((h * m).sum() / m.sum())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("coef", [0.0, 0.01])
def test_policy_entropy_is_the_mean_entropy_over_the_agent_tokens(trainer, coef):
    trainer.cfg = dataclasses.replace(
        trainer.cfg, algorithm=dataclasses.replace(trainer.cfg.algorithm, entropy_coef=coef)
    )
    b = _batch(trainer)
    want = _hand_entropy(trainer, b)
    _, m = trainer.policy_loss(b)
    assert float(m["policy/entropy"]) == pytest.approx(want, rel=1e-6)
    assert not m["policy/entropy"].requires_grad
    if coef == 0:  # a measurement only: the loss is the surrogate alone
        assert float(m["policy/total_loss"]) == float(m["policy/loss"])
    else:  # the bonus: surrogate - coef * entropy
        assert float(m["policy/total_loss"]) == pytest.approx(float(m["policy/loss"]) - coef * want, abs=1e-6)


@pytest.mark.timeout(300)
def test_every_update_logs_the_entropy_without_a_bonus(trainer):
    trainer.cfg = dataclasses.replace(
        trainer.cfg, algorithm=dataclasses.replace(trainer.cfg.algorithm, entropy_coef=0.0)
    )
    b = _batch(trainer)
    want = _hand_entropy(trainer, b)  # before the update's step: its one minibatch is measured first
    metrics = trainer.update(b, 0)
    assert metrics["update/skipped"] == 0.0
    assert metrics["policy/entropy"] == pytest.approx(want, rel=1e-6)
