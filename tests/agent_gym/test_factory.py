"""``agent_gym.factory``: one way to build envs from (id, kwargs, tokenizer), and the one pad-id rule.
Torch-free, like the module (the served side is tests/integrations/test_env_server_trainer.py)."""

from __future__ import annotations

import pickle
import socket
import types

import gymnasium as gym
import numpy as np
import pytest

import agent_gym  # noqa: F401  (registers the ids)
from agent_gym.factory import EnvFactory, jsonable
from agent_gym.tokenizer import build_bpe_tokenizer, load_tokenizer, pad_token_id, tokenizer_fingerprint
from agent_gym.vector import ToolVectorEnv

ENV_ID = "AgentR1/FactChain-v0"


def _tok(pad, eos):
    return types.SimpleNamespace(pad_token_id=pad, eos_token_id=eos)


def test_pad_id_is_pad_else_eos_else_the_default_else_a_clear_error():
    assert pad_token_id(_tok(5, 7)) == 5
    assert pad_token_id(_tok(0, 7)) == 0  # 0 is an id, not "missing"
    assert pad_token_id(_tok(None, 7)) == 7
    assert pad_token_id(_tok(None, None), default=0) == 0
    with pytest.raises(ValueError, match="neither pad_token_id nor eos_token_id.*set tokenizer.pad_token"):
        pad_token_id(_tok(None, None))
    tok = load_tokenizer(None)
    assert EnvFactory(ENV_ID, tokenizer=tok).pad_id == tok.pad_token_id == pad_token_id(tok)
    assert EnvFactory(ENV_ID).pad_id == tok.pad_token_id  # no tokenizer: the env's default, the built-in one


def _first_obs(vec, seeds):
    obs, infos = vec.reset(seed=seeds, options={"task_indices": [3, 11, 3]})
    return [ids.tolist() for ids in obs["input_ids"]], infos


def test_make_vector_goes_through_the_registered_vector_entry_point():
    tok = load_tokenizer(None)
    f = EnvFactory(ENV_ID, {"max_turns": 3, "num_hops": 2}, tok, vocab_size=2112, num_threads=2)
    vec = f.make_vector(3, split="test")
    assert isinstance(vec, ToolVectorEnv) and vec.num_envs == 3
    assert vec.spec.kwargs["vectorization_mode"] == "vector_entry_point"  # gym.make_vec made it
    assert vec.info_format == "list" and not vec.autoreset
    sub = vec.envs[0]
    assert (sub.tokenizer, sub.vocab_size, sub.max_turns, sub.num_hops, sub.split) == (tok, 2112, 3, 2, "test")
    assert EnvFactory.num_tasks(vec) == sub.num_tasks()
    # the same envs as gym.make with the same kwargs, one by one
    got, infos = _first_obs(vec, [1, 2, 3])
    assert isinstance(infos, list) and len(infos) == 3
    for i, seed in enumerate([1, 2, 3]):
        env = gym.make(ENV_ID, tokenizer=tok, vocab_size=2112, max_turns=3, num_hops=2, split="test")
        obs, _ = env.reset(seed=seed, options={"task_index": [3, 11, 3][i]})
        assert obs["input_ids"].tolist() == got[i]
    vec.close()


def test_env_kwargs_override_the_bound_tokenizer_and_vocab_and_overrides_win_last():
    tok = load_tokenizer(None)
    f = EnvFactory(ENV_ID, {"vocab_size": 4096, "max_turns": 3}, tok, vocab_size=2112)
    assert f.kwargs() == {"tokenizer": tok, "vocab_size": 4096, "max_turns": 3}
    assert f.kwargs(max_turns=5)["max_turns"] == 5
    assert f.make().unwrapped.vocab_size == 4096
    assert EnvFactory(ENV_ID).kwargs() == {}  # nothing bound: the env's own defaults


def test_an_id_registered_without_a_vector_entry_point_still_vectorises():
    spec = gym.spec(ENV_ID)
    plain = "test_factory/PlainFactChain-v0"
    if plain not in gym.registry:
        gym.register(plain, entry_point=spec.entry_point, kwargs={"max_turns": 2})  # Gymnasium's own register
    try:
        vec = EnvFactory(plain, {"num_hops": 2}).make_vector(2)
        assert isinstance(vec, ToolVectorEnv) and vec.info_format == "list"
        assert vec.envs[0].max_turns == 2 and vec.envs[0].num_hops == 2  # the spec's defaults, then the kwargs
        vec.close()
    finally:
        gym.registry.pop(plain, None)


def test_a_factory_pickles_with_its_tokenizer_and_builds_the_same_envs():
    tok = load_tokenizer(None)
    f = EnvFactory(ENV_ID, {"max_turns": 3}, tok, vocab_size=2112, num_threads=1)
    g = pickle.loads(pickle.dumps(f))
    assert repr(g) == repr(f) and g.pad_id == f.pad_id
    assert tokenizer_fingerprint(g.tokenizer) == tokenizer_fingerprint(tok)
    a, b = f.make_vector(3), g.make_vector(3)
    assert _first_obs(a, [4, 5, 6])[0] == _first_obs(b, [4, 5, 6])[0]
    a.close(), b.close()


def test_the_tokenizer_fingerprint_tells_tokenizers_apart():
    tok = load_tokenizer(None)
    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(None) == tokenizer_fingerprint(load_tokenizer(None))
    assert tokenizer_fingerprint(build_bpe_tokenizer(vocab_size=1024)) != tokenizer_fingerprint(tok)
    other_template = build_bpe_tokenizer()
    other_template.chat_template = "{{ messages }}"
    assert tokenizer_fingerprint(other_template) != tokenizer_fingerprint(build_bpe_tokenizer())


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(env_id=""), "env_id must be a registered env id string"),
        (dict(env_id=ENV_ID, env_kwargs=[("max_turns", 3)]), "env_kwargs must be a mapping"),
        (dict(env_id=ENV_ID, vocab_size=0), "vocab_size must be a positive integer"),
        (dict(env_id=ENV_ID, vocab_size=True), "vocab_size must be a positive integer"),
        (dict(env_id=ENV_ID, server="127.0.0.1:8000"), r"server must be an http\(s\):// URL"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, match):
    env_id = args.pop("env_id")
    with pytest.raises(ValueError, match=match):
        EnvFactory(env_id, **args)


def test_bad_vector_sizes_are_refused():
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_envs must be a positive integer"):
            EnvFactory(ENV_ID).make_vector(n)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(30)
def test_a_served_factory_refuses_overrides_and_names_an_unreachable_server():
    url = f"http://127.0.0.1:{_closed_port()}"
    f = EnvFactory(ENV_ID, {"max_turns": 3}, server=url + "/")
    assert f.server == url and f.local().server is None
    with pytest.raises(ValueError, match=r"overrides \['split'\] cannot reach a served env.*factory.local\(\)"):
        f.make_vector(2, split="test")
    with pytest.raises(ConnectionError, match=rf"env server {url} is unreachable .*python -m agent_gym.serve {ENV_ID}"):
        f.make_vector(2)
    with pytest.raises(ConnectionError, match="unreachable"):
        f.make()
    vec = f.local().make_vector(2, split="test")  # the same factory, in-process
    assert vec.envs[0].max_turns == 3 and vec.envs[0].split == "test"
    vec.close()


def test_jsonable_is_what_json_carries():
    assert jsonable(
        {1: (np.int64(2), np.float32(0.5)), "a": {np.arange(2).dtype.name: np.arange(2)}, "s": {3}, "o": object}
    ) == {"1": [2, 0.5], "a": {"int64": [0, 1]}, "s": [3], "o": repr(object)}


def test_the_trainers_reconnect_key_reaches_the_remote_vector_env_and_a_negative_one_is_refused():
    """``rollout.env_server_reconnect_s`` -> ``EnvFactory(server_reconnect_s=)`` -> ``RemoteVectorEnv(reconnect_s=)``
    (checked on the constructor's arguments: the vector env itself needs a live server, which
    tests/integrations/test_serve_faults.py runs)."""
    from trainers.config import ConfigError, from_dict
    from trainers.trainer import env_factory

    base = {"rollout": {"env_id": "AgentR1/FactChain-v0", "env_server": "http://127.0.0.1:9"}}
    cfg = from_dict({**base, "rollout": {**base["rollout"], "env_server_reconnect_s": 7.5}}, "test")
    factory = env_factory(cfg, None, 1000)
    assert (factory.server, factory.server_reconnect_s) == ("http://127.0.0.1:9", 7.5)
    assert factory.replace(vocab_size=2000).server_reconnect_s == 7.5
    assert factory.local().server is None
    assert env_factory(from_dict(base, "test"), None, 1000).server_reconnect_s == 0.0
    with pytest.raises(ConfigError, match=r"rollout.env_server_reconnect_s must be >= 0"):
        from_dict({**base, "rollout": {**base["rollout"], "env_server_reconnect_s": -1}}, "test")
