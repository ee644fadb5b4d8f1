"""A shim so that verl 0.9.1 can build a model next to TRL 1.16.0 (tests/engines/test_verl_engine).

The problem. verl imports TRL's value-head model on its model-building path:

- `verl/models/transformers/monkey_patch.py` (`apply_monkey_patch`, ~line 352-362), run for every
  model the FSDP engine builds, actor included, whenever TRL is installed;
- `verl/utils/model.py` (`patch_valuehead_model` ~613, `load_valuehead_model` ~662), for a critic
  whose checkpoint is not a token-classification model.

Each does `from trl.experimental.ppo import AutoModelForCausalLMWithValueHead`, falling back to
`from trl import ...`. TRL removed its PPO trainer and value head (1.15.0 and 1.16.0 ship no
`trl.experimental.ppo`; 1.0.0 still did), so with trl==1.16.0 and verl==0.9.1 in one environment
verl's engine cannot build *any* model. Downgrading TRL would move the TRL adapter's tested version
(rlgates.trainers.TESTED_VERSIONS), so the project keeps TRL 1.16.0 and applies this shim.

The fix. `patch_environment()` registers a module `trl.experimental.ppo` exposing a stand-in
`AutoModelForCausalLMWithValueHead`, *only* when TRL has no such name. What verl does with the
class on the actor path is set an attribute on it (`state_dict`), which the stand-in accepts. The
stand-in is not a value-head model: its `from_pretrained` raises, so a critic that needs TRL's
value head (verl's fallback in `load_valuehead_model`) fails loudly instead of silently; a critic
saved as a token-classification model (verl's first choice) does not reach it.

Explicit, never implicit: a plain `import rlgates` (or `import rlgates.trainers.verl`) applies
nothing. Call `rlgates.trainers.verl.patch_environment()` in the process that builds verl's
engine, before the engine is built: on Ray, in the module named by
`actor_rollout_ref.model.external_lib`, which verl imports in the worker first (a custom reward
is loaded by another Ray actor). `needed()` says whether TRL lacks the name; the test asserts it
does, so the day a TRL or verl release fixes this, the test says to remove the shim.
"""

from __future__ import annotations

import sys
import types

#: The module name verl looks in first.
MODULE = "trl.experimental.ppo"
NAME = "AutoModelForCausalLMWithValueHead"


class AutoModelForCausalLMWithValueHead:
    """rlgates' stand-in for TRL's removed value-head model (see rlgates.trainers._verl_compat).

    Enough for verl's actor path (`apply_monkey_patch` sets `state_dict` on the class); not a
    model: building one raises.
    """

    rlgates_stand_in = True

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{NAME} was removed from TRL; this is rlgates' stand-in for verl's import only. "
            "Save the critic as a token-classification model (verl's first choice) or install a "
            "TRL that ships trl.experimental.ppo."
        )

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        cls()


def _find():
    """TRL's own class where verl looks for it (trl.experimental.ppo, then trl), or None."""
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead as cls  # type: ignore
        return cls
    except ImportError:
        pass
    try:
        from trl import AutoModelForCausalLMWithValueHead as cls  # type: ignore
        return cls
    except ImportError:
        return None


def needed() -> bool:
    """True when TRL has no value-head model where verl looks (and the stand-in is not in place)."""
    cls = _find()
    return cls is None or bool(getattr(cls, "rlgates_stand_in", False))


def applied() -> bool:
    """True when this module's stand-in is the name verl will import."""
    cls = _find()
    return cls is not None and getattr(cls, "rlgates_stand_in", False)


def patch_environment() -> bool:
    """Provide `trl.experimental.ppo.AutoModelForCausalLMWithValueHead` if TRL lacks it.

    Returns True when the stand-in is in place after the call (now or before), False when TRL
    ships the real class (nothing is done). Idempotent.
    """
    cls = _find()
    if cls is not None:
        return bool(getattr(cls, "rlgates_stand_in", False))
    import trl.experimental as parent  # TRL 1.16.0 has the package, without its ppo submodule

    mod = types.ModuleType(MODULE, "rlgates' stand-in for TRL's removed PPO module.")
    mod.AutoModelForCausalLMWithValueHead = AutoModelForCausalLMWithValueHead
    mod.__all__ = [NAME]
    sys.modules[MODULE] = mod
    parent.ppo = mod
    return True


def unpatch_environment() -> None:
    """Undo `patch_environment` (removes the stand-in only, never a real TRL module)."""
    mod = sys.modules.get(MODULE)
    if mod is not None and getattr(getattr(mod, NAME, None), "rlgates_stand_in", False):
        del sys.modules[MODULE]
        import trl.experimental as parent

        if getattr(parent, "ppo", None) is mod:
            del parent.ppo


__all__ = ["AutoModelForCausalLMWithValueHead", "applied", "needed", "patch_environment",
           "unpatch_environment"]
