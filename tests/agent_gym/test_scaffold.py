"""Scaffolded turns (agent_gym/scaffold.py): the env writes a turn's prefix and closing text around
the model's part, which ends at a stop string.

- token-exactness and masks on the four template families of test_chat_templates.py (ChatML with
  tag tokens, Llama 3.1, Mistral, and SmolLM2's real tokenizer and template): the prompt with the
  first prefix is the template's render with the prefix as a partial assistant message; the whole
  context decodes to the template's render with ``prefix + model text + written close`` as each
  assistant message, and equals it token for token where the model's part ends at a pre-tokenizer
  boundary; the loss mask is 1 exactly on the model's ids;
- how a turn is read: the stop string, the stopping token that carries more characters, a turn
  the model ended itself, a turn cut by its length, JSON escaping of a call's argument;
- the schedule (turns past the list free, a callable of the state), the drop probability and its
  reset option, the per-turn ``stop_strings`` in ``info``, ``Episode.step_slots``;
- the refusal paths: bad specs, a tool with two required arguments, a chat client that cannot
  prefill (the backends' stop strings and a backend without them: tests/trainers/test_scaffold_rollout.py).
"""

import json

import numpy as np
import pytest

from agent_gym.env import ToolEnv
from agent_gym.scaffold import Scaffold, Slot, answer_slot, call_slot
from agent_gym.tokenizer import TAG_TOKENS, build_bpe_tokenizer
from agent_gym.tools import Tool, ToolResult
from tests.agent_gym.test_chat_templates import FAMILIES, smollm2_tokenizer


class Search(Tool):
    name, description = "search", "Search the docs."
    parameters = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

    def execute(self, query):
        return ToolResult(f"Doc 1 (Title: {query}) {query} was born in Dorsil.")


class Lookup(Tool):
    name, description = "lookup", "Two arguments."
    parameters = {
        "type": "object",
        "properties": {"entity": {"type": "string"}, "relation": {"type": "string"}},
        "required": ["entity", "relation"],
    }

    def execute(self, entity, relation):
        return "x"


class QEnv(ToolEnv):
    TASKS = [
        {"id": "q0", "question": "Where was Karimel born?", "answer": "Dorsil"},
        {"id": "q1", "question": "Where was Vanquen born?", "answer": "Orlen"},
    ]

    def __init__(self, tools=None, **kw):
        kw.setdefault("max_turns", 3)
        super().__init__(tools=[Search()] if tools is None else tools, **kw)

    def num_tasks(self):
        return len(self.TASKS)

    def get_task(self, i):
        return self.TASKS[i]

    def score_answer(self, answer, task):
        return {"em": float(answer == task["answer"])}


@pytest.fixture(scope="module", params=sorted(FAMILIES) + ["smollm2"])
def family(request):
    if request.param == "smollm2":
        return request.param, smollm2_tokenizer()
    return request.param, build_bpe_tokenizer(extra_tokens=TAG_TOKENS, **FAMILIES[request.param])


def ids_of(tok, text):
    return tok.encode(text, add_special_tokens=False)


def render(tok, env, messages, partial=None):
    """The template's own render (ids, text) of ``messages``, with ``partial`` as a partial assistant
    message (``continue_final_message``) when given, else with the generation prompt."""
    msgs = list(messages) + ([{"role": "assistant", "content": partial}] if partial is not None else [])
    kw = dict(
        tools=env.renderer.tools, continue_final_message=partial is not None, add_generation_prompt=partial is None
    )
    text = tok.apply_chat_template(msgs, tokenize=False, **kw)
    out = tok.apply_chat_template(msgs, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out), text


def test_scaffolded_episode_is_the_templates_render_with_exact_masks(family):
    name, tok = family
    fmt = "smollm2" if name == "smollm2" else "hermes"
    env = QEnv(tokenizer=tok, tool_format=fmt, scaffold=True)
    obs, info = env.reset(seed=0, options={"task_index": 0})
    call = call_slot(env.format, env.tools["search"])
    assert info["scaffold"] == "call:search" and info["stop_strings"] == ['"', "\n"]
    messages = [dict(m) for m in env.messages]
    ids = obs["input_ids"].tolist()
    # The prompt with the first prefix is the template's render of a partial assistant message.
    assert ids == render(tok, env, messages, partial=call.prefix)[0], name
    assert info["prompt_len"] == len(ids) and env.episode({}, None).loss_mask == [0] * len(ids)

    # Turn 1: the model writes the query and the closing quote and stops there (as a sampler with
    # the stop string does); the env writes the rest of the call and the end-of-turn token.
    a1 = ids_of(tok, 'Karimel birthplace"')
    obs, r, term, trunc, info = env.step(np.array(a1))
    assert (
        not term
        and not trunc
        and info["tool_calls"] == [{"name": "search", "arguments": {"query": "Karimel birthplace"}, "status": "ok"}]
    )
    assert info["scaffold_slot"] == {
        "slot": "call:search",
        "value": "Karimel birthplace",
        "stopped_at": 18,
        "close_written": call.close[1:],
    }
    assert info["action_text"] == 'Karimel birthplace"' and info["stop_strings"] == ['"', "\n"]
    content1 = call.prefix + 'Karimel birthplace"' + call.close[1:]
    assert info["turn_text"] == content1
    new = obs["input_ids"].tolist()
    s, e = info["action_span"]
    assert new[:s] == ids and new[s:e] == a1
    close_ids = ids_of(tok, call.close[1:])
    assert new[e : e + len(close_ids)] == close_ids and new[e + len(close_ids)] == env.eot_id
    messages += [{"role": "assistant", "content": content1}] + env.format.result_messages(
        [
            type(
                "O",
                (),
                {"result": ToolResult("Doc 1 (Title: Karimel birthplace) Karimel birthplace was born in Dorsil.")},
            )()
        ]
    )
    full_ids, full_text = render(tok, env, messages, partial=call.prefix)
    assert tok.decode(new, skip_special_tokens=False) == full_text, name

    # Turn 2: the model writes the whole close itself, so the env writes none (a model's part that
    # ends at a pre-tokenizer boundary: the context is the template's render token for token).
    ids = new
    a2 = ids_of(tok, "Dorsil" + call.close)
    obs, r, term, trunc, info = env.step(np.array(a2 + [env.eot_id]))
    assert info["tool_calls"][0]["arguments"] == {"query": "Dorsil"} and info["scaffold_slot"]["close_written"] == ""
    assert info["scaffold"] == "answer" and info["stop_strings"] == ["<", "\n\n"]
    messages += [{"role": "assistant", "content": call.prefix + "Dorsil" + call.close}] + env.format.result_messages(
        [type("O", (), {"result": ToolResult("Doc 1 (Title: Dorsil) Dorsil was born in Dorsil.")})()]
    )
    new = obs["input_ids"].tolist()
    want_ids, want_text = render(tok, env, messages, partial="<answer>")
    assert tok.decode(new, skip_special_tokens=False) == want_text, name
    # Token for token after turn 1's close (whose boundary with the model's quote is the one place
    # where the template would tokenize the text differently).
    first_call_end = len(ids)
    assert new[first_call_end:] == want_ids[len(want_ids) - (len(new) - first_call_end) :], name

    # Turn 3: the answer slot; the model stops at a blank line.
    a3 = ids_of(tok, "Dorsil\n\n")
    obs, r, term, trunc, info = env.step(np.array(a3))
    assert term and info["answer"] == "Dorsil" and r == 1.0
    ep = info["trajectory"]
    assert ep.step_slots == ["call:search", "call:search", "answer"]
    # The loss mask is 1 exactly on the model's ids: prefixes, closes and env tokens are 0.
    agent = [t for t, m in zip(ep.token_ids, ep.loss_mask) if m]
    assert agent == a1 + a2 + [env.eot_id] + a3
    for s, e in ep.step_spans:
        assert all(ep.loss_mask[s:e])
    assert sum(ep.loss_mask) == len(a1) + len(a2) + 1 + len(a3)
    assert tok.decode(ep.token_ids[ep.step_spans[2][1] :], skip_special_tokens=False).startswith("</answer>")


def test_a_stopping_token_that_carries_more_than_the_stop_string():
    env = QEnv(tool_format="smollm2", scaffold=True)
    env.reset(seed=0, options={"task_index": 0})
    slot = env._slot
    # '"}' closes the quote and the first brace: the env writes only the rest of the close.
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, 'Karimel"}')))
    assert info["scaffold_slot"]["close_written"] == slot.close[2:] and info["tool_calls"][0]["status"] == "ok"
    assert info["turn_text"] == slot.prefix + 'Karimel"}' + slot.close[2:]
    # '",' is not the start of the close: the context keeps the comma, the env reads the query.
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, 'Dorsil",')))
    assert info["tool_calls"][0]["arguments"] == {"query": "Dorsil"}
    assert info["scaffold_slot"]["close_written"] == slot.close[1:]
    assert info["turn_text"].endswith('"Dorsil",' + slot.close[1:])


def test_a_turn_the_model_ends_itself_or_that_runs_out_of_length():
    env = QEnv(scaffold=True)
    env.reset(seed=0, options={"task_index": 0})
    n = len(env._ids)
    # Ended with the end-of-turn token before any stop string: read as closed, nothing written
    # into the context (it would fall outside the assistant's message).
    a = ids_of(env.tokenizer, "Karimel") + [env.eot_id]
    obs, _, _, _, info = env.step(np.array(a))
    assert info["tool_calls"][0] == {"name": "search", "arguments": {"query": "Karimel"}, "status": "ok"}
    assert info["scaffold_slot"]["close_written"] == "" and info["scaffold_slot"]["stopped_at"] is None
    assert obs["input_ids"][n : n + len(a)].tolist() == a and not info["closed_by_env"]
    # Ran out of length (no stop string, no end-of-turn): the env closes the call and the turn.
    b = ids_of(env.tokenizer, "Dorsil and more")
    obs, _, _, _, info = env.step(np.array(b))
    s, e = info["action_span"]
    close = env.tokenizer.decode(obs["input_ids"][e:].tolist(), skip_special_tokens=False)
    assert close.startswith('"}}</tool_call><|im_end|>') and info["closed_by_env"]
    assert info["tool_calls"][0]["arguments"] == {"query": "Dorsil and more"}


@pytest.mark.parametrize(
    "value, query", [("a\\q", "a\\q"), ("a\\b", "a\b"), ("caf\\u00e9", "café"), ("tab\there", "tab\there")]
)
def test_a_call_argument_is_read_as_json_string_content_or_escaped(value, query):
    env = QEnv(scaffold=True)
    env.reset(seed=0, options={"task_index": 0})
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, value + '"')))
    assert info["tool_calls"][0] == {"name": "search", "arguments": {"query": query}, "status": "ok"}


def test_search_r1_slot_stops_at_its_closing_tag():
    env = QEnv(tool_format="search_r1", scaffold={"turns": ["call:search", "answer"]})
    _, info = env.reset(seed=0, options={"task_index": 0})
    assert env._slot.prefix == "<search>" and info["stop_strings"] == ["</search>", "\n"]
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, "Karimel</search>")))
    assert info["tool_calls"][0]["arguments"] == {"query": "Karimel"} and info["scaffold_slot"]["close_written"] == ""


def test_schedule_callable_and_free_turns():
    env = QEnv(scaffold={"turns": [None, "answer"]}, max_turns=3)
    _, info = env.reset(seed=0, options={"task_index": 0})
    assert info["stop_strings"] == [] and info["scaffold"] is None and env.scaffold_prefix == ""
    _, _, _, _, info = env.step(
        env.encode_turn('<tool_call>{"name": "search", "arguments": {"query": "k"}}</tool_call>')
    )
    assert info["stop_strings"] == ["<", "\n\n"] and env.scaffold_prefix == "<answer>"
    assert env.scaffold_stop == ["<", "\n\n"]
    _, r, term, _, info = env.step(np.array(ids_of(env.tokenizer, "Dorsil</answer>")))
    assert term and r == 1.0 and info["trajectory"].step_slots == [None, "answer"] and env.scaffold_prefix == ""

    seen = []

    def pick(e):  # answer once a search has run: a callable of the env's state
        seen.append((e.turn, len(e.messages)))
        return answer_slot() if e.tool_calls_used else call_slot(e.format, e.tools["search"])

    env = QEnv(scaffold=pick)
    env.reset(seed=0, options={"task_index": 1})
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, 'Vanquen"')))
    assert info["scaffold"] == "answer" and seen == [(0, 2), (1, 4)]
    # Turns past the list are free.
    env = QEnv(scaffold={"turns": ["call:search"]}, max_turns=3)
    env.reset(seed=0, options={"task_index": 0})
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, 'x"')))
    assert info["scaffold"] is None and info["stop_strings"] == []


def test_drop_probability_is_seeded_and_settable_per_episode():
    def slots(env, seed, **opts):
        _, info = env.reset(seed=seed, options={"task_index": 0, **opts})
        out = [info["scaffold"]]
        for _ in range(2):
            _, _, term, trunc, info = env.step(np.array(ids_of(env.tokenizer, 'k"')))
            if term or trunc:
                break
            out.append(info["scaffold"])
        return out

    env = QEnv(scaffold={"drop_prob": 0.5})
    runs = [slots(env, s) for s in range(40)]
    assert runs == [slots(env, s) for s in range(40)]  # a seeded reset repeats its drops
    dropped = sum(x is None for r in runs for x in r)
    total = sum(len(r) for r in runs)
    assert 0.3 < dropped / total < 0.7, (dropped, total)
    assert all(x is None for s in range(5) for x in slots(env, s, scaffold_drop_prob=1.0))
    assert all(x is not None for s in range(5) for x in slots(env, s, scaffold_drop_prob=0.0))
    assert (
        QEnv(scaffold=True).reset(seed=3)[0]["input_ids"].tolist()
        == QEnv(scaffold=True).reset(seed=3)[0]["input_ids"].tolist()
    )
    with pytest.raises(ValueError, match="needs an env built with a scaffold"):
        QEnv().reset(options={"scaffold_drop_prob": 0.5})
    with pytest.raises(ValueError, match=r"drop_prob must be a number in \[0, 1\]"):
        env.reset(options={"scaffold_drop_prob": 2})


@pytest.mark.parametrize(
    "spec, err, needle",
    [
        ({"turns": ["call:nosuch"]}, ValueError, "no tool 'nosuch'"),
        ({"turns": ["callsearch"]}, ValueError, "is unknown; valid"),
        ({"turns": "answer"}, TypeError, "must be a list"),
        ({"turn": ["answer"]}, ValueError, "unknown scaffold key"),
        ({"drop_prob": -0.1}, ValueError, "drop_prob"),
        ({"turns": [{"prefix": "<a>", "stop": []}]}, ValueError, "missing"),
        ({"turns": [{"prefix": "<a>", "stop": [], "close": "</a>"}]}, ValueError, "non-empty list"),
        ("yes", TypeError, "must be a dict"),
    ],
)
def test_bad_scaffold_specs_fail_at_construction(spec, err, needle):
    with pytest.raises(err, match=needle):
        QEnv(scaffold=spec)


def test_a_call_slot_needs_one_argument_to_fill():
    with pytest.raises(ValueError, match="exactly one string argument"):
        QEnv(tools=[Lookup()], scaffold={"turns": ["call:lookup"]})
    with pytest.raises(ValueError, match="also requires"):
        QEnv(tools=[Lookup()], scaffold={"turns": ["call:lookup.entity"]})
    with pytest.raises(ValueError, match="no argument"):
        QEnv(scaffold={"turns": ["call:search.q"]})
    own = {
        "slots": {
            "look": {
                "prefix": '<tool_call>{"name": "lookup", "arguments": {"relation": "mentor", "entity": "',
                "stop": ['"'],
                "close": '"}}</tool_call>',
                "json_string": True,
            }
        },
        "turns": ["look", "answer"],
    }
    env = QEnv(tools=[Lookup()], scaffold=own)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array(ids_of(env.tokenizer, 'Karimel"')))
    assert info["tool_calls"][0] == {
        "name": "lookup",
        "arguments": {"relation": "mentor", "entity": "Karimel"},
        "status": "ok",
    }


def test_a_callable_must_return_a_slot():
    env = QEnv(scaffold=lambda e: "answer")
    with pytest.raises(TypeError, match="must return a Slot or None"):
        env.reset(seed=0)
    with pytest.raises(RuntimeError, match="last reset"):
        env.step(np.array([1]))


def test_the_closing_text_is_kept_inside_the_context_budget():
    env = QEnv(scaffold=True, max_context_tokens=600)
    _, info = env.reset(seed=0, options={"task_index": 0})
    room = info["max_new_tokens"]
    close = len(ids_of(env.tokenizer, env._slot.close))
    assert room == 600 - len(env._ids) - close
    a = ids_of(env.tokenizer, "word " * (room + 20))[: room + 5]
    obs, r, term, trunc, info = env.step(np.array(a))
    assert trunc and info["truncation_reason"] == "context" and info["action_tokens_dropped"] == 5
    assert len(obs["input_ids"]) <= 600 + 1 and r == 0 and not info["tool_calls"]


def test_slot_reading_rules():
    s = Slot("<a>", ("</a>", "\n"), "</a>")
    assert s.cut("x y</a> z") == ("x y", "</a> z") and s.cut("x\ny") == ("x", "\ny") and s.cut("xy") == ("xy", None)
    assert s.close_to_write("</a> z") == "" and s.close_to_write("</") == "a>" and s.close_to_write("\n") == "</a>"
    assert s.close_to_write(None) == "</a>"
    j = Slot('{"q": "', ('"',), '"}', json_string=True)
    assert json.loads(j.read('say \\"hi')[:-1] + "}") == {"q": 'say "hi'}
    assert json.loads(j.read("bad \\ slash")) == {"q": "bad \\ slash"}
    with pytest.raises(TypeError, match="build it with Scaffold.build"):
        Scaffold(["answer"])


def test_a_chat_client_that_cannot_prefill_is_refused():
    from agent_gym.integrations.openai_policy import ClientConfig, ScaffoldUnsupported, check_scaffold_support

    check_scaffold_support(QEnv(), ClientConfig(base_url="http://x/v1", model="m"))
    check_scaffold_support(QEnv(scaffold=True), ClientConfig(base_url="http://x/v1", model="m", same_tokenizer=True))
    with pytest.raises(ScaffoldUnsupported, match="--openai-same-tokenizer"):
        check_scaffold_support(QEnv(scaffold=True), ClientConfig(base_url="http://x/v1", model="m"))


def test_a_prefilled_request_body():
    from agent_gym.integrations.openai_policy import ChatClient, ClientConfig

    pytest.importorskip("openai")
    c = ChatClient(ClientConfig(base_url="http://127.0.0.1:9/v1", model="m", same_tokenizer=True))
    try:
        req = c._request_body(
            [{"role": "user", "content": "q"}], None, [7], 1, prefill="<answer>", stop=["</answer>", "\n"]
        )
    finally:
        c.close()
    assert req["body"]["messages"][-1] == {"role": "assistant", "content": "<answer>"}
    assert req["body"]["stop"] == ["</answer>", "\n"]
    assert req["extra"]["continue_final_message"] is True and req["extra"]["add_generation_prompt"] is False


@pytest.mark.parametrize("answer, paid", [("Dorsil", 0.2), ("Orlen", 0.2), ("", 0.0), ("  ", 0.0)])
def test_the_format_reward_pays_a_scaffolded_answer_only_when_it_says_something(answer, paid):
    """The answer slot's tags are the env's: ``format`` must still tell an empty answer (the model
    stopping at once) from a real one, or RL finds the empty answer as cheap as any other."""
    env = QEnv(scaffold={"turns": ["answer"]}, rewards={"answer_weights": {"em": 1.0}, "format": 0.2})
    env.reset(seed=0, options={"task_index": 0})
    ids = ids_of(env.tokenizer, answer + "</answer>")
    _, reward, terminated, _, info = env.step(np.array(ids))
    assert terminated and info["answer"].strip() == answer.strip()
    assert info["reward_components"]["format"] == paid
    assert reward == pytest.approx(paid + float(answer == "Dorsil"))
