"""Adapters that plug the envs into other RL libraries (docs/integrations.md)."""
