"""Any rlgates method as the policy loss of TRL's `GRPOTrainer` (tested with TRL 1.16.0).

    from rlgates.trainers.trl import RlgatesGRPOTrainer
    trainer = RlgatesGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(
        loss_type="grpo", num_iterations=2, ...), train_dataset=..., method=rlgates.get("sapo"))
    trainer.train()        # logs TRL's clip_ratio/* and entropy, and rlgates/gate_*

TRL stays the engine: it samples, scores, computes the advantages and the old log-probs, splits
the batch and steps the optimiser. The subclass overrides `_compute_loss`, the hook TRL's own
`compute_loss` calls (and `rlgates.inspect.capture` wraps, so a drop-in run is captured as a
stock one is): it asks TRL for the current log-probs (the trainer's own helper), takes the old
ones and the advantages TRL stored in `inputs`, and returns the rlgates method's loss under the
normaliser TRL's `loss_type` prescribes (see `trl_loss`).

The gate comes from `method`, and GRPOConfig's gate settings must agree with it. For a method with
a TRL built-in (`rlgates.trainers.flags(method)["trl"]`), the settings that built-in's loss type
reads (`GATE_SETTINGS`: `epsilon`, `epsilon_high` and `delta` for the clip, cispo's
`epsilon_high` cap, which falls back to `epsilon` when unset, sapo's temperatures, vespo's k and
λ) are compared with the flags (a setting the flags leave out, with GRPOConfig's default). A
difference is a ValueError naming each setting, both values and the fix, before anything loads;
with `allow_config_mismatch=True` it is a warning, and the method's values are trained. A method
without one (sao, reinforce, `rlgates.byo`) has no TRL spelling to compare, and is not checked:
TRL's gate settings are then simply not read. Neither are those of another loss type than the
method's (sapo's temperatures under a dapo method).

Features of TRL's own loss that the adapter does not carry raise ValueError at construction: a KL
term (`beta`), the entropy bonus and mask, the off-policy mask, vLLM importance correction, the
MoE aux loss and `loss_type` values outside `TRL_AGG` (all listed in `REFUSED`). Those read from
GRPOConfig alone are checked before `GRPOTrainer.__init__` loads a model (a reference model
when beta ≠ 0), the MoE one after it; image inputs raise in the loss. When TRL keeps no old
log-probs (gradient_accumulation_steps a multiple of steps_per_generation × num_iterations, as
at its defaults, and no vLLM correction) ρ ≡ 1 and no gate ever acts: the trainer warns once
when it is built. Use num_iterations ≥ 2 with steps_per_generation = gradient_accumulation_steps,
or steps_per_generation > gradient_accumulation_steps.

Metrics. TRL's `_compute_loss` logs, per loss_type, its own clip metrics (`TRL_METRICS`: the
clip_ratio/* family for grpo, bnpo, dr_grpo and dapo; cispo_clip_ratio for cispo; nothing for
sapo) and, for every loss_type, `entropy`. A method with a TRL built-in
(`rlgates.trainers.flags(m)["trl"]`) logs under those names exactly what that built-in logs on
the same micro-batch, at the method's own ε (and δ), reduced over processes as TRL reduces
them. A method without one (sao, reinforce, your own) logs no clip metric under TRL's names.
`entropy` (the current policy's mean entropy over the completion tokens) does not depend on the
loss, so every method logs it. Every method also logs rlgates' own `rlgates/gate_mean` and
`rlgates/gate_zero` (`rlgates.trainers.gate_stats`: over the A ≠ 0 tokens; across processes
weighted by each one's A ≠ 0 tokens, as TRL weighs its clip fractions by tokens).

Per-token advantages. TRL's GRPOTrainer scores one advantage per completion
(`_generate_and_score_completions`: shape [B]); its `_compute_loss` also takes [B, T], for
subclasses that provide them. The adapter takes either, wherever TRL hands them on
(`inputs["advantages"]`, buffered and split by rows only), so a subclass that rewrites them
after scoring (GAE from a critic, process rewards) reaches it unchanged. With per-token A the
adapter equals TRL's own loss for every token-level method. It does not for the sequence-level
ratio methods (gspo, luspo; `importance_sampling_level="sequence"`): TRL differentiates ρ_s
through the mean log-ratio, so every token's gradient carries its row's mean gated A, while the
rlgates method uses GSPO-token's form, token t carrying its own A_t, as verl's gspo does. With
one A per row the two agree. tests/engines/test_trl_engine.py measures both.
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import torch
from trl import GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from .. import _numerics as nx
from .._side import SideInfo
from ..methods.vespo import LOG_W_MAX, LOG_W_MIN
from . import TRL_CLIP_LOSS_TYPES, _detached_inputs, conformance_trl, flags, gate_stats, loss

#: TRL loss_type -> the rlgates aggregation it uses (its normaliser: see `trl_loss`), for every
#: TRL 1.16 loss type; written once, beside TRL's conformance rows (conformance_trl).
TRL_AGG = conformance_trl.TRL_AGG


def _level_mismatch(t):
    level = getattr(t.method, "level", "token")
    # a sequence-product method (vespo) reads token ratios and multiplies them itself
    trl_level = "sequence" if level == "sequence" else "token"
    return t.args.importance_sampling_level != trl_level and (
        f"{t.args.importance_sampling_level!r} while {t.method.name} works at the {level} level")


def _moe_aux_loss(c):  # TRL reads the model's config for it in __init__: after it
    return c.trainer is not None and c.trainer.aux_loss_enabled


#: What RlgatesGRPOTrainer refuses at construction: (the TRL setting, the feature of TRL's own
#: loss it turns on, a test: true, or a string that details it, when it is on). A test reads
#: `c.args` (the GRPOConfig) and `c.method`, and holds before `GRPOTrainer.__init__` loads a
#: model; one that needs the model reads `c.trainer` (None until then) and is checked after it.
#: `_check_supported` raises ValueError for every entry that holds; the book's chapter 14 renders
#: this tuple as its table. Image inputs (pixel_values) are refused later, in the loss.
REFUSED = (
    ("beta != 0", "a KL term to the reference model", lambda c: c.args.beta != 0.0),
    ("top_entropy_quantile < 1", "the entropy mask (only the highest-entropy tokens learn)",
     lambda c: c.args.top_entropy_quantile < 1.0),
    ("off_policy_mask_threshold", "the off-policy sequence mask",
     lambda c: c.args.off_policy_mask_threshold is not None),
    ("vllm_importance_sampling_correction", "vLLM's sampler-trainer correction (use_vllm)",
     lambda c: c.args.use_vllm and c.args.vllm_importance_sampling_correction),
    ("entropy_coef != 0 or use_adaptive_entropy", "an entropy bonus",  # _entropy_bonus_enabled
     lambda c: c.args.entropy_coef != 0.0 or c.args.use_adaptive_entropy),
    ("router_aux_loss_coef != 0 (MoE model)", "the MoE router's aux loss", _moe_aux_loss),
    ("loss_type outside TRL_AGG", "a normaliser with no rlgates mapping",
     lambda c: c.args.loss_type not in TRL_AGG
     and f"{c.args.loss_type!r}; mapped: {sorted(TRL_AGG)}"),
    ("importance_sampling_level != the method's level", "a ratio at another level",
     _level_mismatch),
)

#: The GRPOConfig settings TRL 1.16's `_compute_loss` reads for the gate of each loss type ("#
#: Compute the loss"): the clip's epsilon, epsilon_high and delta; cispo's cap, epsilon_high
#: alone; sapo's temperatures; vespo's k and λ. Unset, epsilon_high is epsilon (TRL's __init__:
#: `self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon`).
GATE_SETTINGS = {
    **dict.fromkeys(TRL_CLIP_LOSS_TYPES, ("epsilon", "epsilon_high", "delta")),
    "cispo": ("epsilon_high",),
    "sapo": ("sapo_temperature_pos", "sapo_temperature_neg"),
    "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
}


def _gate_value(settings, key):
    """The value TRL's loss uses for `key`, from a dict of GRPOConfig settings."""
    if key == "epsilon_high" and settings.get("epsilon_high") is None:
        return settings.get("epsilon")
    return settings.get(key)


def _same(a, b):
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _config_settings(args, keys):
    return {k: getattr(args, k) for k in (*keys, "epsilon")}


def _method_settings(method, args):
    """The GRPOConfig gate settings that make TRL's built-in compute `method` (its TRL flags,
    each setting they leave out at GRPOConfig's default), or None: no built-in."""
    f = flags(method)["trl"]
    if f is None:
        return None
    fields = type(args).__dataclass_fields__
    keys = GATE_SETTINGS.get(f["loss_type"], ())
    return f["loss_type"], keys, {**{k: fields[k].default for k in (*keys, "epsilon")}, **f}


def _solved(method, args, keys, want, base, p, v):
    """Hyperparameter p (now v) solved from the first gate setting it moves: move it by d,
    read the settings again, and take the affine solution; v where it moves none."""
    for d in (0.25 * max(abs(v), 0.1), -0.25 * max(abs(v), 0.1)):
        try:
            moved = _method_settings(type(method)(**{**method.hparams, p: v + d}), args)
        except ValueError:  # out of its range: try the other way
            continue
        if moved is None:
            return v
        for k in keys:
            a, b = _gate_value(base, k), _gate_value(moved[2], k)
            if a is not None and b is not None and a != b and want[k] is not None:
                return float(f"{v + (want[k] - a) * d / (b - a):.12g}")
        return v
    return v


def _method_at(method, args, keys):
    """`method`'s class at hyperparameters whose TRL flags give `args`' gate values, or None.
    Each hyperparameter that moves a setting is solved from it (the flags are affine in it),
    then the flags are written again and compared."""
    want = {k: _gate_value(_config_settings(args, keys), k) for k in keys}
    base = _method_settings(method, args)[2]
    h = dict(method.hparams)
    for p, v in method.hparams.items():
        if isinstance(v, (int, float)) and math.isfinite(v):
            h[p] = _solved(method, args, keys, want, base, p, v)
    try:
        found = type(method)(**h)
    except ValueError:
        return None
    got = _method_settings(found, args)
    if got is None or not all(_same(_gate_value(got[2], k), want[k]) for k in keys):
        return None
    return found


def _spelled(method):
    from ..methods import REGISTRY

    h = ", ".join(f"{k}={v!r}" for k, v in method.hparams.items())
    if REGISTRY.get(method.name) is type(method):
        return f"rlgates.get({method.name!r}{', ' if h else ''}{h})"
    return f"{type(method).__name__}({h})"


def config_mismatch(args, method):
    """The sentence that says how `args`' gate settings (GATE_SETTINGS of the loss type of
    `method`'s TRL built-in) differ from `method`'s, with the fixes; None where they agree or
    the method has no TRL built-in (nothing to compare)."""
    spec = _method_settings(method, args)
    if spec is None:
        return None
    loss_type, keys, ours = spec
    cfg = _config_settings(args, keys)
    diffs, fix = [], {}
    for k in keys:
        have, want = _gate_value(cfg, k), _gate_value(ours, k)
        if _same(have, want):
            continue
        unset = " (unset, so epsilon's)" if k == "epsilon_high" and cfg[k] is None else ""
        diffs.append(f"{k} is {have!r} in GRPOConfig{unset} but {want!r} for {method.name}")
        fix[k] = want
    if not diffs:
        return None
    fixes = ["set GRPOConfig(" + ", ".join(f"{k}={v!r}" for k, v in fix.items())
             + ") (rlgates.trainers.flags(method)['trl'])"]
    other = _method_at(method, args, keys)
    if other is not None:
        fixes.append(f"pass method={_spelled(other)} to train GRPOConfig's values")
    fixes.append("pass allow_config_mismatch=True to train the method's values anyway")
    none = "" if other else f"; no {method.name} hyperparameters give GRPOConfig's values"
    return (f"GRPOConfig's gate settings differ from {_spelled(method)}, whose values are the "
            f"ones trained (TRL's {loss_type} loss reads them): " + "; ".join(diffs)
            + ". Fix: " + ", or ".join(fixes) + none + ".")


def rho_is_one(args) -> bool:
    """Whether ρ ≡ 1 by configuration: TRL 1.16 then keeps no old log-probs and its loss uses
    log π detached (`_generate_and_score_completions`: they are computed only when
    `gradient_accumulation_steps % (steps_per_generation × num_iterations) != 0`, or with
    vLLM's importance correction), since every pass over a batch falls in one optimiser step."""
    every = args.steps_per_generation * args.num_iterations
    return (args.gradient_accumulation_steps % every == 0
            and not (args.use_vllm and args.vllm_importance_sampling_correction))


def trl_loss(method, logp, logp_old, adv, mask, loss_type, *, max_completion_length=None,
             num_items_in_batch=None, num_processes=1, grad_accum=1, steps_per_generation=1,
             side=None):
    """The rlgates method's loss, normalised as TRL 1.16 normalises `loss_type`.

    grpo, sapo, luspo: the mean over *every* row of the micro-batch, fully masked rows
        included (rlgates' own mean skips them), divided by the gradient-accumulation steps;
    bnpo: this micro-batch's token-mean, divided by the accumulation steps;
    dr_grpo: Σ over tokens / (rows × max_completion_length), divided by the accumulation steps;
    dapo, cispo, vespo: Σ over tokens / (num_items_in_batch / num_processes × grad_accum /
        steps_per_generation): the generation batch's global token count, scaled to one step.
    side: the SideInfo of a method with side inputs (`side_info`).
    """
    if loss_type not in TRL_AGG:
        raise ValueError(f"loss_type {loss_type!r} has no rlgates mapping; use one of "
                         f"{sorted(TRL_AGG)}")
    agg = TRL_AGG[loss_type]
    mask = nx.check_mask(mask, logp.shape, logp.device)  # TRL's int mask, checked once
    if loss_type in ("dapo", "cispo", "vespo"):
        n = num_items_in_batch
        if n is None:
            n = mask.sum()
        norm = (torch.as_tensor(n).clamp(min=1.0) / num_processes
                * grad_accum / steps_per_generation)
        return loss(method, logp, logp_old, adv, mask, agg, norm=norm, side=side)
    norm = None if loss_type == "bnpo" else logp.shape[0]
    length = None
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length (TRL's constant normaliser)")
        length = max_completion_length
    return loss(method, logp, logp_old, adv, mask, agg, norm=norm, length=length,
                side=side) / grad_accum


class _Processes:
    """TRL's two cross-process reductions of its metrics (an accelerate Accelerator, or None for
    this process alone)."""

    def __init__(self, accelerator=None):
        self.acc = accelerator

    def sum(self, t):
        return t if self.acc is None else self.acc.reduce(t, reduction="sum")

    def gather(self, t):
        return t if self.acc is None else self.acc.gather(t)


def _global_mean(x, m, procs):  # _compute_loss's global_masked_mean
    if x.shape[1] == 1:  # sequence level: one value per row, every row counted (empty ones too)
        local = torch.stack([x.sum(), torch.tensor(float(x.shape[0]), device=x.device)])
    else:
        local = torch.stack([(x * m).sum(), m.sum().float()])
    total = procs.sum(local)
    return (total[0] / total[1].clamp(min=1.0)).item()


def _seq_mean(x, m):  # _compute_loss's masked_seq_mean: NaN for an empty row (nanmin skips it)
    return x.squeeze(1) if x.shape[1] == 1 else (x * m).sum(-1) / m.sum(-1)


def _clip(r, a, m, f, procs):  # grpo, bnpo, dr_grpo, dapo: "Compute the clipped probability ratios"
    if f.get("delta") is not None:  # TRL caps coef_1 at delta before it counts
        r = r.clamp(max=f["delta"])
    low = ((r < 1 - f["epsilon"]) & (a < 0)).float()
    high = ((r > 1 + f["epsilon_high"]) & (a > 0)).float()
    region = ((low > 0) | (high > 0)).float()
    return {"clip_ratio/low_mean": _global_mean(low, m, procs),
            "clip_ratio/high_mean": _global_mean(high, m, procs),
            "clip_ratio/region_mean": _global_mean(region, m, procs),
            "clip_ratio/low_min": nanmin(procs.gather(_seq_mean(low, m))).item(),
            "clip_ratio/high_max": nanmax(procs.gather(_seq_mean(high, m))).item()}


def _cispo(r, a, m, f, procs):  # is_cispo_clipped: the cap reached, A > 0 only
    return {"cispo_clip_ratio": _global_mean(((r > f["epsilon_high"]) & (a > 0)).float(), m,
                                             procs)}


def _sapo(r, a, m, f, procs):  # TRL's sapo logs no clip metric
    return {}


def _vespo(r, a, m, f, procs):  # vespo/phi_seq_mean: φ(w) of each row, every row counted
    log_w = (r.log() * m).sum(-1, keepdim=True).clamp(LOG_W_MIN, LOG_W_MAX)
    pos = a >= 0
    k = torch.where(pos, f["vespo_k_pos"], f["vespo_k_neg"])
    lam = torch.where(pos, f["vespo_lambda_pos"], f["vespo_lambda_neg"]).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(0.0, 0.0, 0.0)
    return {"vespo/phi_seq_mean": _global_mean(phi, m, procs)}


#: TRL loss_type -> (ρ as TRL's coef_1: [B, T], or [B, 1] at sequence level; A [B, 1]; mask;
#: the method's TRL flags; the reductions) -> the clip metrics that loss_type logs (TRL 1.16.0,
#: GRPOTrainer._compute_loss, "# Log the metrics").
TRL_METRICS = {**dict.fromkeys(TRL_CLIP_LOSS_TYPES, _clip),
               "cispo": _cispo, "sapo": _sapo, "vespo": _vespo}


def side_info(method, entropy=None, sampler_logp=None):
    """The SideInfo TRL's loss step can give a method with side inputs (None for one without):
    the per-token entropies it computes, when vLLM sampled the completions the engine's
    log-probs (`sampling_per_token_logps`), and a random `draw` per token (torch's global
    generator) for a loss that picks tokens at random. The loss derives the rest from the
    batch."""
    if not getattr(method, "side_inputs", ()):
        return None
    draw = None if entropy is None else torch.rand(entropy.shape, device=entropy.device)
    if sampler_logp is not None:  # an engine's rounding may leave a log-prob a hair above 0
        sampler_logp = sampler_logp.detach().clamp(max=0)
    fields = {"entropy": entropy, "sampler_logp": sampler_logp, "draw": draw}
    return SideInfo(**{k: v.detach() for k, v in fields.items() if v is not None})


def metrics(method, logp, logp_old, adv, mask, entropy=None, accelerator=None,
            side=None) -> dict:
    """The adapter's metrics for one micro-batch, reduced over `accelerator`'s processes as TRL
    reduces them: TRL's clip metrics where `method` has a TRL built-in (at the method's own
    settings), TRL's `entropy` when the per-token entropies are given, rlgates' gate statistics
    always (a side-input method's at `side`)."""
    procs = _Processes(accelerator)
    out = {}
    f = flags(method)["trl"]
    with torch.no_grad():
        lp, old, _, m = _detached_inputs(logp, logp_old, adv, mask)
        if f is not None:
            if f.get("importance_sampling_level") == "sequence":
                lr = nx.sequence_log_ratio(lp, old, m)[:, None]
            else:
                lr = nx.gate_log_ratio(lp, old, m)
            a = adv.detach()
            a = a[:, None] if a.dim() == 1 else a
            out.update(TRL_METRICS[f["loss_type"]](nx.ratio_from_log(lr), a, m, f, procs))
        if entropy is not None:
            out["entropy"] = _global_mean(entropy.detach(), m, procs)
        # gate_zero and gate_mean are over the A ≠ 0 tokens (gate_mean: every token when there
        # is none): over processes each process's value weighs by its count of those tokens,
        # as TRL weighs its clip fractions by tokens, not one process one vote
        a0 = adv.detach()
        live = (m & ((a0[:, None] if a0.dim() == 1 else a0) != 0)).sum()
        n = torch.stack([live, m.sum()]).to(device=logp.device, dtype=torch.float64)
        for k, v in gate_stats(method, logp, logp_old, adv, m, side).items():
            if procs.acc is not None and procs.acc.num_processes > 1:
                v = torch.tensor(v, dtype=torch.float64, device=logp.device)
                t = procs.sum(torch.cat([torch.nan_to_num(v) * n, n]))  # Σ v·n, Σ n
                v = (t[0] / t[2] if t[2] > 0 else t[1] / t[3].clamp(min=1)).item()
            out[f"rlgates/{k}"] = v
    return out


def builtin_loss(trainer, logp, logp_old, adv, mask, num_items_in_batch=None, entropy=None,
                 extra_inputs=None):
    """TRL's own policy loss (`GRPOTrainer._compute_loss`, with `trainer`'s settings) at the given
    log-probs, instead of the model's: a scalar differentiable in `logp`, so that TRL's gradient
    with respect to each token's log-prob can be read and compared (the book's chapter 14).

    logp, logp_old, mask: [B, T]; adv: [B], or [B, T] per token. num_items_in_batch: TRL's
    global token count (dapo, cispo); None: this batch's tokens. entropy: [B, T], the
    per-token entropies TRL logs and its entropy mask reads (zeros if None). extra_inputs:
    more of TRL's `inputs`, e.g. `sampling_per_token_logps` (the off-policy mask's sampler) or
    `importance_sampling_ratio` (vLLM's correction, which vespo folds into its weight). TRL's
    metrics for the batch are appended to `trainer._metrics`.
    """
    B, T = logp.shape
    mask = mask.long()
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "old_per_token_logps": logp_old,
        "num_items_in_batch": mask.sum() if num_items_in_batch is None
        else torch.as_tensor(num_items_in_batch),
        **(extra_inputs or {}),
    }

    def given(*args, **kwargs):  # stands in for the model's forward pass
        return logp, torch.zeros_like(logp) if entropy is None else entropy, None

    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by train()
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer._get_per_token_logps_and_entropies = given
    try:
        return GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies


def _refuse(args, method, trainer=None):
    """ValueError for every entry of REFUSED that holds (before GRPOTrainer.__init__, trainer
    None: those that read only args and the method)."""
    c = SimpleNamespace(args=args, method=method, trainer=trainer)
    bad = []
    for setting, _, holds in REFUSED:
        found = holds(c)
        if found:
            bad.append(setting + (f" ({found})" if isinstance(found, str) else ""))
    if bad:
        raise ValueError("RlgatesGRPOTrainer does not carry: " + "; ".join(bad))


def _check_config(args, method, allow_config_mismatch):
    _refuse(args, method)
    text = config_mismatch(args, method)
    if text is None:
        return
    if not allow_config_mismatch:
        raise ValueError("RlgatesGRPOTrainer: " + text)
    warnings.warn("RlgatesGRPOTrainer (allow_config_mismatch=True): " + text, stacklevel=3)


class RlgatesGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with an rlgates method (built-in, registered or `rlgates.byo.make`) as
    its policy loss. Takes GRPOTrainer's arguments plus `method`: a Method or a registry name.

    Before GRPOTrainer.__init__ loads anything, it refuses what it cannot carry (`REFUSED`) and
    GRPOConfig gate settings that differ from the method's TRL flags (`config_mismatch`; with
    `allow_config_mismatch=True`, a warning instead, and the method's values are trained). Once
    built it warns when ρ ≡ 1 by configuration (`rho_is_one`): no gate can act then."""

    def __init__(self, *args, method, allow_config_mismatch=False, **kwargs):
        if isinstance(method, str):
            import rlgates

            method = rlgates.get(method)
        config = kwargs["args"] if "args" in kwargs else (args[2] if len(args) > 2 else None)
        if config is not None:  # None: GRPOTrainer builds its default, checked below
            _check_config(config, method, allow_config_mismatch)
        super().__init__(*args, **kwargs)
        self.method = method
        if config is None:
            _check_config(self.args, method, allow_config_mismatch)
        self._check_supported()  # the entries that need the model
        if rho_is_one(self.args):
            a = self.args
            warnings.warn(
                f"RlgatesGRPOTrainer: ρ ≡ 1 on every token, so {method.name}'s gate never acts: "
                f"gradient_accumulation_steps={a.gradient_accumulation_steps} is a multiple of "
                f"steps_per_generation × num_iterations = {a.steps_per_generation} × "
                f"{a.num_iterations}, so every pass over a batch falls in one optimiser step and "
                "TRL keeps no old log-probs. For a gate to act, set num_iterations=2 with "
                "steps_per_generation = gradient_accumulation_steps, or steps_per_generation > "
                "gradient_accumulation_steps.", stacklevel=2)

    def _check_supported(self):
        _refuse(self.args, self.method, self)

    def _compute_loss(self, model, inputs):
        """The method's loss under TRL's normaliser, in place of TRL's own (GRPOTrainer's
        `compute_loss` calls this hook, and `rlgates.inspect.capture` wraps it)."""
        if inputs.get("pixel_values") is not None:
            raise ValueError("RlgatesGRPOTrainer handles text-only inputs")
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask
        if "tool_mask" in inputs:
            mask = completion_mask * inputs["tool_mask"]
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old  # num_iterations=1: ρ ≡ 1
        adv = inputs["advantages"]
        side = side_info(self.method, entropy, inputs.get("sampling_per_token_logps"))
        train = self.model.training
        out = trl_loss(
            self.method, logp, old, adv, mask, self.loss_type,
            max_completion_length=self.max_completion_length,
            num_items_in_batch=inputs.get("num_items_in_batch"),
            num_processes=self.accelerator.num_processes,
            grad_accum=self.current_gradient_accumulation_steps if train else 1,
            steps_per_generation=self.args.steps_per_generation if train else 1,
            side=side,
        )
        mode = "train" if train else "eval"
        for k, v in metrics(self.method, logp, old, adv, mask, entropy, self.accelerator,
                            side).items():
            self._metrics[mode][k].append(v)
        return out.to(logp.dtype)


__all__ = ["REFUSED", "TRL_AGG", "TRL_METRICS", "RlgatesGRPOTrainer", "builtin_loss", "metrics",
           "side_info", "trl_loss"]
