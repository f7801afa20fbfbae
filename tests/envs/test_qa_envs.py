"""The multi-hop QA envs (HotpotQA, 2WikiMultiHopQA, MuSiQue) and their NaiveRAG variants.

Everything but the oracle runs on the project's own fixtures (tests/fixtures/qa/, invented
content). The oracle runs every row of the shared dev samples and skips when they are absent.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.datasets import load_corpus
from agent_gym.retrievers import make_retriever
from agent_gym.retrievers.http import RetrievalServer
from agent_gym.scoring import normalize_answer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
HOTPOT = str(FIXTURES / "hotpotqa")
NO_CACHE = {"cache": False}


def make(env_id="AgentR1/HotpotQA-v0", **kw):
    kw.setdefault("data_path", HOTPOT)
    kw.setdefault("retriever_kwargs", NO_CACHE)
    return gym.make(env_id, **kw)


def act(env, text, close=True):
    u = env.unwrapped
    return (
        u.encode_turn(text) if close else np.asarray(u.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
    )


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def text_of(env, ids):
    return env.unwrapped.tokenizer.decode(list(ids), skip_special_tokens=False)


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there once the socket is closed


# -- retrieval and tools ---------------------------------------------------------------------


def test_search_returns_titled_passages_and_the_episode_scores_the_answer():
    env = make()
    env.reset(options={"task_index": 0})  # director of The Glass Orchard -> Quillhaven
    obs, r, term, trunc, info = env.step(act(env, call("search", query="The Glass Orchard film director")))
    assert [c["status"] for c in info["tool_calls"]] == ["ok"] and not (term or trunc)
    result = env.unwrapped.messages[-1]["content"]
    lines = result.split("\n")
    assert len(lines) == 3 and [ln[:6] for ln in lines] == ["Doc 1 ", "Doc 2 ", "Doc 3 "]
    assert "Doc 1 (Title: Marlow Vance) Marlow Vance (14 March 1931 – 2 May 1999) was a film director" in result
    assert "(Title: The Glass Orchard) The Glass Orchard is a 1968 drama film" in result
    obs, r, term, trunc, info = env.step(act(env, "<answer>quillhaven</answer>"))
    assert term and r == 1.0 and info["answer_scores"] == {"em": 1.0, "f1": 1.0}


def test_dead_retrieval_server_is_a_tool_error_not_a_crash():
    env = make(
        retriever=closed_port_url(), retriever_kwargs={"timeout_s": 1.0, "retries": 0}, rewards={"call_invalid": -0.1}
    )
    env.reset(options={"task_index": 0})
    _, r, term, trunc, info = env.step(act(env, call("search", query="Marlow Vance")))
    assert [c["status"] for c in info["tool_calls"]] == ["tool_error"] and not (term or trunc)
    assert r == pytest.approx(-0.1)
    assert "search is unavailable" in env.unwrapped.messages[-1]["content"]
    _, r, term, _, _ = env.step(act(env, "<answer>Quillhaven</answer>"))
    assert term and r == 1.0


def test_http_retriever_works_then_fails_when_the_server_stops():
    server = RetrievalServer(make_retriever("bm25", corpus=str(FIXTURES / "corpus.jsonl"), cache=False)).start()
    try:
        env = make(retriever=server.url, retriever_kwargs={"timeout_s": 2.0, "retries": 0})
        env.reset(options={"task_index": 0})
        _, _, _, _, info = env.step(act(env, call("search", query="Marlow Vance birthplace")))
        assert info["tool_calls"][0]["status"] == "ok"
        assert "(Title: Marlow Vance)" in env.unwrapped.messages[-1]["content"]
    finally:
        server.close()
    _, _, term, trunc, info = env.step(act(env, call("search", query="Quillhaven")))
    assert info["tool_calls"][0]["status"] == "tool_error" and not (term or trunc)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
    ],
)
def test_a_server_dripping_a_body_without_content_length_is_a_tool_error(head):
    """Before the fix a step was still running at 30 s against a 4.1 s bound. The server (a real
    loopback one, tests/agent_gym/fault_server.py) answers with no Content-Length and sends
    one byte every 0.2 s without end; the search is cut at the retriever's deadline."""
    from tests.agent_gym.fault_server import FaultServer, drip

    with FaultServer(drip(head)) as server:
        env = make(retriever=server.url, retriever_kwargs={"timeout_s": 1.0, "retries": 1, "backoff_s": 0.05})
        env.reset(options={"task_index": 0})
        _, _, term, trunc, info = env.step(act(env, call("search", query="Marlow Vance")))
        assert [c["status"] for c in info["tool_calls"]] == ["tool_error"] and not (term or trunc)
        assert server.connections == 2


def test_naive_rag_survives_a_dead_server_at_reset():
    env = make(
        "AgentR1/HotpotQA-NaiveRAG-v0", retriever=closed_port_url(), retriever_kwargs={"timeout_s": 1.0, "retries": 0}
    )
    obs, info = env.reset(options={"task_index": 0})
    assert "RetrieverError" in info["retrieval_error"] and info["retrieved_titles"] == []
    assert "retrieval failed" in text_of(env, obs["input_ids"])


def test_blank_query_and_unknown_lookup_title_are_tool_errors():
    env = make(lookup_tool=True, max_invalid_calls=5)
    env.reset(options={"task_index": 0})
    _, _, _, _, info = env.step(act(env, call("search", query="   ")))
    assert info["tool_calls"][0]["status"] == "tool_error"
    _, _, _, _, info = env.step(act(env, call("lookup", title="No Such Page")))
    assert info["tool_calls"][0]["status"] == "tool_error"
    assert "no paragraph titled 'No Such Page'" in env.unwrapped.messages[-1]["content"]
    _, _, _, _, info = env.step(act(env, call("lookup", title="  marlow   VANCE ")))
    assert info["tool_calls"][0]["status"] == "ok"
    assert env.unwrapped.messages[-1]["content"].startswith("Doc 1 (Title: Marlow Vance) Marlow Vance (14 March")


def test_results_are_cut_to_the_token_budget():
    env = make(max_result_tokens=40, topk=3)
    u = env.unwrapped
    env.reset(options={"task_index": 0})
    _, _, _, _, info = env.step(act(env, call("search", query="Glass Orchard Marlow Vance director")))
    content = u.messages[-1]["content"]
    assert len(u.tokenizer.encode(content, add_special_tokens=False)) <= 40
    assert content.startswith("Doc 1 (Title: ") and content.endswith(" ...")
    full = make(max_result_tokens=4096)
    full.reset(options={"task_index": 0})
    full.step(act(full, call("search", query="Glass Orchard Marlow Vance director")))
    assert full.unwrapped.messages[-1]["content"].startswith(content[: -len(" ...")])


@pytest.mark.parametrize("budget", [12, 30, 60, 400])
def test_formatter_cut_by_offsets_and_by_exact_counts_agree(budget):
    from agent_gym.datasets import load_corpus
    from agent_gym.retrievers import Passage
    from agent_gym.tokenizer import load_tokenizer
    from envs.qa import PassageFormatter

    tok = load_tokenizer(None)
    docs = load_corpus(FIXTURES / "corpus.jsonl")
    passages = [Passage(d["title"], d["text"] + " Ünïcödé 京都 text", 0.0, d["id"]) for d in docs]
    fast, slow = PassageFormatter(tok, budget), PassageFormatter(tok, budget)
    slow._backend = None  # the path for tokenizers without offsets: binary search on exact counts
    for i in range(len(passages)):
        group = passages[i:] + passages[:i]
        (a, ta), (b, tb) = fast.format(group), slow.format(group)
        assert len(tok.encode(a, add_special_tokens=False)) <= budget and ta == tb
        assert a == b  # both find the longest prefix that fits


class _SpyTokenizer:
    """The env tokenizer, recording how many characters each encode call is given."""

    def __init__(self, tok):
        self.tok, self.is_fast, self.sizes = tok, True, []
        spy = self

        class Backend:
            def encode(self, text, add_special_tokens=False):
                spy.sizes.append(len(text))
                return tok.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)

            def encode_batch(self, texts, add_special_tokens=False):
                spy.sizes.extend(len(t) for t in texts)
                return tok.backend_tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)

        self.backend_tokenizer = Backend()

    def encode(self, text, add_special_tokens=False):
        self.sizes.append(len(text))
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def get_vocab(self):
        return self.tok.get_vocab()


@pytest.mark.timeout(60)
def test_formatter_never_tokenizes_a_huge_passage_whole():
    # Before the fix a 20 MB passage cost 60 s per step; every search re-tokenized it whole.
    from agent_gym.retrievers import Passage
    from agent_gym.tokenizer import load_tokenizer
    from envs.qa import PassageFormatter

    tok = _SpyTokenizer(load_tokenizer(None))
    huge = Passage("Quillhaven", "the lighthouse keepers of quillhaven " * 150_000, 1.0, "big")  # 5.5 MB
    small = Passage("Odile Brask", "Odile Brask was a painter from Harrowgate Vale.", 0.5, "s")
    fmt = PassageFormatter(tok, 512)
    for group in ([huge, small], [small, huge]):
        tok.sizes.clear()
        text, titles = fmt.format(group)
        assert titles == [g.title for g in group][: len(titles)] and text.endswith(" ...")
        assert len(tok.tok.encode(text, add_special_tokens=False)) <= 512
        assert max(tok.sizes) < 100_000, max(tok.sizes)  # a prefix, never the 5.5 MB line
        tok.sizes.clear()
        assert fmt.format(group) == (text, titles)
        assert tok.sizes == []  # measured once per passage and rank, then cached


def _spaceless(kind):
    """About 5 MB of text with no space after its first few words."""
    import base64

    if kind == "cjk":
        return "京都の灯台守" * 290_000  # 1.74 M characters, 5.2 MB in UTF-8
    if kind == "base64":
        return base64.b64encode(np.random.default_rng(0).bytes(3_750_000)).decode()  # 5 MB
    return "the lighthouse keepers of quillhaven " * 12 + "x" * 5_000_000  # words, then one long run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["cjk", "base64", "words_then_run"])
def test_formatter_never_tokenizes_a_spaceless_huge_passage_whole(kind):
    # Before the fix a passage with no space in the probe windows was tokenized whole
    # (the probes only counted prefixes ending at a space), and its cut re-encoded the whole line
    # every time the passage came back.
    from agent_gym.retrievers import Passage
    from agent_gym.tokenizer import load_tokenizer
    from envs.qa import PassageFormatter

    tok = _SpyTokenizer(load_tokenizer(None))
    text = _spaceless(kind)
    huge = Passage("Quillhaven", text, 1.0, "big")
    small = Passage("Odile Brask", "Odile Brask was a painter from Harrowgate Vale.", 0.5, "s")
    fmt = PassageFormatter(tok, 512)
    # The reference tokenizes every line whole (no probes): on a prefix of the passage longer than
    # the formatter's character bound, it must give the same text (nothing past the bound shows).
    whole = PassageFormatter(tok.tok, 512, probe_chars=10**9)
    head_only = Passage(huge.title, text[:200_000], 1.0, "big-prefix")
    for group in ([huge, small], [small, huge]):
        tok.sizes.clear()
        got, titles = fmt.format(group)
        assert max(tok.sizes) < len(text) // 50, max(tok.sizes)  # never the 5 MB line
        assert max(tok.sizes) <= fmt._char_bound() < 200_000
        tok.sizes.clear()
        assert fmt.format(group) == (got, titles) and tok.sizes == []  # measure and cut cached
        ref = [head_only if p is huge else p for p in group]
        assert (got, titles) == whole.format(ref)
        assert len(tok.tok.encode(got, add_special_tokens=False)) <= 512 and got.endswith(" ...")
        assert huge.title in titles and titles == [p.title for p in group][: len(titles)]
    if kind == "words_then_run":  # the words before the run are shown, the run is not
        assert got.endswith(
            "(Title: Quillhaven) "
            + "the lighthouse keepers of quillhaven " * 11
            + "the lighthouse keepers of quillhaven ..."
        )
    else:  # no space before the cut: only the title shows
        assert got.endswith("Doc 2 (Title: Quillhaven) ...")


@pytest.mark.parametrize("budget", [12, 30, 60, 400])
def test_formatter_prefix_measure_agrees_with_whole_line(budget):
    # Measuring on short prefixes (probe_chars 40 forces it on the fixture passages) gives the
    # same text as tokenizing every line whole, on the offsets path and on the exact-count path.
    from agent_gym.datasets import load_corpus
    from agent_gym.retrievers import Passage
    from agent_gym.tokenizer import load_tokenizer
    from envs.qa import PassageFormatter

    tok = load_tokenizer(None)
    docs = load_corpus(FIXTURES / "corpus.jsonl")
    passages = [Passage(d["title"], (d["text"] + " Ünïcödé 京都 text ") * 5, 0.0, d["id"]) for d in docs]
    for slow in (False, True):
        probing, whole = PassageFormatter(tok, budget, probe_chars=40), PassageFormatter(tok, budget, probe_chars=10**9)
        if slow:
            probing._backend = whole._backend = None
        for i in range(len(passages)):
            group = passages[i:] + passages[:i]
            assert probing.format(group) == whole.format(group)
            assert probing.format(group) == whole.format(group)  # cached


# -- rewards ---------------------------------------------------------------------------------


def test_supporting_hit_is_paid_once_per_supporting_title():
    env = make(lookup_tool=True, rewards={"extra": {"supporting_hit": 0.5}})
    _, info = env.reset(options={"task_index": 0})  # supporting: The Glass Orchard, Marlow Vance
    assert info["supporting_total"] == 2
    steps = [
        (call("lookup", title="The Glass Orchard"), 0.5, 1),
        (call("lookup", title="the glass orchard") + call("lookup", title="The Glass Orchard"), None, 1),
        (call("lookup", title="Odile Brask"), None, 1),  # shown, but not supporting
        (call("lookup", title="Marlow Vance") + call("lookup", title="Marlow Vance"), 0.5, 2),
        (call("search", query="Marlow Vance director Glass Orchard"), None, 2),
    ]
    for text, hit, found in steps:
        _, r, _, _, info = env.step(act(env, text))
        assert all(c["status"] == "ok" for c in info["tool_calls"]), info["tool_calls"]
        assert info["reward_components"].get("supporting_hit") == hit and r == (hit or 0.0)
        assert info["supporting_found"] == found
    # A new episode pays again.
    env.reset(options={"task_index": 0})
    _, r, *_ = env.step(act(env, call("search", query="The Glass Orchard")))
    assert r == 1.0  # both supporting paragraphs in one result


def test_supporting_hit_is_logged_even_at_weight_zero():
    env = make()
    env.reset(options={"task_index": 0})
    _, r, *_, info = env.step(act(env, call("search", query="Marlow Vance")))
    assert info["reward_components"]["supporting_hit"] == 0.0 and r == 0.0 and info["supporting_found"] >= 1


def test_process_and_format_rewards_add_up():
    env = make(rewards={"call_ok": 0.05, "call_invalid": -0.2, "format": 0.1, "extra": {"supporting_hit": 0.25}})
    env.reset(options={"task_index": 2})  # "Is Quillhaven a coastal town?" -> yes
    _, r, *_, info = env.step(act(env, call("search", query="Quillhaven") + call("nope")))
    assert info["reward_components"] == {"tool": 0.05, "invalid": -0.2, "supporting_hit": 0.25}
    assert r == pytest.approx(0.1)
    _, r, term, _, info = env.step(act(env, "<answer>Yes</answer>"))
    assert term and info["reward_components"] == {"em": 1.0, "format": 0.1} and r == pytest.approx(1.1)
    assert info["trajectory"].step_rewards == pytest.approx([0.1, 1.1]) and info["trajectory"].success


@pytest.mark.parametrize("answer, total", [("Harrowgate", 0.5), ("", 0.0)])
def test_supporting_hits_count_only_in_an_answered_episode_with_process_needs_answer(answer, total):
    env = make(rewards={"extra": {"supporting_hit": 0.25}, "process_needs_answer": True})
    env.reset(options={"task_index": 0})  # supporting: The Glass Orchard, Marlow Vance
    _, r, *_ = env.step(act(env, call("search", query="The Glass Orchard")))
    assert r == 0.5  # both supporting paragraphs, paid when found
    _, r, term, _, info = env.step(act(env, f"<answer>{answer}</answer>"))  # wrong or blank
    assert term and info["reward_components"].get("process_forfeit") == (None if answer else -0.5)
    assert sum(info["trajectory"].step_rewards) == total


@pytest.mark.parametrize(
    "gate, answer, paid",
    [
        ("f1", "Quillhaven", True),  # right
        ("f1", "Quillhaven Harrowgate", True),  # partly right: F1 2/3 > 0
        ("f1", "Harrowgate", False),  # well formed, wrong: no more than a blank answer
        ("f1", "", False),
        ("em", "Quillhaven Harrowgate", False),  # the gate's own score decides
        ("substring", "Quillhaven Harrowgate", True),  # computed for the gate though no weight names it
    ],
)
def test_format_gate_pays_the_format_reward_only_for_an_answer_that_scores(gate, answer, paid):
    env = make(rewards={"answer_weights": {"em": 1.0}, "format": 0.2, "format_gate": gate})
    env.reset(options={"task_index": 0})  # gold: Quillhaven
    _, r, term, _, info = env.step(act(env, f"<answer>{answer}</answer>"))
    assert term and info["reward_components"]["format"] == (0.2 if paid else 0.0)
    assert r == pytest.approx(info["reward_components"]["em"] + (0.2 if paid else 0.0))
    assert gate in info["answer_scores"]


@pytest.mark.parametrize("gate, err", [("F1", ValueError), ("judge", ValueError), ("", TypeError), (1, TypeError)])
def test_format_gate_refuses_a_score_the_env_never_computes(gate, err):
    with pytest.raises(err, match="format_gate"):
        make(rewards={"format": 0.2, "format_gate": gate})


STUFFED = "Quillhaven Harrowgate Vale Estmark Marlow Vance Odile Brask yes no 1884 1968"


@pytest.mark.parametrize("metric", ["em", "f1", "substring"])
def test_empty_and_stuffed_answers(metric):
    env = make(answer_metric=metric)
    for answer, expect in [("", 0.0), ("   ", 0.0), ("the", 0.0), (STUFFED, None), ("Quillhaven", 1.0)]:
        env.reset(options={"task_index": 0})
        _, r, term, _, info = env.step(act(env, f"<answer>{answer}</answer>"))
        assert term
        if expect is not None:
            assert r == expect, (metric, answer)
        elif metric == "em":
            assert r == 0.0
        elif metric == "f1":
            assert r == pytest.approx(2 / 13)  # one gold token of twelve: P 1/12, R 1, F1 2 * (1/12) / (13/12)
        else:
            assert r == 1.0  # the known hack, which is why substring is never the default
        assert ("substring" in info["answer_scores"]) == (metric == "substring")


def test_aliases_count_and_default_reward_is_em():
    env = make("AgentR1/2WikiMultiHopQA-v0", data_path=str(FIXTURES / "2wikimultihopqa"))
    assert env.unwrapped.reward_cfg.answer_weights == {"em": 1.0}
    env.reset(options={"task_index": 0})  # Quillhaven, aliases Quillhaven Town, Quillhavener
    _, r, *_, info = env.step(act(env, "<answer>the quillhavener.</answer>"))
    assert r == 1.0 and info["answer_scores"]["em"] == 1.0


def test_explicit_answer_weights_override_the_metric():
    env = make(answer_metric="substring", rewards={"answer_weights": {"em": 1.0, "f1": 0.5}})
    env.reset(options={"task_index": 0})
    _, r, *_, info = env.step(act(env, "<answer>Quillhaven</answer>"))
    assert info["reward_components"] == {"em": 1.0, "f1": 0.5, "format": 0.0} and r == 1.5


# -- formats and the NaiveRAG variants -------------------------------------------------------


def test_search_r1_format():
    env = make(
        "AgentR1/MuSiQue-v0",
        data_path=str(FIXTURES / "musique"),
        tool_format="search_r1",
        rewards={"extra": {"supporting_hit": 1.0}},
    )
    u = env.unwrapped
    obs, info = env.reset(options={"task_index": 0})
    assert list(u.tools) == ["search"] and "<search> query </search>" in u.system_prompt
    _, r, term, trunc, info = env.step(act(env, "I will look it up. <search>The Glass Orchard director</search>"))
    assert info["tool_calls"] == [
        {"name": "search", "arguments": {"query": "The Glass Orchard director"}, "status": "ok"}
    ]
    msg = u.messages[-1]
    assert msg["role"] == "user" and msg["content"].startswith("<information>Doc 1 (Title: ")
    assert msg["content"].endswith("</information>") and r >= 1.0
    _, r, term, _, info = env.step(act(env, "<answer>Quillhaven Town</answer>"))
    assert term and r == 1.0


@pytest.mark.parametrize(
    "env_id,sub",
    [
        ("AgentR1/HotpotQA-NaiveRAG-v0", "hotpotqa"),
        ("AgentR1/2WikiMultiHopQA-NaiveRAG-v0", "2wikimultihopqa"),
        ("AgentR1/MuSiQue-NaiveRAG-v0", "musique"),
    ],
)
def test_naive_rag_observation_holds_the_passages(env_id, sub):
    env = make(env_id, data_path=str(FIXTURES / sub))
    u = env.unwrapped
    obs, info = env.reset(options={"task_index": 0})
    text = text_of(env, obs["input_ids"])
    assert u.tools == {} and info["tool_schemas"] == [] and "<tool_call>" not in text
    assert "Passages:\nDoc 1 (Title: " in text and f"Question: {u.task['question']}" in text
    assert info["retrieved_titles"] and info["supporting_found"] >= 1 and info["retrieval_error"] == ""
    assert "film director born in Quillhaven" in text  # the paragraph that answers it
    _, r, term, trunc, info = env.step(act(env, "<answer>Quillhaven</answer>"))
    assert (term, trunc, r) == (True, False, 1.0)


def test_naive_rag_turn_without_answer_ends_the_episode():
    env = make("AgentR1/HotpotQA-NaiveRAG-v0", rewards={"call_invalid": -0.5})
    env.reset(options={"task_index": 0})
    _, r, term, trunc, info = env.step(act(env, "I think it is Quillhaven."))
    assert term and not trunc and r == 0.0 and info["answer"] is None and "trajectory" in info
    env.reset(options={"task_index": 0})
    _, r, term, _, info = env.step(act(env, call("search", query="x")))
    assert term and info["tool_calls"][0]["status"] == "unknown_tool" and r == -0.5
    with pytest.raises(ValueError, match="single-turn"):
        make("AgentR1/HotpotQA-NaiveRAG-v0", max_turns=3)


# -- construction errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,exc,needle",
    [
        ({"data_path": "/no/such/hotpot.json"}, FileNotFoundError, "data_path '/no/such/hotpot.json' does not exist"),
        ({"data_path": str(FIXTURES / "musique")}, FileNotFoundError, r"no 'dev' file in directory"),
        ({"corpus_path": "/no/corpus.jsonl"}, FileNotFoundError, "corpus_path '/no/corpus.jsonl' does not exist"),
        ({"answer_metric": "bleu"}, ValueError, "unknown answer_metric 'bleu'; valid: em, f1, substring"),
        ({"topk": 0}, ValueError, "topk must be a positive integer, got 0"),
        ({"topk": "3"}, ValueError, "topk must be a positive integer, got '3'"),
        ({"max_result_tokens": -1}, ValueError, "max_result_tokens must be a positive integer"),
        ({"limit": 0}, ValueError, "limit must be a positive integer"),
        ({"retriever": "faiss"}, ValueError, "unknown retriever kind 'faiss'; valid kinds: bm25"),
        ({"retriever": 3}, ValueError, "retriever must be a kind name"),
        (
            {"rewards": {"extra": {"supporting_hits": 1.0}}},
            ValueError,
            r"unknown rewards extra key\(s\) \['supporting_hits'\]",
        ),
        ({"rewards": {"answer_weights": {"bleu": 1.0}}}, ValueError, r"unknown answer_weights key\(s\) \['bleu'\]"),
        ({"lookup_tool": True, "tool_format": "search_r1"}, ValueError, "lookup_tool=True needs tool_format='hermes'"),
        ({"tool_format": "xml"}, ValueError, "unknown tool_format 'xml'"),
    ],
)
def test_bad_constructor_arguments_fail_at_make(kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        make(**kwargs)


def test_a_retriever_object_is_used_as_given():
    r = make_retriever("bm25", corpus=str(FIXTURES / "wiki18_style.jsonl"), cache=False)
    env = gym.make("AgentR1/HotpotQA-v0", data_path=HOTPOT, retriever=r)
    assert env.unwrapped.retriever is r
    env.reset(options={"task_index": 0})
    env.step(act(env, call("search", query="Marlow Vance")))
    assert "(Title: Marlow Vance) Marlow Vance Marlow Vance (14 March" in env.unwrapped.messages[-1]["content"]
    with pytest.raises(ValueError, match="retriever_kwargs apply only"):
        gym.make("AgentR1/HotpotQA-v0", data_path=HOTPOT, retriever=r, retriever_kwargs={"cache": False})


def test_envs_of_one_process_share_tasks_and_retriever():
    a, b = make().unwrapped, make().unwrapped
    assert a.tasks is b.tasks and a.retriever is b.retriever
    c = make(limit=2).unwrapped
    assert len(c.tasks) == 2 and c.retriever is not a.retriever  # a smaller split, a smaller corpus


# -- the oracle run on the shared dev samples --------------------------------------------------

ORACLE = [
    ("AgentR1/HotpotQA-v0", "hotpotqa", 600),
    ("AgentR1/2WikiMultiHopQA-v0", "2wikimultihopqa", 300),
    ("AgentR1/MuSiQue-v0", "musique", 100),
]


@pytest.fixture(scope="module", params=ORACLE, ids=[o[1] for o in ORACLE])
def oracle_env(request, shared_data):
    env_id, sub, rows = request.param
    env = gym.make(
        env_id,
        data_path=str(shared_data / sub / "dev_sample.jsonl"),
        corpus_path=str(shared_data / sub / "corpus.jsonl"),
        retriever_kwargs=NO_CACHE,
        lookup_tool=True,
        max_turns=4,
        rewards={"extra": {"supporting_hit": 1.0}},
    )
    assert env.unwrapped.num_tasks() == rows
    return env


def test_oracle_gets_every_row_right_and_a_wrong_answer_scores_zero(oracle_env):
    env, u = oracle_env, oracle_env.unwrapped
    n = u.num_tasks()
    answers = [u.get_task(i)["answer"] for i in range(n)]
    searched = total = 0
    for i in range(n):
        _, info = env.reset(options={"task_index": i})
        task = u.task
        titles = task["supporting_titles"]
        # Turn 1: search each supporting title. Turn 2: read the ones search missed.
        _, r1, term, trunc, info = env.step(act(env, "".join(call("search", query=t) for t in titles)))
        assert not (term or trunc) and all(c["status"] == "ok" for c in info["tool_calls"]), (task["id"], info)
        searched += info["supporting_found"]
        missing = [t for t in titles if t not in u._found]
        r2 = 0.0
        if missing:
            _, r2, term, trunc, info = env.step(act(env, "".join(call("lookup", title=t) for t in missing)))
            assert all(c["status"] == "ok" for c in info["tool_calls"]), (task["id"], info)
        assert info["supporting_found"] == len(titles) and r1 + r2 == len(titles)
        for m in u.messages[2:]:  # every result within the budget of 512 tokens
            if m["role"] == "tool":
                assert len(u.tokenizer.encode(m["content"], add_special_tokens=False)) <= 512
        total += len(titles)
        _, r, term, trunc, info = env.step(act(env, f"<answer>{task['answer']}</answer>"))
        assert term and info["answer_scores"]["em"] == 1.0 and r == 1.0, (task["id"], task["answer"], info)
        # A wrong answer: another row's gold that matches none of this row's golds.
        golds = {normalize_answer(g) for g in [task["answer"], *task["aliases"]]}
        wrong = next(a for a in answers[i + 1 :] + answers[:i] if normalize_answer(a) not in golds)
        env.reset(options={"task_index": i})
        _, r, term, _, info = env.step(act(env, f"<answer>{wrong}</answer>"))
        assert term and r == 0.0 and info["answer_scores"]["em"] == 0.0, (task["id"], wrong)
    print(
        f"\n{u.env_id}: {n} rows, EM 1.0 on all; supporting titles found by searching the title: "
        f"{searched}/{total} ({searched / total:.1%}), the rest by lookup"
    )


# -- official scoring per dataset ------------------------------------------------------------


def _one_row_file(tmp_path, answer, aliases):
    row = {
        "id": "x1",
        "question": "Which one?",
        "answer": answer,
        "aliases": aliases,
        "supporting_titles": ["Norway"],
        "context": [{"title": "Norway", "text": "Norway is a country with no city called Quill."}],
        "type": "2hop",
    }
    p = tmp_path / "dev.jsonl"
    p.write_text(json.dumps(row) + "\n")
    return str(p)


@pytest.mark.parametrize(
    ("env_id", "f1"),
    [
        ("AgentR1/MuSiQue-v0", 2 / 3),  # MuSiQue's metric: no yes/no rule
        ("AgentR1/HotpotQA-v0", 0.0),  # HotpotQA's script: a "no" gold only matches "no"
        ("AgentR1/2WikiMultiHopQA-v0", 0.0),
        ("AgentR1/MuSiQue-NaiveRAG-v0", 2 / 3),
    ],
)
def test_each_env_scores_with_its_official_script(tmp_path, env_id, f1):
    env = make(env_id, data_path=_one_row_file(tmp_path, "Norway", ["no"]), answer_metric="f1")
    env.reset(options={"task_index": 0})
    _, r, term, _, info = env.step(act(env, "<answer>no city</answer>"))
    assert term and info["answer_scores"]["f1"] == pytest.approx(f1) and r == pytest.approx(f1)


@pytest.mark.parametrize("env_id", ["AgentR1/HotpotQA-v0", "AgentR1/MuSiQue-v0"])
def test_a_gold_that_normalizes_to_nothing_pays_nothing(tmp_path, env_id):
    # HotpotQA dev row 5a8b3d795542997f31a41cc1 has the answer "!!!": the official scripts give "!!!",
    # "the" or an empty answer EM 1; as a reward that would pay for saying nothing.
    env = make(env_id, data_path=_one_row_file(tmp_path, "!!!", []))
    for answer in ("!!!", "the", ""):
        env.reset(options={"task_index": 0})
        _, r, term, _, info = env.step(act(env, f"<answer>{answer}</answer>"))
        assert term and r == 0.0 and info["answer_scores"] == {"em": 0.0, "f1": 0.0} and not info["trajectory"].success


# -- pickle and deepcopy ----------------------------------------------------------------------

QA_IDS = {
    "AgentR1/HotpotQA-v0": "hotpotqa",
    "AgentR1/2WikiMultiHopQA-v0": "2wikimultihopqa",
    "AgentR1/MuSiQue-v0": "musique",
    "AgentR1/HotpotQA-NaiveRAG-v0": "hotpotqa",
    "AgentR1/2WikiMultiHopQA-NaiveRAG-v0": "2wikimultihopqa",
    "AgentR1/MuSiQue-NaiveRAG-v0": "musique",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", sorted(QA_IDS))
def test_qa_env_pickles_and_deep_copies_mid_episode(env_id):
    # Before: TypeError from PyStemmer's Stemmer inside the bm25 retriever.
    import copy
    import pickle

    tool_env = "NaiveRAG" not in env_id
    env = make(env_id, data_path=str(FIXTURES / QA_IDS[env_id]), **({"lookup_tool": True} if tool_env else {}))
    env.reset(seed=3, options={"task_index": 0})
    if tool_env:
        env.step(act(env, call("search", query="Marlow Vance film director")))
    clones = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    steps = (
        [call("search", query="Quillhaven lighthouse"), "<answer>Quillhaven</answer>"]
        if tool_env
        else ["<answer>Quillhaven</answer>"]
    )
    for text in steps:
        want = env.step(act(env, text))
        for c in clones:
            got = c.step(act(c, text))
            assert np.array_equal(got[0]["input_ids"], want[0]["input_ids"])
            assert got[1:4] == want[1:4]
    assert want[2]  # the episode ended on the answer


# -- lookup never reads past the retriever's corpus (no leak of the gold paragraphs) ----------


def _corpus_without(tmp_path, drop):
    rows = [json.loads(x) for x in (FIXTURES / "corpus.jsonl").read_text().splitlines()]
    path = tmp_path / "served.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["title"] not in drop))
    return path


TOOL_QA_IDS = sorted(k for k in QA_IDS if "NaiveRAG" not in k)  # NaiveRAG has no lookup tool


@pytest.mark.parametrize("env_id", TOOL_QA_IDS)
def test_lookup_with_an_http_retriever_needs_its_corpus(tmp_path, env_id):
    # The server's corpus lacks the gold paragraph "Marlow Vance" (in task 0's context in each
    # fixture). Before the fix lookup read the split's own context paragraphs and handed it over
    # (a fullwiki leak).
    data = str(FIXTURES / QA_IDS[env_id])
    assert "Marlow Vance" in make(env_id, data_path=data).unwrapped.get_task(0)["supporting_titles"]
    served = _corpus_without(tmp_path, {"Marlow Vance"})
    with RetrievalServer(make_retriever("bm25", corpus=str(served), cache=False)) as server:
        with pytest.raises(ValueError, match="lookup_tool=True needs the corpus the retriever searches"):
            make(env_id, data_path=data, retriever=server.url, retriever_kwargs={"timeout_s": 5.0}, lookup_tool=True)
        env = make(
            env_id,
            data_path=data,
            retriever=server.url,
            retriever_kwargs={"timeout_s": 5.0},
            lookup_tool=True,
            corpus_path=str(served),
        )
        env.reset(options={"task_index": 0})
        _, _, _, _, info = env.step(act(env, call("lookup", title="Marlow Vance")))
        assert info["tool_calls"][0]["status"] == "tool_error"
        assert "no paragraph titled 'Marlow Vance'" in env.unwrapped.messages[-1]["content"]
        _, _, _, _, info = env.step(act(env, call("lookup", title="The Glass Orchard")))
        assert info["tool_calls"][0]["status"] == "ok"


@pytest.mark.parametrize("env_id", TOOL_QA_IDS)
def test_lookup_reads_the_corpus_the_retriever_was_given(tmp_path, env_id):
    docs = load_corpus(_corpus_without(tmp_path, {"Marlow Vance"}))
    env = make(
        env_id,
        data_path=str(FIXTURES / QA_IDS[env_id]),
        lookup_tool=True,
        retriever_kwargs={"corpus": docs, "cache": False},
    )
    env.reset(options={"task_index": 0})
    _, _, _, _, info = env.step(act(env, call("lookup", title="Marlow Vance")))
    assert info["tool_calls"][0]["status"] == "tool_error"  # in the split's context, not in the corpus
    _, _, _, _, info = env.step(act(env, call("lookup", title="Vance Motor Works")))
    assert info["tool_calls"][0]["status"] == "ok"


# -- the oracle: trainers/evaluate.py --policy oracle and SFT demonstrations --------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("env_id", sorted(QA_IDS))
def test_evaluate_oracle_policy_on_every_qa_env(env_id, tmp_path):
    # Before: "error: HotpotQAEnv has no demonstration(task)" (SystemExit).
    from trainers import evaluate

    kwargs = json.dumps({"data_path": str(FIXTURES / QA_IDS[env_id]), "retriever_kwargs": NO_CACHE})
    tasks = make(env_id, data_path=str(FIXTURES / QA_IDS[env_id])).unwrapped.tasks
    n = len(tasks)
    assert (
        evaluate.main(
            ["--env", env_id, "--policy", "oracle", "--tasks", str(n), "--env-kwargs", kwargs, "--out", str(tmp_path)]
        )
        == 0
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == n and summary["eval/em"] == 1.0 and summary["eval/success_rate"] == 1.0
    if "NaiveRAG" not in env_id:  # one search per supporting title, every one answered
        per_task = sum(len(t.supporting_titles) for t in tasks) / n
        assert summary["eval/tools/ok_per_episode"] == pytest.approx(per_task)
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == n


def test_oracle_follows_the_tool_format_and_turn_budget():
    env = make("AgentR1/MuSiQue-v0", data_path=str(FIXTURES / "musique"), tool_format="search_r1", max_turns=2)
    u = env.unwrapped
    env.reset(options={"task_index": 0})
    turns = u.demonstration(u.task)
    assert turns[0] == f"<search>{u.task['supporting_titles'][0]}</search>" and len(turns) == 2
    for text in turns:
        _, r, term, trunc, info = env.step(act(env, text))
    assert term and r == 1.0 and info["tool_calls"] == []


@pytest.mark.timeout(120)
def test_sft_demonstrations_from_a_qa_env():
    from trainers.sft import demonstrations

    env = make("AgentR1/2WikiMultiHopQA-v0", data_path=str(FIXTURES / "2wikimultihopqa")).unwrapped
    episodes = demonstrations(env, list(range(len(env.tasks))), "oracle")
    assert len(episodes) == len(env.tasks) and all(ep.answer_scores["em"] == 1.0 for ep in episodes)


# -- a task given at reset is checked there -------------------------------------------------------


@pytest.mark.parametrize("env_id", ["AgentR1/HotpotQA-v0", "AgentR1/MuSiQue-NaiveRAG-v0"])
@pytest.mark.parametrize(
    "bad,key,needle",
    [
        ({"aliases": "P"}, "aliases", r"is the string 'P', expected a list of strings; write \['P'\]"),
        ({"answer": None}, "answer", "is null"),
        ({"answer": ["Paris", "Lutetia"]}, "answer", "is a list"),
        ({"answer": 1.5}, "answer", "must be a string, got float"),
        ({"aliases": ["Lutetia", None]}, "aliases[1]", "is null"),
        ({"supporting_titles": "Paris"}, "supporting_titles", "is the string 'Paris'"),
        ({"answer": ""}, "answer", "is blank"),  # before: EM 1 for every answer normalizing to ""
        ({"answer": "  \n"}, "answer", "is blank"),
        ({"aliases": ["Lutetia", " "]}, "aliases[1]", "is blank"),
    ],
)
def test_a_bad_task_given_at_reset_is_refused_and_the_env_is_unchanged(env_id, bad, key, needle):
    # Before: aliases "P" was split into characters (answer "P" scored EM 1 for gold Paris), and a
    # None answer raised TypeError at every step instead of at reset.
    import re

    sub = QA_IDS[env_id]
    env = make(env_id, data_path=str(FIXTURES / sub))
    u = env.unwrapped
    env.reset(options={"task_index": 0})
    if u.tools:  # mid-episode, with a supporting paragraph found
        env.step(act(env, call("search", query="Marlow Vance film director")))
        assert u._found
    state = lambda: (list(u._ids), dict(u.task), set(u._found), u.turn, u._done, list(u.messages))  # noqa: E731
    before = state()
    task = {"id": "paris", "question": "Which city is the capital of France?", "answer": "Paris", **bad}
    with pytest.raises(ValueError, match=rf"options\['task'\], key '{re.escape(key)}': {needle}"):
        env.reset(options={"task": task})
    assert state() == before
    # The forms the check accepts: one alias in a list, an int answer as its decimal string.
    env.reset(options={"task": {"question": "Capital of France?", "answer": "Paris", "aliases": ["P"]}})
    _, r, term, _, info = env.step(act(env, "<answer>P</answer>"))
    assert term and r == 1.0
    env.reset(options={"task": {"question": "Capital of France?", "answer": "Paris"}})
    _, r, term, _, info = env.step(act(env, "<answer>P</answer>"))
    assert term and r == 0.0 and u.task["aliases"] == [] and u.task["supporting_titles"] == []
    env.reset(options={"task": {"question": "When was the lighthouse built?", "answer": 1884}})
    _, r, term, _, info = env.step(act(env, "<answer>1884</answer>"))
    assert term and r == 1.0 and u.task["answer"] == "1884"


# -- NaiveRAG: the reason an episode ends is the same in info and the Episode ------------------


def test_naive_rag_action_cut_at_the_budget_ends_with_context_in_info_and_episode():
    # Before: info["truncation_reason"] None while info["trajectory"].truncation_reason said "context".
    env = make("AgentR1/HotpotQA-NaiveRAG-v0", rewards={"format": 0.5})
    u = env.unwrapped
    obs, _ = env.reset(options={"task_index": 0})
    room = u.max_context_tokens - len(obs["input_ids"])
    action = u.encode_turn("Quillhaven " * room + "<answer>Quillhaven</answer>")
    assert len(action) > room
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc) == (0.0, True, False)  # terminated: a one-step task (see the card)
    assert info["truncation_reason"] == info["trajectory"].truncation_reason == "context"
    assert info["answer"] is None and info["trajectory"].answer is None and info["reward_components"] == {}
    assert info["action_tokens_dropped"] == len(action) - room and len(obs["input_ids"]) == u.max_context_tokens + 1
    # A turn that fits but holds no answer: "max_turns" in both; an answer: None in both.
    env.reset(options={"task_index": 0})
    *_, term, trunc, info = env.step(act(env, "I think it is Quillhaven."))
    assert (term, trunc) == (True, False)
    assert info["truncation_reason"] == info["trajectory"].truncation_reason == "max_turns"
    env.reset(options={"task_index": 0})
    _, r, term, _, info = env.step(act(env, "<answer>Quillhaven</answer>"))
    assert term and r == 1.5 and info["truncation_reason"] is info["trajectory"].truncation_reason is None


# -- a step that raises leaves the supporting titles found as they were -------------------------


@pytest.mark.parametrize("env_id", TOOL_QA_IDS)
def test_a_step_interrupted_after_a_supporting_hit_is_rolled_back_with_found(monkeypatch, env_id):
    # Before: _found kept the titles of the interrupted step, so the retried step paid nothing.
    from unittest.mock import Mock

    kw = {"data_path": str(FIXTURES / QA_IDS[env_id]), "rewards": {"extra": {"supporting_hit": 0.5}}}
    env, fresh = make(env_id, **kw), make(env_id, **kw)
    u = env.unwrapped
    env.reset(options={"task_index": 0})
    fresh.reset(options={"task_index": 0})
    action = act(env, call("search", query="Marlow Vance film director"))
    want = fresh.step(action)
    assert want[1] >= 0.5 and want[4]["supporting_found"] >= 1  # the search finds a supporting title
    ids, found = list(u._ids), set(u._found)
    with monkeypatch.context() as m:  # the step is interrupted after its supporting hit was paid
        m.setattr(u, "_append_delta", Mock(side_effect=KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            env.step(action)
        assert u._append_delta.called
    assert list(u._ids) == ids and u._found == found == set()
    obs, r, term, trunc, info = env.step(action)
    assert np.array_equal(obs["input_ids"], want[0]["input_ids"]) and (r, term, trunc) == want[1:4]
    assert info["reward_components"] == want[4]["reward_components"] and u._found == fresh.unwrapped._found
