"""What the book says verl and TRL do, read from the installed trainers.

Each test reads a default from what a user of the pinned trainer gets (verl's generated Hydra
config, a constructed `GRPOConfig`) or runs the trainer's own function on a batch, and asserts the
sentence of rlgates or the book that states it. An upgrade of either trainer then fails here, on
the sentence it breaks.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import rlgates

ROOT = Path(__file__).resolve().parents[1]
# Under xdist one worker runs this group (pyproject.toml: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("trainers")


@pytest.fixture(scope="module", autouse=True)
def trainers():
    """verl and TRL (the module is skipped without them), imported when the first test here runs
    rather than when pytest collects the module: every xdist worker collects every module, and
    these imports cost ~20 s of CPU."""
    global verl, GRPOConfig, GRPOTrainer, agg_loss, get_policy_loss_fn, FSDPActorConfig
    pytest.importorskip("verl")
    pytest.importorskip("trl")
    import verl
    from trl import GRPOConfig, GRPOTrainer
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig


@pytest.fixture(scope="module")
def verl_defaults():
    """The resolved defaults of verl's PPO trainer, as `main_ppo` composes them."""
    from rlgates._book import facts

    verl_config = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    assert facts.path(facts.VERL_CONFIG) == verl_config  # one reader: the chapters' own
    return facts.verl_config()


def _ragged(lengths, T):
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    old = -torch.linspace(0.5, 2.5, len(lengths) * T, dtype=torch.float64).reshape(-1, T)
    return old, mask


def test_gspo_default_aggregation_is_not_verls_or_trls(verl_defaults, tmp_path):
    """E1: GSPO's paper averages responses (seq-mean-token-mean); verl's gspo follows the actor's
    loss_agg_mode, token-mean by default, and TRL's default loss_type is 'dapo'."""
    actor = verl_defaults["actor_rollout_ref"]["actor"]
    assert actor["loss_agg_mode"] == "token-mean"
    assert GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                      bf16=False).loss_type == "dapo"
    # verl's gspo at the actor's default weighs each response by its length
    lengths, T = [2, 8, 3, 6], 8
    old, mask = _ragged(lengths, T)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)[:, None].expand(4, T)
    cfg = FSDPActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4,
                          clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    per_response = {}
    for agg in ("token-mean", "seq-mean-token-mean"):
        lp = old.clone().requires_grad_(True)  # ρ = 1: every sequence gate open
        loss, _ = get_policy_loss_fn("gspo")(old_log_prob=old, log_prob=lp, advantages=adv,
                                             response_mask=mask, loss_agg_mode=agg, config=cfg)
        loss.backward()
        per_response[agg] = lp.grad.abs().sum(-1)
    length = torch.tensor(lengths, dtype=torch.float64)
    assert torch.allclose(per_response["token-mean"], length / length.sum())
    assert torch.allclose(per_response["seq-mean-token-mean"], torch.full((4,), 0.25,
                                                                          dtype=torch.float64))
    # rlgates' default is the paper's, and its stated source says the trainers' defaults differ
    gspo = rlgates.get("gspo")
    assert gspo.agg == "seq-mean-token-mean"
    for phrase in ("loss_agg_mode", "token-mean", "loss_type='grpo'", "'dapo'"):
        assert phrase in gspo.agg_source, phrase
    assert "gspo loss uses seq-mean-token-mean" not in gspo.agg_source
    ch8 = " ".join((ROOT / "chapters" / "08_gspo.md").read_text().split())
    assert "verl's `gspo` follows the actor's `loss_agg_mode`, `token-mean` by default" in ch8
    assert "GSPO's trainers average over responses" not in ch8


def test_constant_normaliser_is_n_times_t_in_verl(verl_defaults):
    """E3: verl's seq-mean-token-sum-norm divides the sum of sequence sums by N x T, T the padded
    width unless loss_scale_factor is set, N the global_batch_size its trainer passes (every
    response of the step, test_conventions_empty_rows) or, called alone as here, the non-empty
    sequences (TRL's dr_grpo, sum / (rows x max_completion_length), is measured in
    tests/test_trainers.py)."""
    old, mask = _ragged([3, 0, 5, 2], 6)
    loss_mat = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    total = float((loss_mat * mask).sum())
    v = agg_loss(loss_mat, mask.double(), "seq-mean-token-sum-norm")
    assert float(v) == pytest.approx(total / (3 * 6), rel=1e-12)  # N = 3 non-empty, T = 6
    assert float(v) != pytest.approx(total / 6, rel=1e-3)          # not T alone (older verl)
    v8 = agg_loss(loss_mat, mask.double(), "seq-mean-token-sum-norm", loss_scale_factor=8)
    assert float(v8) == pytest.approx(total / (3 * 8), rel=1e-12)
    # chapter 10 states it so, and no longer says that a current trainer divides by T alone
    text = " ".join((ROOT / "chapters" / "10_loss_aggregation.md").read_text().split())
    assert "verl 0.9.1 and TRL 1.16.0 both divide by $N \\times T$" in text
    assert "one divides the total by $T$ alone" not in text
    assert verl.__version__ == "0.9.1"


def test_which_regime_each_trainer_starts_in(verl_defaults, tmp_path):
    """E10: TRL's defaults take one optimiser step per generation batch, and recompute the old
    log-probs only when asked to (steps out of step) or under vLLM with its default correction;
    verl's defaults take train_batch_size / ppo_mini_batch_size optimiser steps per rollout."""
    cfg = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert cfg.num_iterations == 1 and cfg.use_vllm is False
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps
    assert cfg.vllm_importance_sampling_correction is True
    code = " ".join(inspect.getsource(GRPOTrainer._generate_and_score_completions).split())
    assert ("if self.args.gradient_accumulation_steps % generate_every != 0 or ( self.use_vllm "
            "and self.vllm_importance_sampling_correction ):") in code
    data, actor = verl_defaults["data"], verl_defaults["actor_rollout_ref"]["actor"]
    assert (data["train_batch_size"], actor["ppo_mini_batch_size"]) == (1024, 256)
    assert actor["ppo_epochs"] == 1
    steps = data["train_batch_size"] // actor["ppo_mini_batch_size"]
    ch1 = " ".join((ROOT / "chapters" / "01_importance_ratio.md").read_text().split())
    assert "`data.train_batch_size=1024` prompts per rollout" in ch1
    assert f"`ppo_mini_batch_size=256`, give {['no', 'one', 'two', 'three', 'four'][steps]}" in ch1
    assert "default `vllm_importance_sampling_correction=True` makes it recompute them" in ch1


def test_clip_fraction_is_counted_per_trainer_and_loss():
    """E20: TRL's clip_ratio/* averages one value per response at sequence level and every valid
    token at token level; verl's per-loss definitions are run against verl's own functions in
    tests/test_trainers.py (test_verl_metrics_are_verls_own). The glossary says both."""
    code = " ".join(inspect.getsource(GRPOTrainer._compute_loss).split())
    assert ('if x.shape[1] == 1: # when importance_sampling_level == "sequence": one value per '
            'sequence local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0])') in code
    assert 'self._metrics[mode]["clip_ratio/region_mean"].append(global_masked_mean(' in code
    glossary = " ".join((ROOT / "glossary.md").read_text().split())
    assert "for `sapo` it is 0; for `cispo` it counts every token whose weight is clipped" in glossary
    assert "a share of responses with `importance_sampling_level=\"sequence\"`" in glossary
    assert "by its sequence count under the seq-mean modes (verl's `global_batch_size`)" in glossary


def test_gradient_clipping_defaults_and_what_neither_trainer_logs(verl_defaults, tmp_path):
    """Ch. 11: both trainers clip the gradient norm at 1.0 by default; neither logs a largest
    |log rho| (newcomer's note 1), which is why ch. 11 states its range as an inference."""
    assert verl_defaults["actor_rollout_ref"]["actor"]["grad_clip"] == 1.0
    cfg = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert cfg.max_grad_norm == 1.0
    trl_code = inspect.getsource(GRPOTrainer)
    verl_src = (Path(verl.__file__).parent / "trainer" / "ppo" / "core_algos.py").read_text()
    for code in (trl_code, verl_src):
        assert "max_log_ratio" not in code and "log_ratio_max" not in code
    ch11 = " ".join((ROOT / "chapters" / "11_training_lab.md").read_text().split())
    assert "Neither trainer logs the largest $|\\log\\rho_t|$ of an update" in ch11


def test_trl_token_normaliser_spans_the_generation_batch():
    """E18: TRL's dapo/cispo normaliser is num_items_in_batch / num_processes x GA / spg."""
    code = inspect.getsource(GRPOTrainer._compute_loss)
    assert ('normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / '
            'self.accelerator.num_processes') in code
    assert ("normalizer = normalizer * self.current_gradient_accumulation_steps / "
            "self.args.steps_per_generation") in code
    ch14 = " ".join((ROOT / "chapters" / "14_real_trainers.md").read_text().split())
    assert "by `num_items_in_batch / num_processes × GA / steps_per_generation`" in ch14
    assert "TRL's `dapo` and verl's `token-mean` divide by the token count of the whole" not in ch14


def test_off_policy_corrections_table(verl_defaults, tmp_path):
    """E7 and the newcomer's note 10: chapter 15's table names the pinned trainers' flags."""
    import dataclasses
    import warnings

    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    user = verl_defaults["algorithm"]["rollout_correction"]  # what a verl user gets: no correction
    assert (user["rollout_is"], user["rollout_rs"], user["bypass_mode"]) == (None, None, False)
    assert user["rollout_is_threshold"] == 2.0
    fields = {f.name for f in dataclasses.fields(RolloutCorrectionConfig)}
    assert {"rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold",
            "bypass_mode"} <= fields and "rollout_is_mode" not in fields
    doc = " ".join((RolloutCorrectionConfig.__doc__ or "").split())
    assert 'string (e.g. ``"0.5_5.0"``): IcePop, zero weights outside [lower, upper]' in doc
    assert "Single float or float-like string (e.g. ``2.0``): TIS" in doc
    cfg = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert cfg.vllm_importance_sampling_correction is True
    assert (cfg.vllm_importance_sampling_mode, cfg.vllm_importance_sampling_clip_max) == \
        ("sequence_mask", 3.0)
    supported = " ".join(inspect.getsource(GRPOConfig).split())
    assert ("Supported options are: 'token_truncate', 'token_mask', 'sequence_truncate', and "
            "'sequence_mask'") in supported.replace('" "', "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                   vllm_importance_sampling_cap=2.0)
    assert any("vllm_importance_sampling_cap" in str(w.message) and "deprecated" in
               str(w.message) for w in caught)
    ch15 = " ".join((ROOT / "chapters" / "15_off_policy.md").read_text().split())
    for phrase in ("`rollout_is=token` or `sequence`, `rollout_is_threshold=2.0`",
                   "the default, `sequence_mask` with $C = 3$",
                   "`rollout_is_threshold=\"0.5_5.0\"`", "verl's `bypass_mode=True`",
                   "`vllm_importance_sampling_cap` is deprecated"):
        assert phrase in ch15, phrase
    assert "rollout_is_mode=mask" not in ch15 and "newer TRL" not in ch15


def test_verls_entropy_is_pi_olds_under_loss_agg_mode():
    """verl's actor/entropy aggregates the old policy's entropy with loss_agg_mode; the
    diagnostics' entropy says so instead of claiming to be verl's number."""
    source = Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py"
    code = " ".join(source.read_text().split())  # read, not imported: it needs more packages
    assert ('entropys = old_log_prob.batch["entropys"] response_masks = batch.batch["response_mask"]'
            ' actor_config = self.config.actor_rollout_ref.actor entropy_agg = agg_loss( '
            'loss_mat=entropys, loss_mask=response_masks, loss_agg_mode=actor_config.loss_agg_mode'
            ) in code
    assert '"actor/entropy": entropy_agg.detach().item()' in code
    from rlgates import diagnostics

    assert "verl's ``actor/entropy`` is another quantity" in diagnostics.__doc__


def test_trl_logged_loss_and_grad_norm_and_metric_reductions():
    """Chapter 14's engine section: the logged `loss` is the mean over processes of the window's
    summed micro-batch losses (no second division by GA: GRPOTrainer scales its own loss, and
    transformers < 5.19 reads that from model_accepts_loss_kwargs / compute_loss_func); grad_norm
    is the norm before clipping; TRL sums its token metrics over processes and gathers its
    per-response ones."""
    import transformers
    from packaging.version import Version
    from transformers import Trainer
    from trl.trainer.base_trainer import _BaseTrainer

    assert GRPOTrainer.loss_is_scaled_for_ga is True
    assert Version(transformers.__version__) < Version("5.19.0")
    base = " ".join(inspect.getsource(_BaseTrainer.__init__).split())
    assert "self.model_accepts_loss_kwargs = False if self.loss_is_scaled_for_ga:" in base
    log = " ".join(inspect.getsource(Trainer._maybe_log_save_evaluate).split())
    assert "tr_loss_scalar = nested_gather(tr_loss, self.args.parallel_mode).mean().item()" in log
    assert ('logs["loss"] = tr_loss_scalar / (self.state.global_step - '
            'self._globalstep_last_logged)') in log
    train = " ".join(inspect.getsource(Trainer._run_epoch).split())
    assert "self._tr_loss += tr_loss_step" in train
    assert "grad_norm = self._clip_grad_norm(model)" in train
    assert "Returns the pre-clip gradient norm" in inspect.getsource(Trainer._clip_grad_norm)
    code = " ".join(inspect.getsource(GRPOTrainer._compute_loss).split())
    assert 'totals = self.accelerator.reduce(torch.stack([local_sum, local_count]), reduction="sum")' \
        in code
    assert "gathered_low_clip = self.accelerator.gather(masked_seq_mean(is_low_clipped.float()))" \
        in code
    ch14 = " ".join((ROOT / "chapters" / "14_real_trainers.md").read_text().split())
    assert "the mean over processes of the sum, over the window's micro-batches," in ch14


# --------------------------------------------------------------------------------------------
# The reader the chapters use (rlgates._book.facts), and the pages that run no code: each
# test below reads one fact from the installed trainer and asserts the sentence that states it.

from rlgates._book import facts  # noqa: E402


def _page(relative):
    """A page's (or module's) text with every run of whitespace one space, as facts.code."""
    return " ".join((ROOT / relative).read_text().split())


def _chapter_reads(call):
    """The arguments of every `facts.<call>("...")` in the chapters' code."""
    import re

    found = set()
    for md in sorted((ROOT / "chapters").glob("*.md")):
        found |= set(re.findall(rf'facts\.{call}\((?:\w+ \+ )?"([^"]+)"', md.read_text()))
    return found


def test_facts_reader_finds_and_refuses(monkeypatch):
    """The reader sees the trainers, and fails loudly on what they do not say (negative controls).
    Where a trainer is missing (Binder), installed() is False and the chapters skip their checks,
    running every chapter cell that follows them all the same."""
    from rlgates import trainers

    assert facts.installed() and facts.versions() == trainers.TESTED_VERSIONS
    with monkeypatch.context() as m:
        real = facts.importlib.util.find_spec
        m.setattr(facts.importlib.util, "find_spec",
                  lambda name, *a: None if name == "verl" else real(name, *a))
        assert not facts.installed()
        with pytest.raises(ModuleNotFoundError):
            facts.path("verl/trainer/ppo/core_algos.py")
    with pytest.raises(AssertionError, match="no longer says"):
        facts.says("verl/trainer/ppo/core_algos.py", "loss_agg_mode = 'token-sum-everything'")
    with pytest.raises(LookupError):
        facts.trl("no_such_field")
    with pytest.raises(LookupError):
        facts.code("trl/trainer/grpo_trainer.py", "GRPOTrainer.no_such_method")
    with pytest.raises(KeyError):
        facts.verl("actor_rollout_ref.actor.no_such_key")
    # a registry read from the file is the registry verl builds on import
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    # verl's own: tests/test_trainers.py registers the adapter's (rlgates_*) in this process
    on_import = {k for k in POLICY_LOSS_REGISTRY if not k.startswith("rlgates_")}
    assert set(facts.registered("verl/trainer/ppo/core_algos.py", "register_policy_loss")) == \
        on_import


def test_facts_trl_defaults_are_a_constructed_configs(tmp_path):
    """Every GRPOConfig default a chapter reads with facts.trl is what a constructed GRPOConfig
    holds, or None that __post_init__ fills (then the chapter asserts the fill in TRL's code)."""
    names = _chapter_reads("trl")
    assert {"num_iterations", "loss_type", "beta", "max_grad_norm",
            "vllm_importance_sampling_mode"} <= names, names  # the reader is in use
    cfg = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    filled = {"steps_per_generation"}  # declared None; __post_init__ sets it to GA
    for name in names:
        declared = facts.trl(name)
        if name in filled:
            assert declared is None and getattr(cfg, name) == cfg.gradient_accumulation_steps
        else:
            assert declared == getattr(cfg, name), name


def test_facts_verl_reads_the_users_config_not_a_dataclass(verl_defaults):
    """facts.verl reads the generated YAML a user gets; where verl's dataclass default differs
    (rollout_is: "sequence" there, null here), the user's wins."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    assert facts.verl("algorithm.rollout_correction.rollout_is") is None
    assert RolloutCorrectionConfig().rollout_is == "sequence"  # the disagreement, still there
    assert facts.verl("data.train_batch_size") == verl_defaults["data"]["train_batch_size"]


def test_conventions_edges():
    """'At exactly ρ = 1 ± ε, verl and TRL pass the full gradient, where rlgates passes 0.'"""
    facts.says("verl/trainer/ppo/core_algos.py", "torch.clamp( ratio, 1 - cliprange_low",
               "clip_pg_losses1 = torch.maximum( pg_losses1, pg_losses2 )",
               name="compute_policy_loss_vanilla")
    facts.says("trl/trainer/grpo_trainer.py", "per_token_loss = -torch.min(per_token_loss1, "
               "per_token_loss2)", name="GRPOTrainer._compute_loss")
    # torch.clamp inside a min passes the full slope at the edge (ties split, clamp passes)
    r = torch.tensor([1.2], dtype=torch.float64, requires_grad=True)
    torch.minimum(r * 1.0, r.clamp(0.8, 1.2) * 1.0).sum().backward()
    assert float(r.grad) == 1.0
    assert "At exactly $\\rho = 1 \\pm \\epsilon$, verl and TRL pass the full gradient, where " \
        "`rlgates` passes 0." in _page("conventions.md")
    assert "Edges: a hard gate is 0 exactly at its edge (strict inequalities); verl and TRL pass " \
        "the gradient there." in _page("README.md")


def test_conventions_and_readme_clamp():
    """'verl clamps the token log-ratio at ±20 as rlgates does, but GSPO's sequence log-ratio
    at +10 on one side only; TRL clamps only in its VESPO loss.'"""
    from rlgates import _numerics

    core = "verl/trainer/ppo/core_algos.py"
    for loss in ("vanilla", "sapo", "cispo"):
        facts.says(core, "negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, "
                   "max=20.0)", name=f"compute_policy_loss_{loss}")
    facts.says(core, "log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, "
               "max=10.0)", name="compute_policy_loss_gspo")
    trl_loss = facts.code("trl/trainer/grpo_trainer.py", "GRPOTrainer._compute_loss")
    assert "coef_1 = torch.exp(log_importance_weights)" in trl_loss
    assert "clamp(log_ratio" not in trl_loss and "log_ratio.clamp" not in trl_loss
    assert "log_importance_weights = torch.clamp" not in trl_loss
    assert _numerics.LOG_RATIO_CLAMP == 20
    page = _page("conventions.md")
    assert "verl clamps the token log-ratio at $\\pm 20$ as `rlgates` does in `vanilla` (its " \
        "default), `dppo_tv`, `dppo_kl`, `sapo` and `cispo`, and GSPO's sequence log-ratio at " \
        "$+10$ on one side only; its `clip_cov`, `kl_cov` and `geo_mean` do not clamp" in page
    assert "TRL does not clamp the ratio of its clip, SAPO and CISPO losses; its VESPO clamps " \
        "each token's log-ratio at $\\pm 20$." in page
    facts.says("trl/trainer/grpo_trainer.py",  # VESPO's gamma weights: the one TRL clamp
               "log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)",
               name="GRPOTrainer.get_gamma_weights")
    for loss in ("clip_cov", "kl_cov"):  # the ones the page says do not clamp
        assert "min=-20.0" not in facts.code(core, f"compute_policy_loss_{loss}"), loss
    facts.says(core, "# negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, "
               "max=20.0)", name="compute_policy_loss_geo_mean")  # commented out
    assert "as verl does (TRL clamps only in its VESPO loss, and verl's GSPO at +10 on one " \
        "side)" in _page("README.md")


def test_conventions_empty_rows():
    """'TRL's grpo, sapo and dr_grpo losses divide by every row, fully masked ones included, and
    so do verl's seq-mean modes: its trainer passes global_batch_size.'"""
    facts.says("trl/trainer/grpo_trainer.py",
               'if self.loss_type in ["grpo", "sapo"]: loss = ((per_token_loss * mask).sum(-1) / '
               "mask.sum(-1).clamp(min=1.0)).mean()",
               "loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * "
               "self.max_completion_length)", name="GRPOTrainer._compute_loss")
    update = "ppo_mini_batch_size = ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n"
    facts.says("verl/trainer/ppo/ray_trainer.py", update, "global_batch_size=ppo_mini_batch_size,",
               name="RayPPOTrainer._update_actor")
    facts.says("verl/trainer/ppo/v1/trainer_base.py", update,
               '"global_batch_size": ppo_mini_batch_size,', name="PPOTrainer._update_actor")
    facts.says("verl/workers/utils/losses.py",
               'config.global_batch_info["global_batch_size"] = data["global_batch_size"]',
               name="ppo_loss")
    # verl's agg_loss with that count divides by every row; without it, by the non-empty ones
    old, mask = _ragged([3, 0, 5, 2], 6)
    loss_mat = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    total_per_row = float((loss_mat * mask).sum())
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        given = agg_loss(loss_mat, mask.double(), mode, global_batch_size=4)
        alone = agg_loss(loss_mat, mask.double(), mode)
        assert float(given) == pytest.approx(float(alone) * 3 / 4, rel=1e-12), mode
    assert float(agg_loss(loss_mat, mask.double(), "seq-mean-token-sum", global_batch_size=4)) \
        == pytest.approx(total_per_row / 4, rel=1e-12)
    text = _page("conventions.md")
    assert "TRL's `grpo`, `sapo` and `dr_grpo` losses divide by every row, fully masked ones " \
        "included, and so do verl's seq-mean modes: its trainer passes `global_batch_size`, " \
        "every response of the optimiser step." in text
    assert "`rlgates` and verl divide by the rows that hold a token" not in text


def test_conventions_cispo_bound_and_default_loss():
    """'TRL's epsilon_high caps the ratio itself; rlgates and verl cap at 1 + ε_h.' and 'verl's
    default policy loss is dual-clip PPO with c = 3.'"""
    facts.says("trl/trainer/grpo_trainer.py",
               "clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()",
               name="GRPOTrainer._compute_loss")
    facts.says("verl/trainer/ppo/core_algos.py",
               "clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)",
               name="compute_policy_loss_cispo")
    assert facts.verl("actor_rollout_ref.actor.policy_loss.loss_mode") == "vanilla"
    assert facts.verl("actor_rollout_ref.actor.clip_ratio_c") == 3.0
    text = _page("conventions.md")
    assert "TRL's `epsilon_high` caps the ratio itself; `rlgates` and verl cap at $1 + " \
        "\\epsilon_h$." in text
    assert "**verl's default policy loss** is dual-clip PPO with $c = 3$" in text
    # so CISPO's TRL flags cap at 1 + ε_h, and with a lower clip (ε_low < 1) TRL has none
    from rlgates.trainers import flags

    cispo_trl = flags(rlgates.get("cispo", eps_high=3.0))["trl"]
    assert cispo_trl["epsilon_high"] == 4.0 and "epsilon" not in cispo_trl
    assert flags(rlgates.get("cispo", eps_low=0.2))["trl"] is None
    assert "verl's default policy loss ('vanilla') is dual-clip PPO with c = 3 and " \
        "loss_agg_mode token-mean." == rlgates.get("dual_clip").agg_source


def test_conventions_set_up_normalisers():
    """'Dr. GRPO's max_completion_length (TRL), and the global token count across micro-batches
    and processes (TRL's num_items_in_batch, verl's global batch information).'"""
    facts.says("trl/trainer/grpo_trainer.py", "self.max_completion_length)",
               'normalizer = inputs["num_items_in_batch"]', name="GRPOTrainer._compute_loss")
    facts.says("verl/workers/utils/losses.py",
               'config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]',
               name="ppo_loss")
    assert "Dr. GRPO's `max_completion_length` (TRL), and the global token count across " \
        "micro-batches and processes (TRL's `num_items_in_batch`, verl's global batch " \
        "information)." in _page("conventions.md")


def test_readme_group_advantage_epsilon():
    """'GRPO advantages divide by the group's unbiased std (torch's default) plus 1e-6, as one
    large trainer does' (verl; TRL adds 1e-4)."""
    facts.says("verl/trainer/ppo/core_algos.py", "epsilon: float = 1e-6,",
               "id2std[idx] = torch.std(scores_tensor)", name="compute_grpo_outcome_advantage")
    assert "epsilon" not in facts.code("verl/trainer/ppo/ray_trainer.py")  # the default runs
    facts.says("trl/trainer/grpo_trainer.py", "advantages = advantages / (std_rewards + 1e-4)")
    assert "GRPO advantages divide by the group's unbiased std (torch's default) plus 1e-6, as " \
        "one large trainer does" in _page("README.md")


def test_which_gate_on_policy_default():
    """'one optimiser step per rollout batch (TRL's GRPO default, num_iterations=1)'."""
    assert facts.trl("num_iterations") == 1 and facts.trl("steps_per_generation") is None
    facts.says("trl/trainer/grpo_config.py", "if self.generation_batch_size is None and "
               "self.steps_per_generation is None: self.steps_per_generation = "
               "self.gradient_accumulation_steps")
    assert "one optimiser step per rollout batch** (TRL's GRPO default, `num_iterations=1`)" in \
        _page("which_gate.md")


def test_offpolicy_names_the_pinned_flags():
    """rlgates.offpolicy's docstring and CORRECTIONS name flags the pinned trainers have: verl's
    rollout_is / rollout_rs / "0.5_5.0", TRL's *_truncate / *_mask modes; no removed option."""
    from rlgates import offpolicy

    rc = facts.verl("algorithm.rollout_correction")
    assert {"rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold"} <= set(rc)
    assert rc["rollout_is_threshold"] == 2.0
    assert "rollout_is_mode" not in facts.code("verl/trainer/config/algorithm.py")
    facts.says("verl/trainer/config/algorithm.py",
               "threshold: float = 5.0, threshold_lower: float = 0.5,",
               name="RolloutCorrectionConfig.decoupled_token_icepop")
    assert (facts.trl("vllm_importance_sampling_mode"),
            facts.trl("vllm_importance_sampling_clip_max")) == ("sequence_mask", 3.0)
    facts.says("trl/trainer/grpo_config.py",
               "The `vllm_importance_sampling_cap` argument is deprecated")
    text = " ".join(offpolicy.__doc__.split()
                    + [c["source"] for c in offpolicy.CORRECTIONS.values()])
    for gone in ("rollout_is_mode", "vllm_importance_sampling_cap", "newer TRL"):
        assert gone not in text, gone
    for phrase in ("``rollout_is_threshold=2.0``", "``rollout_rs`` with ``rollout_rs_threshold``",
                   "``sequence_truncate`` modes with ``vllm_importance_sampling_clip_max``",
                   "its default under vLLM ``sequence_mask`` with C = 3",
                   "``rollout_is_threshold=\"0.5_5.0\"``", "decoupled_token_icepop"):
        assert phrase in text, phrase


def test_diagnostics_and_regularisers_name_what_the_trainers_compute():
    """diagnostics: 'TRL global_masked_mean over all processes'; regularisers: the entropy bonus
    (verl with loss_agg_mode, TRL the token mean), k3+ and TRL's ratio correction."""
    from rlgates import diagnostics, regularisers

    trl_loss = facts.code("trl/trainer/grpo_trainer.py", "GRPOTrainer._compute_loss")
    assert "def global_masked_mean(x):" in trl_loss and "masked_batch_mean" not in trl_loss
    assert "TRL `global_masked_mean` over all processes" in " ".join(diagnostics.__doc__.split())
    facts.says("verl/workers/utils/losses.py", "entropy_loss = agg_loss( loss_mat=entropy, "
               "loss_mask=response_mask, loss_agg_mode=loss_agg_mode,", name="ppo_loss")
    assert "(entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0)" in trl_loss
    doc = " ".join(regularisers.entropy_bonus.__doc__.split())
    assert "verl (entropy_coeff, aggregated with the actor's loss_agg_mode) and TRL " \
        "(entropy_coef, always the token mean)" in doc
    facts.says("verl/trainer/ppo/core_algos.py", "return backward_score - "
               "backward_score.detach() + forward_score.detach()", name="kl_penalty")
    assert "if self.args.use_bias_correction_kl: per_token_kl = per_token_kl * coef_1" in trl_loss
    mod = " ".join(regularisers.__doc__.split())
    assert "k3+ the value of k3 with the gradient of k2 (straight-through; verl's" in mod


def test_method_agg_sources_state_verls_default():
    """The agg_source lines of ppo, grpo and sapo (shown on the conventions page)."""
    assert facts.verl("actor_rollout_ref.actor.loss_agg_mode") == "token-mean"
    assert rlgates.get("ppo").agg_source.endswith("verl's default loss_agg_mode is token-mean too.")
    assert "verl's default loss_agg_mode is token-mean, so GRPO run with verl's defaults weighs " \
        "responses by length." in rlgates.get("grpo").agg_source
    facts.says("verl/trainer/ppo/core_algos.py", 'loss_agg_mode="seq-mean-token-mean",',
               name="compute_policy_loss_sapo")
    facts.says("trl/trainer/grpo_trainer.py", 'if self.loss_type in ["grpo", "sapo"]: loss = '
               "((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
               name="GRPOTrainer._compute_loss")
    assert rlgates.get("sapo").agg_source.endswith(
        "verl's and TRL's sapo losses use the same per-sequence mean.")


def test_references_name_what_trl_cites():
    """references.md: ScaleRL is 'TRL's CISPO cap', INTELLECT-2 'TRL's delta'."""
    facts.says("trl/trainer/grpo_config.py", "the [INTELLECT-2 tech report]"
               "(https://huggingface.co/papers/2505.07291).",
               "When used with `loss_type='cispo'`, this corresponds to the ε_max param "
               "specified in the [ScaleRL paper](https://huggingface.co/papers/2510.13786)")
    assert facts.trl("delta") is None and facts.trl("epsilon_high") is None  # both opt-in
    text = _page("references.md")
    ch14 = "{doc}`chapter 14 <chapters/14_real_trainers>`."
    assert f"(ScaleRL). arXiv:2510.13786. TRL's CISPO cap; {ch14}" in text
    assert f"arXiv:2505.07291. TRL's `delta`; {ch14}" in text


def test_readme_value_head_shim():
    """README: 'verl imports TRL's value-head model, which TRL 1.16.0 removed, on every model
    build' (tests/engines/test_verl_engine.py builds the model with and without the shim)."""
    facts.says("verl/utils/model.py",
               "from trl.experimental.ppo import AutoModelForCausalLMWithValueHead",
               "from trl import AutoModelForCausalLMWithValueHead")
    assert not facts.path("trl/experimental/ppo").exists()
    assert "AutoModelForCausalLMWithValueHead" not in facts.code("trl/__init__.py")
    assert "verl imports TRL's value-head model, which TRL 1.16.0 removed, on every model " \
        "build." in _page("README.md")
