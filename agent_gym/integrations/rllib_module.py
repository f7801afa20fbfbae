"""The torch side of the RLlib integration: the policy/value RLModule and the episode-metrics
callback. Imports ray and torch at module level (their base classes are needed to define the
classes), so only :func:`agent_gym.integrations.rllib.build_ppo_config` imports it.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn


class TokenTransformerModule(TorchRLModule, ValueFunctionAPI):
    """Policy and value over a padded context of token ids (``TokenStepEnv``'s observation).

    The last ``window`` ids of the context (fewer at the start of an episode; the rest masked)
    get a token embedding plus a learned position-in-window embedding, go through one
    pre-norm transformer encoder layer, and the output at the last real position feeds a linear
    policy head (logits over the action ids, RLlib's default categorical distribution) and a
    linear value head. ``model_config``: ``embed_dim`` (32), ``num_heads`` (2), ``window`` (128).

    Stateless: each step re-reads its window, so RLlib carries no recurrent state. A GRU over the
    whole context was the first choice and was dropped: on this 2-core CPU its packed-sequence
    backward took seconds per 128-step minibatch, where this layer takes tens of milliseconds
    (docs/integrations.md, "RLlib").
    """

    def setup(self):
        obs = self.observation_space
        vocab = int(obs["input_ids"].high.max()) + 1
        d = int(self.model_config.get("embed_dim", 32))
        heads = int(self.model_config.get("num_heads", 2))
        self.window = int(self.model_config.get("window", 128))
        if self.window < 1 or d % heads:
            raise ValueError(
                f"model_config: window must be positive and embed_dim ({d}) a multiple of num_heads ({heads})"
            )
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(self.window, d)
        self.layer = nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(d)
        self.pi = nn.Linear(d, int(self.action_space.n))
        self.vf = nn.Linear(d, 1)
        # Small initial logits: the untrained policy starts near uniform over the action ids.
        nn.init.normal_(self.pi.weight, std=0.01)
        nn.init.zeros_(self.pi.bias)

    def _encode(self, batch: dict[str, Any]) -> torch.Tensor:
        obs = batch[Columns.OBS]
        ids = obs["input_ids"].long()
        lengths = obs["length"].reshape(-1, 1).long().clamp(min=1)
        w = min(self.window, ids.shape[1])
        # Row b's window: positions length_b - w .. length_b - 1; those before 0 are masked.
        idx = lengths - w + torch.arange(w, device=ids.device)
        pad = idx < 0
        x = self.embed(ids.gather(1, idx.clamp(min=0))) + self.pos.weight[-w:]
        h = self.layer(x, src_key_padding_mask=pad)
        return self.norm(h[:, -1])

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.pi(self._encode(batch))}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        emb = self._encode(batch)
        return {Columns.ACTION_DIST_INPUTS: self.pi(emb), Columns.EMBEDDINGS: emb}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            embeddings = self._encode(batch)
        return self.vf(embeddings).squeeze(-1)


class EpisodeStatsCallback(RLlibCallback):
    """Logs the ToolEnv's verdict on each finished episode into RLlib's results, under
    ``env_runners/agent_gym/``: ``success`` (``Episode.success``), ``answered``, ``turns`` and
    ``env_reward`` (the ToolEnv episode's return, equal to RLlib's ``episode_return``), each a mean
    over the last 100 episodes of each runner."""

    def on_episode_end(self, *, episode, metrics_logger=None, **kwargs) -> None:
        if metrics_logger is None:
            return
        info = episode.get_infos(-1)
        traj = info.get("trajectory") if isinstance(info, dict) else None
        if traj is None:  # not a ToolEnv episode end (cannot happen with TokenStepEnv)
            return
        for name, value in (
            ("success", float(traj.success)),
            ("answered", float(traj.answered)),
            ("turns", float(traj.turns)),
            ("env_reward", float(traj.reward)),
        ):
            metrics_logger.log_value(("agent_gym", name), value, reduce="mean", window=100)
