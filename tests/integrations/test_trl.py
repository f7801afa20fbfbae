"""TRL's GRPOTrainer trains a tiny model on FactChain through ``rollout_func`` (trainers.integrations.trl).

Real TRL, real env, real tiny Qwen2: the only addition is a ``GRPOTrainer`` subclass that records
the batches its ``_compute_loss`` receives, so the test can compare what TRL trained on with what
the env built.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

ENV_KWARGS = {
    "tools_in_prompt": False,
    "system_prompt": "Follow the chain of facts with lookup.",
    "max_turns": 2,
    "max_context_tokens": 256,
    "rewards": {"no_action": -0.1, "call_invalid": -0.1},
}
G = 2  # GRPO group size (num_generations)


def shaping_reward(completions, completion_ids, env_mask=None, **kwargs):
    """Test-only shaping: the fraction of the agent's tokens with an even id. A tiny random model
    never calls a tool or answers, so the env's rewards tie within every group and GRPO's advantage
    would be 0 (no update at all); this small, sample-dependent term breaks the ties so the weights
    must move. It reads ``completion_ids`` as TRL passes them to reward functions."""
    out = []
    for ids in completion_ids:
        out.append(0.1 * sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from trl import GRPOConfig, GRPOTrainer

    from agent_gym.tokenizer import load_tokenizer
    from trainers.integrations.trl import EnvRollout, env_reward
    from trainers.tiny_model import build_tiny_qwen2

    tok = load_tokenizer(None)
    model = build_tiny_qwen2(tok, seed=0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    rollout = EnvRollout("AgentR1/FactChain-v0", env_kwargs=dict(ENV_KWARGS), tokenizer=tok, max_turn_tokens=12, seed=0)
    calls: list[dict] = []  # what each rollout_func call received and returned
    seen: list[dict] = []  # the batches TRL's loss was computed on

    def recording_rollout(prompts, trainer):
        out = rollout(prompts, trainer)
        calls.append({"prompts": list(prompts), "episodes": list(rollout.last_episodes), "out": out})
        return out

    class RecordingGRPOTrainer(GRPOTrainer):
        def _compute_loss(self, model, inputs):
            rec = {
                k: inputs[k].detach().clone()
                for k in (
                    "prompt_ids",
                    "prompt_mask",
                    "completion_ids",
                    "completion_mask",
                    "tool_mask",
                    "advantages",
                    "sampling_per_token_logps",
                )
            }
            with torch.no_grad():  # TRL's own scoring of the batch, under the weights that sampled it
                rec["trl_logps"] = self._get_per_token_logps_and_entropies(
                    model,
                    torch.cat([rec["prompt_ids"], rec["completion_ids"]], 1),
                    torch.cat([rec["prompt_mask"], rec["completion_mask"]], 1),
                    rec["completion_ids"].shape[1],
                )[0]
            seen.append(rec)
            return super()._compute_loss(model, inputs)

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        per_device_train_batch_size=4,
        num_generations=G,
        max_steps=3,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,
        gradient_checkpointing=False,
    )
    trainer = RecordingGRPOTrainer(
        model=model,
        reward_funcs=[env_reward, shaping_reward],
        args=args,
        train_dataset=rollout.dataset(range(8)),
        processing_class=tok,
        rollout_func=recording_rollout,
    )
    trainer.train()
    return {"trainer": trainer, "model": model, "before": before, "calls": calls, "seen": seen, "tok": tok}


@pytest.mark.timeout(300)
def test_trl_trains_on_the_env_tokens_and_mask(trained):
    calls, seen = trained["calls"], trained["seen"]
    assert len(calls) == 3 and len(seen) == 3  # one generation per step, each used once
    for c in calls:
        # TRL's sampler hands the rollout each prompt num_generations times in a row: one episode each.
        assert len(c["prompts"]) == 4 and c["prompts"][0::G] == c["prompts"][1::G]
        assert len(c["episodes"]) == len(c["prompts"])
    episodes = [ep for c in calls for ep in c["episodes"]]
    # Rows TRL trained on (it shuffles within a generation): strip the padding with TRL's own masks.
    trained_rows = []
    for b in seen:
        for i in range(b["completion_ids"].shape[0]):
            p = b["prompt_ids"][i][b["prompt_mask"][i].bool()].tolist()
            real = b["completion_mask"][i].bool()
            c = b["completion_ids"][i][real].tolist()
            loss_mask = (b["completion_mask"][i] * b["tool_mask"][i])[real].tolist()  # what _compute_loss applies
            trained_rows.append((tuple(p), tuple(c), tuple(int(m) for m in loss_mask)))
    env_rows = [
        (
            tuple(ep.token_ids[: ep.prompt_len]),
            tuple(ep.token_ids[ep.prompt_len :]),
            tuple(ep.loss_mask[ep.prompt_len :]),
        )
        for ep in episodes
    ]
    assert sorted(trained_rows) == sorted(env_rows)
    # TRL scores the agent's tokens at the positions the sampler drew them from: with the weights
    # unchanged between sampling and the loss (one step per generation), its log-probs are the
    # sampler's up to float rounding.
    for b in seen:
        m = (b["completion_mask"] * b["tool_mask"]).bool()
        assert float((b["trl_logps"] - b["sampling_per_token_logps"])[m].abs().max()) < 1e-5
    # The masks really hold env tokens in the middle of the completion (turn closers, the nudge).
    assert all(ep.turns == 2 for ep in episodes)
    for _, c, m in env_rows:
        first_env = m.index(0)
        assert 0 < first_env and 1 in m[first_env:], "expected agent tokens after env tokens"
        assert sum(m) < len(c)


@pytest.mark.timeout(300)
def test_trl_reward_is_the_env_return_and_weights_change(trained):
    trainer, calls = trained["trainer"], trained["calls"]
    logged = [h for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    assert len(logged) == 3
    for h, c in zip(logged, calls):
        returns = [ep.reward for ep in c["episodes"]]
        assert c["out"]["env_reward"] == returns
        assert h["rewards/env_reward/mean"] == pytest.approx(sum(returns) / len(returns), abs=1e-6)
        assert h["env/success_rate"] == pytest.approx(sum(ep.success for ep in c["episodes"]) / len(returns))
        assert h["env/turns_mean"] == pytest.approx(sum(ep.turns for ep in c["episodes"]) / len(returns))
    assert any(float(b["advantages"].abs().max()) > 0 for b in trained["seen"])
    model, before = trained["model"], trained["before"]
    changed = [k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "no parameter changed after 3 GRPO steps"
    assert model.training  # the rollout handed TRL its model back in train mode


def test_unknown_prompt_is_a_clear_error(trained):
    from trainers.integrations.trl import EnvRollout

    rollout = EnvRollout("AgentR1/FactChain-v0", env_kwargs=dict(ENV_KWARGS))
    with pytest.raises(ValueError, match="EnvRollout.dataset"):
        rollout(["not a task prompt"], trained["trainer"])
    with pytest.raises(ValueError, match="unknown env id"):
        EnvRollout("AgentR1/NoSuchEnv-v0")


@pytest.mark.timeout(120)
def test_dataset_prompts_key_their_tasks():
    from trainers.integrations.trl import EnvRollout

    # 4 entities, 1 relation, 1 hop: 4 distinct questions, so 10 tasks repeat some; a repeat is the
    # same task (one KB), and is kept.
    small = {"num_entities": 4, "num_relations": 1, "num_hops": 1, "tools_in_prompt": False}
    ds = EnvRollout("AgentR1/FactChain-v0", env_kwargs=small).dataset(range(10))
    assert ds["task_index"] == list(range(10)) and len(set(ds["prompt"])) < 10
    # Two KBs that share almost every name: the same question over each KB has different answers,
    # which the policy could not tell apart.
    two_kbs = {"num_entities": 990, "num_relations": 1, "num_hops": 1, "num_kbs": 2, "tools_in_prompt": False}
    with pytest.raises(ValueError, match="render the same prompt but are different tasks"):
        EnvRollout("AgentR1/FactChain-v0", env_kwargs=two_kbs).dataset(range(200))
