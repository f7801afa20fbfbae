"""Concrete environments, one module each. Each module's docstring is its card, and each module
registers its own ids (``agent_gym.registration.register_env``) when imported; importing this
package (which ``import agent_gym`` does) imports them all."""

from envs import factchain, hotpotqa, musique, naiverag, twowiki  # noqa: F401  (each registers its ids)
