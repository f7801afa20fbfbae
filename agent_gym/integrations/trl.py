"""Moved: TRL's rollout is ``trainers.integrations.trl`` (``EnvRollout``, ``env_reward``).

It runs the trainer's rollout loop and backends, and ``agent_gym`` imports neither ``trainers``
nor torch (docs/design.md, "Layers"), so importing this old path is an error that names the new one.
"""

raise ImportError(
    "agent_gym.integrations.trl moved to trainers.integrations.trl (it needs the trainer and torch, "
    "which agent_gym does not import): use `from trainers.integrations.trl import EnvRollout, env_reward`"
)
