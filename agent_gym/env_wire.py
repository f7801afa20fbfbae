"""The wire types of the env server (``python -m agent_gym.serve``): openenv-core's pydantic
models, which ``GET /schema`` lists. :mod:`agent_gym.env_server` speaks them, :mod:`agent_gym.env_client`
reads them.

- :class:`AgentGymAction`: exactly one of ``token_ids`` (the ids one assistant turn generated, stop
  token included: the env's token-in/token-out contract, appended verbatim) or ``text`` (the reply
  text, under :class:`agent_gym.wrappers.TextView`'s rules: encoded as one whole turn and closed with
  the end-of-turn token; ``info["retokenized"]`` and ``info["retokenize_lossy"]`` say so).
- :class:`AgentGymObservation`: ``token_ids`` holds the ids appended since this session's previous
  observation (the **delta**; after a reset, the whole prompt), ``num_tokens`` the length of the whole
  context, so a client rebuilds the full ``input_ids`` by appending the deltas and checks it against
  ``num_tokens`` (:class:`agent_gym.env_client.RemoteToolEnv` does). ``text`` is TextView's observation
  (the whole context decoded), filled only in a session reset with ``view="text"``. ``reward``,
  ``done`` (terminated or truncated), ``terminated``, ``truncated``, ``info`` (the env's step or reset
  info, JSON-safe, without the trajectory) and, on the step that ends the episode, ``episode``: the
  env's :class:`agent_gym.episode.Episode` itself, which pydantic serializes and rebuilds as that dataclass.
- :class:`AgentGymState`: env id, task, turn, context length, whether the episode is over.

An action that is not an :class:`AgentGymAction` (both kinds, neither, a field of the wrong type, an
unknown field) is openenv-core's ``VALIDATION_ERROR``.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server import Action, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from agent_gym.episode import Episode


class AgentGymAction(Action):
    """One assistant turn: exactly one of ``token_ids`` or ``text``."""

    token_ids: list[int] | None = Field(
        default=None, description="the ids of one assistant turn, stop token included (appended verbatim)"
    )
    text: str | None = Field(
        default=None, description="the reply text; encoded as one turn and closed with the end-of-turn token (TextView)"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> AgentGymAction:
        if (self.token_ids is None) == (self.text is None):
            # Not a ValueError: openenv-core 0.3.0 sends pydantic's ``errors()`` as JSON, and a
            # ValueError there (in ``ctx``) cannot be serialized, so the server would drop the session.
            raise PydanticCustomError(
                "action_kind",
                "an action has exactly one of 'token_ids' (a list of int ids) or 'text' (a string); got {got}",
                {"got": "both" if self.token_ids is not None else "neither"},
            )
        return self


class AgentGymObservation(Observation):
    """What the env returns after a reset or a step (see the module docstring for ``token_ids``)."""

    token_ids: list[int] = Field(
        description="ids appended since the session's previous observation (after a reset: the whole prompt)"
    )
    num_tokens: int = Field(description="length of the whole context (the full input_ids)")
    text: str | None = Field(default=None, description="the whole context decoded (view='text' sessions only)")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info, JSON-safe, without 'trajectory'")
    episode: Episode | None = Field(default=None, description="the finished episode, on its last step only")


class AgentGymState(State):
    env_id: str
    task_id: str | None = None
    task_index: int | None = None
    turn: int = 0
    num_tokens: int = 0
    done: bool = True


__all__ = ["AgentGymAction", "AgentGymObservation", "AgentGymState"]
