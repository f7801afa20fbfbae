"""Value-guided decoding (trainers/decoding.py, trainers/evaluate.py --decode): K = 1 is plain
sampling, the critic's argmax is the candidate taken, and a checkpoint without a critic is refused.

Cheap on purpose: an untrained tiny model (its actions are gibberish, which is enough to compare
token ids), 4 tasks, short turns, 1-iteration PPO and GRPO runs for the checkpoints."""

import json

import numpy as np
import pytest
import torch

from tests.trainers.conftest import COMPACT_ENV, tiny_rl_config

TURN = 12


@pytest.fixture(scope="module")
def tiny():
    from agent_gym.tokenizer import load_tokenizer
    from trainers.models import Critic
    from trainers.tiny_model import build_tiny_qwen2

    torch.set_num_threads(1)
    tok = load_tokenizer(None)
    policy = build_tiny_qwen2(tok, seed=0).eval()
    critic = Critic(policy)
    torch.nn.init.normal_(critic.head.weight, std=1.0)  # a critic that is not constant
    return tok, policy, critic.eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One-iteration PPO (with a critic) and GRPO (none) runs from the untrained tiny model."""
    from trainers.compose import run

    root = tmp_path_factory.mktemp("vgd")
    out = {}
    for algo in ("ppo", "grpo"):
        run(tiny_rl_config(root / algo, algo, None, iterations=1, max_turn_tokens=TURN, eval_tasks=2))
        out[algo] = root / algo
    return out


def _vec(tok, policy, n):
    from trainers.sources import make_vector_env

    vocab = policy.get_input_embeddings().num_embeddings
    return make_vector_env(
        "AgentR1/FactChain-v0", n, {"tokenizer": tok, "vocab_size": vocab, **COMPACT_ENV, "max_turns": 2}
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["value-guided", "random-of-k"])
def test_k1_equals_sampling_with_the_same_seed(tiny, mode):
    from trainers.backends.base import SamplingConfig
    from trainers.backends.hf_backend import HFBackend
    from trainers.decoding import BestOfK
    from trainers.rollout import collect

    tok, policy, critic = tiny
    sampling = SamplingConfig(max_new_tokens=TURN, temperature=1.0)
    envs = _vec(tok, policy, 4)
    try:
        plain, _ = collect(envs, HFBackend(policy, tok.pad_token_id), [0, 1, 2, 3], 1, sampling, seed=7)
        wrapped = BestOfK(HFBackend(policy, tok.pad_token_id), 1, mode, critic, pad_token_id=tok.pad_token_id)
        best, _ = collect(envs, wrapped, [0, 1, 2, 3], 1, sampling, seed=7)
        other, _ = collect(envs, HFBackend(policy, tok.pad_token_id), [0, 1, 2, 3], 1, sampling, seed=8)
    finally:
        envs.close()
    assert [t.episode.token_ids for t in best] == [t.episode.token_ids for t in plain]
    assert [t.sampler_logprobs for t in best] == [t.sampler_logprobs for t in plain]
    # the comparison can fail: another seed samples other actions
    assert [t.episode.token_ids for t in other] != [t.episode.token_ids for t in plain]
    assert wrapped.cost.generated_tokens == sum(sum(t.episode.loss_mask) for t in plain)


@pytest.mark.timeout(120)
def test_the_critics_argmax_is_the_candidate_taken(tiny):
    """A head solved so that the critic prefers candidate j* (value 1, the others 0), for each j*
    and two prompts of different lengths: the wrapper returns candidate j* of each prompt."""
    from trainers.backends.base import SamplingConfig
    from trainers.backends.hf_backend import HFBackend
    from trainers.decoding import BestOfK, candidate_seed
    from trainers.models import Critic

    tok, policy, _ = tiny
    k = 4
    envs = _vec(tok, policy, 2)
    try:
        obs, _ = envs.reset(seed=0, options={"task_indices": [0, 5], "group_size": 1})
        prompts = [obs["input_ids"][i].tolist() for i in range(2)]
    finally:
        envs.close()
    prompts[1] = prompts[1] + prompts[0][1:9]  # longer, so the critic's batch is padded
    seeds = [11, 12]
    sampling = SamplingConfig(max_new_tokens=TURN, temperature=1.0)
    backend = HFBackend(policy, tok.pad_token_id)
    cands = [
        g.token_ids
        for g in backend.generate(
            [p for p in prompts for _ in range(k)],
            sampling,
            seeds=[candidate_seed(s, j) for s in seeds for j in range(k)],
        )
    ]
    assert len({tuple(c) for c in cands}) == 2 * k, "the candidates must differ for the test to mean anything"
    critic = Critic(policy).eval()
    # The hidden state that scores each candidate's last token (values[:, t] reads hidden t-1),
    # each row run alone, without padding.
    with torch.no_grad():
        hidden = torch.stack(
            [
                critic.backbone(input_ids=torch.tensor([p + c])).last_hidden_state[0, len(p) + len(c) - 2]
                for p, c in zip([p for p in prompts for _ in range(k)], cands)
            ]
        )  # (2K, H)
    for target in range(k):
        want = torch.zeros(2 * k)
        want[[target, k + (k - 1 - target)]] = 1.0  # prompt 0 prefers `target`, prompt 1 the mirror index
        w = torch.linalg.lstsq(hidden.double(), want.double()[:, None]).solution[:, 0]  # (H,)
        with torch.no_grad():
            critic.head.weight.copy_(w.float()[None])
            critic.head.bias.zero_()
        chooser = BestOfK(backend, k, "value-guided", critic, pad_token_id=tok.pad_token_id, critic_batch=3)
        picked = chooser.generate(prompts, sampling, seeds=seeds)
        assert picked[0].token_ids == cands[target]
        assert picked[1].token_ids == cands[k + k - 1 - target]
        assert np.allclose(np.concatenate(chooser.last_values), want.numpy(), atol=1e-3)
        assert chooser.cost.critic_tokens == sum(len(p) * k for p in prompts) + sum(len(c) for c in cands)


@pytest.mark.timeout(300)
def test_evaluate_cli_decodes_and_refuses_without_a_critic(runs, tiny, tmp_path):
    from trainers import evaluate
    from trainers.models import save_policy

    common = [
        "--checkpoint",
        str(runs["ppo"]),
        "--tasks",
        "4",
        "--max-turn-tokens",
        str(TURN),
        "--seed",
        "3",
        "--env-kwargs",
        "{max_turns: 2}",
    ]

    def cli(name, *extra):
        assert evaluate.main([*common, "--out", str(tmp_path / name), *extra]) == 0
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        trajs = [json.loads(line)["token_ids"] for line in open(tmp_path / name / "trajectories.jsonl")]
        return summary, trajs

    s_sample, t_sample = cli("sample", "--decode", "sample")
    s_k1, t_k1 = cli("vg1", "--decode", "value-guided", "--k", "1")
    s_k3, _ = cli("vg3", "--decode", "value-guided", "--k", "3")
    s_greedy, _ = cli("greedy")
    assert t_k1 == t_sample
    assert s_sample["checkpoint_algo"] == "ppo" and s_k3["k"] == 3 and s_greedy["temperature"] == 0.0
    assert s_k1["decode/critic_tokens_per_episode"] > 0 and s_sample["decode/critic_tokens_per_episode"] == 0
    # three candidates per turn: more generated than kept, and the critic reads every candidate's context
    assert s_k3["decode/generated_tokens_per_episode"] > s_k3["decode/action_tokens_per_episode"]
    assert s_k3["decode/critic_tokens_per_episode"] > s_k3["decode/generated_tokens_per_episode"]

    with pytest.raises(SystemExit, match=r"value-guided needs a critic.*has none.*grpo"):
        evaluate.main(["--checkpoint", str(runs["grpo"]), "--decode", "value-guided", "--out", str(tmp_path / "x")])
    tok, policy, _ = tiny
    hf_dir = save_policy(policy, tok, tmp_path / "hf")
    with pytest.raises(SystemExit, match=r"value-guided needs a critic.*policy only"):
        evaluate.main(
            [
                "--model",
                hf_dir,
                "--env",
                "AgentR1/FactChain-v0",
                "--decode",
                "value-guided",
                "--out",
                str(tmp_path / "x"),
            ]
        )
    # the control needs no critic
    assert (
        evaluate.main(
            [
                "--checkpoint",
                str(runs["grpo"]),
                "--decode",
                "random-of-k",
                "--k",
                "2",
                "--tasks",
                "2",
                "--max-turn-tokens",
                str(TURN),
                "--env-kwargs",
                "{max_turns: 2}",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
