"""Tiny stock TRL GRPOTrainer runs with one known fault each, captured for `rlgates inspect`.

    python tests/engines/inspect_runs.py OUT_DIR [SEED]

Each run is the healthy one with one knob turned. The healthy run: tests/trl_run.py's tiny
Llama with its output layer scaled by PEAK (a peaked policy, as a pretrained model's is),
TRL's default loss_type "dapo", num_iterations 2, learning rate HEALTHY_LR, STEPS optimiser
steps, and a reward that varies within a group but does not depend on length:

    rho_one        num_iterations=1: one optimiser step per batch, so rho = 1 exactly
    micro_mean     loss_type="bnpo": each micro-batch divided by its own token count
    low_temp       sampling temperature 0.05: a policy that samples (almost) one answer
    big_lr         learning rate x10
    stuck          a reward equal for every completion: every group has zero spread
    length         a reward that pays for every word: lengths grow
    ends_stuck     the healthy reward until step ENDS_STUCK_AT, then one reward for every
                   completion: the run ends with every group flat (SHORT_STEPS steps)
    dropout        a tiny GPT-2 with dropout 0.1 and TRL's default disable_dropout=False: the
                   forward that computes pi_old and the loss's differ, so rho != 1 before any
                   update (SHORT_STEPS steps); `no_dropout` is the same GPT-2 with
                   disable_dropout=True, its negative control

Three captures are injected into a copy of the healthy capture rather than trained, and the
capture says so in its settings (`injected`): `mismatch` (sampler log-probs = log pi_old plus
noise of 0.5 nats: without vLLM TRL has no sampler log-probs), its negative control
`sampler_ok` (noise of 0.02 nats, as close as engines in good agreement), and `blowup` (one
response per step of A < 0 multiplied by 40 on every token). Every run is written to
OUT_DIR/<name>/.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

STEPS = 16
#: the added runs are short: their faults show from the first steps
SHORT_STEPS = 8
ENDS_STUCK_AT = 4
HEALTHY_LR = 2e-3
PEAK = 10.0
DROPOUT = 0.1
#: the tiny GPT-2's healthy learning rate (its first Adam step moves it more than the Llama's)
GPT2_LR = 1e-3


def reward_clean(completions, **kwargs):
    """The share of words that are not 'a': varies within a group, blind to length."""
    return [1.0 - c.split().count("a") / max(len(c.split()), 1) for c in completions]


def reward_flat(completions, **kwargs):
    return [1.0 for _ in completions]


def reward_length(completions, **kwargs):
    return [float(len(c.split())) for c in completions]


def reward_ends_flat(completions, trainer_state=None, **kwargs):
    """reward_clean until optimiser step ENDS_STUCK_AT, then 1 for every completion."""
    if trainer_state is not None and trainer_state.global_step >= ENDS_STUCK_AT:
        return reward_flat(completions)
    return reward_clean(completions)


def tiny_gpt2(dropout):
    """A one-layer GPT-2 on the tiny tokenizer's words, with dropout `dropout` everywhere."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.trl_run import WORDS

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(WORDS), n_embd=16, n_layer=1, n_head=2, n_positions=64,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=False)
    return GPT2LMHeadModel(cfg)


#: name -> (GRPOConfig overrides, reward function)
TRAINED = {
    "healthy": ({}, reward_clean),
    "rho_one": ({"num_iterations": 1}, reward_clean),
    "micro_mean": ({"loss_type": "bnpo"}, reward_clean),
    "low_temp": ({"temperature": 0.05}, reward_clean),
    "big_lr": ({"learning_rate": 10 * HEALTHY_LR}, reward_clean),
    "stuck": ({}, reward_flat),
    "length": ({}, reward_length),
    "ends_stuck": ({"max_steps": SHORT_STEPS}, reward_ends_flat),
    "dropout": ({"max_steps": SHORT_STEPS, "disable_dropout": False,
                 "learning_rate": GPT2_LR}, reward_clean),
    "no_dropout": ({"max_steps": SHORT_STEPS, "disable_dropout": True,
                    "learning_rate": GPT2_LR}, reward_clean),
}
#: the runs on the tiny GPT-2 (the others: tests/trl_run.py's tiny Llama, which has no dropout)
GPT2 = ("dropout", "no_dropout")
INJECTED = ("mismatch", "sampler_ok", "blowup")
RUNS = (*TRAINED, *INJECTED)


def train(name, out: Path, seed: int):
    from trl import GRPOTrainer

    from rlgates.inspect.capture import capture
    from tests.trl_run import DATA, config, tiny_model, tiny_tokenizer

    cfg, reward = TRAINED[name]
    args = config(**{"output_dir": str(out / "_trainer"), "max_steps": STEPS, "seed": seed,
                     "learning_rate": HEALTHY_LR, "loss_type": "dapo", **cfg})
    torch.manual_seed(seed)
    model = tiny_gpt2(DROPOUT) if name in GPT2 else tiny_model()
    with torch.no_grad():
        # a peaked policy, as a pretrained model's is (entropy about 2.1 nats at temperature 1; 0.4 at 0.1)
        model.lm_head.weight.mul_(PEAK)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=DATA,
                          processing_class=tiny_tokenizer())
    with capture(trainer, out / name, seed=seed):
        trainer.train()


def inject(src: Path, dst: Path, name: str, seed: int):
    """A copy of the capture at `src` with one fault written into its arrays."""
    rng = np.random.default_rng(seed)
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("step_*.npz")):
        data = dict(np.load(f, allow_pickle=False))
        settings = json.loads(str(data["settings"]))
        if name in ("mismatch", "sampler_ok"):
            sd = 0.5 if name == "mismatch" else 0.02
            old = data["token/logp_old"]
            data["token/logp_sampler"] = (old + rng.normal(0, sd, old.shape)).astype(np.float32)
            settings["injected"] = f"logp_sampler = logp_old + N(0, {sd}^2)"
        else:
            seq, tok = data["sequence/advantage"], data["token/advantage"]
            neg = np.flatnonzero(seq < 0)
            if len(neg):
                i = rng.choice(neg)
                micro, row = data["sequence/micro"][i], data["sequence/row"][i]
                seq[i] *= 40
                at = (data["token/micro"] == micro) & (data["token/row"] == row)
                tok[at] *= 40
            settings["injected"] = "one A < 0 response per step: A x 40"
        data["settings"] = np.asarray(json.dumps(settings))
        np.savez_compressed(dst / f.name, **data)


def make_all(out: Path, seed: int = 0, names=RUNS) -> dict:
    """Every run of `names` under out/<name>/; returns {name: seconds}."""
    torch.set_num_threads(1)
    gc.freeze()
    times = {}
    for name in names:
        t0 = time.perf_counter()
        if name in TRAINED:
            train(name, out, seed)
        else:
            if not (out / "healthy").exists():
                train("healthy", out, seed)
            inject(out / "healthy", out / name, name, seed)
        times[name] = time.perf_counter() - t0
    shutil.rmtree(out / "_trainer", ignore_errors=True)
    return times


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    t = make_all(out, seed)
    print(json.dumps(t), f"total {sum(t.values()):.1f} s")
