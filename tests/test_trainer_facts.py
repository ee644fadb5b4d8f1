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

pytest.importorskip("verl")
pytest.importorskip("trl")

import verl  # noqa: E402
import yaml  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

import rlgates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VERL_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


@pytest.fixture(scope="module")
def verl_defaults():
    """The resolved defaults of verl's PPO trainer, as `main_ppo` composes them."""
    return yaml.safe_load(VERL_CONFIG.read_text())


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
    """E3: verl's seq-mean-token-sum-norm divides the sum of sequence sums by N x T, N the
    non-empty sequences and T the padded width unless loss_scale_factor is set (TRL's dr_grpo,
    sum / (rows x max_completion_length), is measured in tests/test_trainers.py)."""
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
