"""Integrations that need the trainer (torch, the rollout loop, the backends): TRL's
``GRPOTrainer`` rollout (:mod:`trainers.integrations.trl`) and the OpenAI-compatible policy's
evaluation command (:mod:`trainers.integrations.openai_eval`). The torch-free halves stay in
``agent_gym.integrations`` (docs/design.md, "Layers")."""
