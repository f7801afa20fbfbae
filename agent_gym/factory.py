"""One way to build envs: :class:`EnvFactory` (an env id, its kwargs, a tokenizer).

The trainer, its Ray rollout workers, SFT, evaluation and the TRL/RLlib adapters all turn the same
three things into envs: a registered id, the env kwargs of a config, and the tokenizer (with the
policy's vocabulary size, since a model's embedding table is often padded past the tokenizer).
They build one factory and ask it::

    factory = EnvFactory("AgentR1/FactChain-v0", {"num_hops": 2}, tokenizer, vocab_size=2112)
    env = factory.make()                        # gym.make(id, tokenizer=..., vocab_size=..., num_hops=2)
    vec = factory.make_vector(8, split="test")  # gym.make_vec through the id's vector entry point
    factory.pad_id                              # the tokenizer's pad id, else its eos id (tokenizer.pad_token_id)

``server="http://host:port"`` makes the factory's envs remote: sessions on a
``python -m agent_gym.serve`` process (OpenEnv), with the same interface as the in-process ones
(:class:`agent_gym.env_client.RemoteVectorEnv` for ``make_vector``,
:class:`agent_gym.env_client.RemoteToolEnv` for ``make``). The server builds its envs from its own arguments, so the first remote env checks that
they are this factory's: the same id, env kwargs, vocabulary size and tokenizer (a fingerprint of
its vocabulary, special tokens and chat template), and says which one differs. ``local()`` is the
same factory without the server (the trainer evaluates in-process: its eval envs take overrides a
served env cannot).

A factory is picklable (the tokenizer included) so it can be sent to a Ray worker. Torch-free.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from agent_gym.tokenizer import load_tokenizer, pad_token_id, tokenizer_fingerprint
from agent_gym.vector import ToolVectorEnv

_BOUND = ("tokenizer", "vocab_size")
"""Env kwargs a factory sets itself (from its tokenizer and vocab size), unless env_kwargs names them."""


def jsonable(x: Any) -> Any:
    """``x`` as JSON carries it: numpy values as Python ones, tuples and sets as lists, mapping keys as
    strings; any other value that is not JSON-native becomes its ``repr``. How the OpenEnv server
    sends infos and kwargs (``agent_gym.env_server``), and how a factory compares its kwargs with a server's."""
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return repr(x)


class EnvFactory:
    """Envs of one registered id with one set of kwargs and one tokenizer (see the module docstring).

    Args:
        env_id: a registered id (``AgentR1/...``, or a plugin's).
        env_kwargs: the config's env kwargs; they override ``tokenizer``/``vocab_size`` if they name them.
        tokenizer: a tokenizer object, a path or hub name, or ``None`` (the env's default, the built-in one).
        vocab_size: the policy's vocabulary size (its embedding rows); ``None`` leaves the env's default.
        num_threads: threads that step a vector env's sub-envs (``ToolVectorEnv``; 0: one per env).
        server: ``http://host:port`` of a ``python -m agent_gym.serve`` process: envs are sessions there.
        server_timeout_s: how long a remote env waits for one message from the server.
        server_reconnect_s: how long a remote vector env waits for a server that went away to come
            back before it fails (``RemoteVectorEnv``'s ``reconnect_s``; 0: fail at once).
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: Mapping[str, Any] | None = None,
        tokenizer: Any = None,
        *,
        vocab_size: int | None = None,
        num_threads: int = 0,
        server: str | None = None,
        server_timeout_s: float = 120.0,
        server_reconnect_s: float = 0.0,
    ):
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a registered env id string (e.g. 'AgentR1/FactChain-v0'), got {env_id!r}")
        if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
            raise ValueError(f"env_kwargs must be a mapping of env arguments, got {type(env_kwargs).__name__}")
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1
        ):
            raise ValueError(f"vocab_size must be a positive integer (the policy's embedding rows), got {vocab_size!r}")
        if server is not None and (not isinstance(server, str) or not server.startswith(("http://", "https://"))):
            raise ValueError(
                f"server must be an http(s):// URL of a `python -m agent_gym.serve` process, got {server!r}"
            )
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.num_threads = int(num_threads or 0)
        self.server = server.rstrip("/") if server else None
        self.server_timeout_s = float(server_timeout_s)
        self.server_reconnect_s = float(server_reconnect_s)
        self._server_checked = False

    def __repr__(self) -> str:
        where = f", server={self.server!r}" if self.server else ""
        return f"EnvFactory({self.env_id!r}, {self.env_kwargs!r}, vocab_size={self.vocab_size}{where})"

    # -- what every env gets -------------------------------------------------------------------

    def kwargs(self, **overrides: Any) -> dict[str, Any]:
        """The kwargs an in-process env is made with: tokenizer and vocab size, then the env kwargs, then ``overrides``."""
        base: dict[str, Any] = {}
        if self.tokenizer is not None:
            base["tokenizer"] = self.tokenizer
        if self.vocab_size is not None:
            base["vocab_size"] = self.vocab_size
        return {**base, **self.env_kwargs, **overrides}

    @property
    def pad_id(self) -> int:
        """:func:`agent_gym.tokenizer.pad_token_id` of the factory's tokenizer (the built-in one when it has none)."""
        return pad_token_id(load_tokenizer(self.tokenizer))

    def replace(self, **changes: Any) -> EnvFactory:
        """A copy with some constructor arguments changed (``vocab_size=`` once a model is known)."""
        args = dict(
            env_id=self.env_id,
            env_kwargs=self.env_kwargs,
            tokenizer=self.tokenizer,
            vocab_size=self.vocab_size,
            num_threads=self.num_threads,
            server=self.server,
            server_timeout_s=self.server_timeout_s,
            server_reconnect_s=self.server_reconnect_s,
        )
        unknown = sorted(set(changes) - set(args))
        if unknown:
            raise TypeError(f"EnvFactory.replace: unknown argument(s) {unknown}; valid: {sorted(args)}")
        args.update(changes)
        return EnvFactory(args.pop("env_id"), **args)

    def local(self) -> EnvFactory:
        """This factory without its server: envs built in this process."""
        return self.replace(server=None)

    # -- envs ----------------------------------------------------------------------------------

    def make(self, **overrides: Any) -> Any:
        """One env: ``gym.make(env_id, **kwargs(**overrides))`` (Gymnasium's wrappers on it: use
        ``.unwrapped`` for the ``ToolEnv``), or a :class:`~agent_gym.env_client.RemoteToolEnv` session."""
        if self.server:
            self._remote_only(overrides)
            from agent_gym.env_client import RemoteToolEnv  # optional: openenv-core (extra openenv)

            return RemoteToolEnv(self.server, message_timeout_s=self.server_timeout_s)
        return gym.make(self.env_id, **self.kwargs(**overrides))

    def make_vector(self, num_envs: int, **overrides: Any) -> Any:
        """``num_envs`` envs stepped together: the id's registered vector entry point
        (``gym.make_vec(..., vectorization_mode="vector_entry_point")``, a ``ToolVectorEnv`` with
        infos as one dict per env and no autoreset, as the trainer's rollout wants), or, with a
        server, a :class:`~agent_gym.env_client.RemoteVectorEnv` of ``num_envs`` sessions."""
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if self.server:
            self._remote_only(overrides)
            from agent_gym.env_client import RemoteVectorEnv  # optional: openenv-core (extra openenv)

            return RemoteVectorEnv(
                self.server, num_envs, message_timeout_s=self.server_timeout_s, reconnect_s=self.server_reconnect_s
            )
        spec = gym.spec(self.env_id)
        kwargs = self.kwargs(**overrides)
        if spec.vector_entry_point is None:  # registered with gym.register directly, not agent_gym.register_env
            return ToolVectorEnv.from_entry_point(
                spec.entry_point,
                num_envs=num_envs,
                num_threads=self.num_threads,
                info_format="list",
                **{**(spec.kwargs or {}), **kwargs},
            )
        return gym.make_vec(
            self.env_id,
            num_envs=num_envs,
            vectorization_mode="vector_entry_point",
            num_threads=self.num_threads,
            info_format="list",
            **kwargs,
        )

    @staticmethod
    def num_tasks(vec: Any) -> int:
        """The task count of the env behind a vector env this factory made (or a team of
        multi-agent envs, which keep their envs in ``.envs`` too)."""
        if hasattr(vec, "num_tasks"):  # RemoteVectorEnv: the server says
            return int(vec.num_tasks())
        first = vec.envs[0]
        return int(getattr(first, "unwrapped", first).num_tasks())

    # -- the server ----------------------------------------------------------------------------

    def _remote_only(self, overrides: Mapping[str, Any]) -> None:
        if overrides:
            raise ValueError(
                f"env kwargs overrides {sorted(overrides)} cannot reach a served env: the server at "
                f"{self.server} builds its envs from its own arguments. Build these envs in-process "
                "(factory.local().make_vector(...)) or serve them from a second server."
            )
        if not self._server_checked:
            self.check_server()

    def server_info(self) -> dict[str, Any]:
        """``GET /agent_gym/env`` of the server: its env id, kwargs, vocabulary size, task count and
        tokenizer fingerprint. ``ConnectionError`` naming the URL when nothing answers there."""
        url = f"{self.server}/agent_gym/env"
        try:
            with urllib.request.urlopen(url, timeout=min(self.server_timeout_s, 30.0)) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise ConnectionError(
                f"env server {self.server}: GET /agent_gym/env answered HTTP {e.code}; is it an "
                "agent_gym server (python -m agent_gym.serve) of this version?"
            ) from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise ConnectionError(
                f"env server {self.server} is unreachable ({type(reason).__name__}: {reason}). Start it with "
                f"`python -m agent_gym.serve {self.env_id} --host HOST --port PORT --env-kwargs '{{...}}'` "
                "(the same env kwargs and vocab_size as this run), or unset env_server to build the envs in-process."
            ) from e

    def check_server(self) -> dict[str, Any]:
        """Check that the server's envs are the ones this factory would build; returns its info.
        Raises ``ConnectionError`` (unreachable) or ``ValueError`` naming every difference."""
        info = self.server_info()
        diffs: list[str] = []
        if info.get("env_id") != self.env_id:
            diffs.append(f"env id: server {info.get('env_id')!r}, here {self.env_id!r}")
        mine = jsonable({k: v for k, v in self.env_kwargs.items() if k not in _BOUND})
        theirs = {k: v for k, v in (info.get("env_kwargs") or {}).items() if k not in _BOUND}
        if mine != theirs:
            diffs.append(f"env kwargs (besides tokenizer and vocab_size): server {theirs}, here {mine}")
        tok = load_tokenizer(self.env_kwargs.get("tokenizer", self.tokenizer))
        vocab = self.env_kwargs.get("vocab_size", self.vocab_size)
        if vocab is None:  # the env's own default (ToolEnv): the tokenizer's size
            vocab = max(len(tok), getattr(tok, "vocab_size", 0))
        if info.get("vocab_size") != vocab:
            diffs.append(
                f"vocab_size: server {info.get('vocab_size')}, here {vocab} (pass the policy's as "
                "--env-kwargs '{vocab_size: N}' to the server)"
            )
        if info.get("tokenizer") != tokenizer_fingerprint(tok):
            diffs.append(
                "tokenizer: the server's env encodes with a different tokenizer (a different vocabulary, "
                "special tokens or chat template); give the server the model's tokenizer in --env-kwargs"
            )
        if diffs:
            raise ValueError(
                f"env server {self.server} serves other envs than this run would build: "
                + "; ".join(diffs)
                + ". Restart the server with this run's env_id and env kwargs "
                "(python -m agent_gym.serve --config THIS_CONFIG.yaml does)."
            )
        self._server_checked = True
        return info


__all__ = ["EnvFactory", "jsonable"]
