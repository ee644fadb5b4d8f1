"""Throughput of the training lab (rlgates.lab): sampling and updates, in tokens per second.

    python benchmarks/lab_throughput.py          # prints it for the CPU, and for CUDA if present

`lab_throughput(device)` uses the lab's own configuration for that device
(`LabConfig.for_device`), so the numbers describe what chapters 10 and 11 run.
"""

from __future__ import annotations

import time

import torch

from rlgates import lab


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def lab_throughput(device="cpu", repeats: int = 5, method: str = "dapo") -> dict:
    """Tokens per second for rollouts (sampling) and for updates (forward, loss, backward, Adam),
    plus whole training steps, with the lab's configuration for `device`."""
    dev = torch.device(device)
    cfg = lab.LabConfig.for_device(dev)
    threads = torch.get_num_threads()
    if cfg.threads and dev.type == "cpu":
        torch.set_num_threads(cfg.threads)
    try:
        torch.manual_seed(0)
        policy = cfg.policy().to(dev)
        task = cfg.task()
        g = torch.Generator(device=dev).manual_seed(0)
        prompts = task.prompts(cfg.prompts, g, dev).repeat_interleave(cfg.group, 0)
        m = lab.resolve(method)
        opt = lab._Adam(policy.parameters(), lr=cfg.lr)
        tokens, logp_old = policy.sample(cfg.batch, cfg.length, prompt=prompts, generator=g)
        adv = torch.randn(cfg.batch, device=dev)
        mask = task.mask(tokens)

        def rollout():
            policy.sample(cfg.batch, cfg.length, prompt=prompts, generator=g)

        def update():
            loss = m.loss(policy.log_probs(tokens, prompts), logp_old, adv, mask, "token-mean")
            opt.zero_grad()
            loss.backward()
            opt.step()

        def best_of(fn):
            fn()  # warm-up
            times = []
            for _ in range(repeats):
                _sync(dev)
                t0 = time.perf_counter()
                fn()
                _sync(dev)
                times.append(time.perf_counter() - t0)
            return min(times)

        n_tokens = cfg.batch * cfg.length
        t_roll, t_upd = best_of(rollout), best_of(update)
        steps = 3
        t0 = time.perf_counter()
        lab.train(method, cfg, seed=0, steps=steps, progress=False)
        _sync(dev)
        t_train = (time.perf_counter() - t0) / steps
    finally:
        torch.set_num_threads(threads)
    return {
        "device": str(dev),
        "batch_tokens": n_tokens,
        "rollout_tokens_per_s": n_tokens / t_roll,
        "update_tokens_per_s": n_tokens / t_upd,
        "train_step_s": t_train,
        "updates_per_step": cfg.minibatches * cfg.epochs,
    }


def main():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        r = lab_throughput(d)
        print(f"lab throughput on {r['device']}: "
              f"rollout {r['rollout_tokens_per_s']:,.0f} tokens/s, "
              f"update {r['update_tokens_per_s']:,.0f} tokens/s "
              f"({r['batch_tokens']} tokens a batch; one training step with "
              f"{r['updates_per_step']} updates: {r['train_step_s'] * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
