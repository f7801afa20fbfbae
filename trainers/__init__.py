"""trainers: PPO/GRPO/RLOO/REINFORCE++ over ``agent_gym`` vector envs with masked token-level losses.

Everything that needs torch lives here; ``agent_gym`` never imports it.
"""

import os

# OpenMP threads that spin while they wait (libgomp's default) collapse a step on a machine whose
# cores are busy: on the 2-core machine at load 9-11, one tiny-model step (sampling + update) took
# 14.6x longer with 2 torch threads than with 1, and 1.38x with OMP_WAIT_POLICY=PASSIVE
# (benchmarks/perf/threads_under_load.py; docs/results.md, "Threads on a busy machine"). libgomp reads
# the policy once, when torch loads, so it is set here, before any trainer module imports torch;
# a value the user set wins, and it does nothing if torch was imported first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
