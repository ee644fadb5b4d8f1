"""The lab's task: repeat the prompt's motif; a verifiable, sequence-level reward."""

from __future__ import annotations

import torch


class PatternTask:
    """Repeat the prompt's motif. A verifiable, sequence-level reward with rare useful tokens.

    A prompt is a motif (m_0, …, m_{k-1}); the right response is m_0 m_1 … m_{k-1} m_0 … (T tokens).
    Motif token j is drawn from the common half of the vocabulary when j is even and from the rare
    half when j is odd (never the end token). The reward of a response is the share of the T
    positions that hold the right token before the response ends; it is 1 only for the whole
    pattern, and every rare token the policy learns to emit earns credit. A response ends at its
    first end token (the positions after it count as wrong), so lengths vary.

    Every method accepts leading dimensions (the lab's runs dimension): tokens [..., T].
    """

    def __init__(self, vocab=16, length=8, motif=2, eos=3, rare_tokens=2):
        if vocab < 6:
            raise ValueError(f"vocab must be ≥ 6, got {vocab}")
        if eos is not None and not 0 <= eos < vocab:
            raise ValueError(f"eos must be a token in [0, {vocab}), got {eos}")
        self.vocab, self.length, self.motif, self.eos = vocab, length, motif, eos
        half = vocab // 2
        common = [t for t in range(half) if t != eos]
        rare = [t for t in range(half, vocab) if t != eos]
        if rare_tokens:
            rare = rare[-rare_tokens:]
        self.common = torch.tensor(common)
        self.rare = torch.tensor(rare)

    def prompts(self, n, generator=None, device="cpu"):
        """n random motifs: LongTensor [n, motif]."""
        cols = []
        for j in range(self.motif):
            pool = (self.common if j % 2 == 0 else self.rare).to(device)
            idx = torch.randint(len(pool), (n,), generator=generator, device=device)
            cols.append(pool[idx])
        return torch.stack(cols, 1)

    def target(self, prompts):
        """The right response for each prompt: [..., T]."""
        reps = -(-self.length // self.motif)
        return prompts.repeat(*[1] * (prompts.dim() - 1), reps)[..., : self.length]

    def mask(self, tokens):
        """True up to and including the first end token: the tokens the response really has."""
        if self.eos is None:
            return torch.ones_like(tokens, dtype=torch.bool)
        end = (tokens == self.eos).long()
        return end.cumsum(-1) - end == 0

    def right(self, prompts, tokens):
        """[..., T] bool: position t holds the right token and the response has not ended."""
        return (tokens == self.target(prompts)) & self.mask(tokens)

    def reward(self, prompts, tokens):
        """Share of the T positions answered right before the response ends: [...] in [0, 1]."""
        return self.right(prompts, tokens).float().mean(-1)

    def rare_positions(self):
        """[T] bool: the positions whose right token comes from the rare half (odd motif slots)."""
        return torch.arange(self.length) % self.motif % 2 == 1
