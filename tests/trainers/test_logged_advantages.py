"""The trajectory files carry each token's advantage in the update (``advantages``, trainers/trainer.py
``with_advantages``), so the viewer (agent_gym/view.py) colours what the update pushed up and down."""

from __future__ import annotations

import json

import pytest


@pytest.mark.timeout(300)
def test_logged_trajectories_carry_the_updates_per_token_advantages(tmp_path, sft_model):
    from tests.trainers.conftest import tiny_rl_config
    from trainers.compose import run

    # GRPO from the SFT warm start: one advantage per episode (its reward against its group's), the
    # same on each of its agent tokens; hop rewards and invalid-call penalties give groups a spread
    cfg = tiny_rl_config(tmp_path / "run", "grpo", sft_model, iterations=1, log_trajectories=8, temperature=1.5)
    run(cfg)
    recs = [json.loads(x) for x in (tmp_path / "run" / "trajectories" / "iter_00000.jsonl").read_text().splitlines()]
    assert len(recs) == 8
    for r in recs:
        adv, mask = r["advantages"], r["loss_mask"]
        assert len(adv) == len(r["token_ids"]) == len(mask)
        assert all(a == 0.0 for a, m in zip(adv, mask) if not m)  # env and prompt tokens: no credit
        on = [a for a, m in zip(adv, mask) if m]
        assert on and max(on) - min(on) < 1e-5  # outcome advantage: one value per episode
    by_group: dict[int, list[tuple[float, float]]] = {}
    for r in recs:
        by_group.setdefault(r["group"], []).append(
            (r["reward"], next(a for a, m in zip(r["advantages"], r["loss_mask"]) if m))
        )
    assert any(a != 0.0 for g in by_group.values() for _, a in g)
    for g in by_group.values():  # a higher reward in a group is pushed up more (GRPO's ordering)
        for r1, a1 in g:
            for r2, a2 in g:
                if r1 > r2 + 1e-9:
                    assert a1 > a2
