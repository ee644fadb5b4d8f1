"""A module that registers an rlgates loss in verl's registry when imported: what a user names in
`actor_rollout_ref.model.external_lib` (tests/engines/verl_runs.py imports it in a Ray worker
through verl's own hook, `HFModelConfig(external_lib=...)`)."""

import rlgates
from rlgates.trainers import verl as rv

LOSS_MODE = rv.register(rlgates.get("ppo", eps=0.2))
