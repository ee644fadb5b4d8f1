"""A tiny mixture-of-experts policy, its routing, and routing replay (chapter 20).

`MoEPolicy` is the lab's policy (`rlgates.LabPolicy`) with its MLP body replaced by `layers`
mixture-of-experts layers: a linear router scores `experts` small experts for each token, the
top-k are kept, and their outputs are mixed with the softmax of the kept scores (Mixtral's
rule). Every forward pass can **replay** a given routing: the expert choices are taken as
given, and the gate weights are still the softmax of the current router's scores at those
experts, as verl's router replay does (`scores.gather(1, indices)` in its Megatron patch).

Two ways the routing of one token can differ between the two passes that make a ratio:

* **drift** (GSPO's MoE argument, Zheng et al. 2025, arXiv:2507.18071, §5.3): the trainer's
  policy after an update routes a token of the rollout to other experts than π_old did;
* **mismatch** (Ma et al. 2025, arXiv:2510.11370): the sampling engine routes a token to other
  experts than the trainer does with the same weights, from different arithmetic.

verl names the fixes `router_replay.mode`: "R2" records the routing in the trainer's
recomputation of π_old and replays it in the updates (drift); "R3" records the engine's
routing at sampling and replays it in the recomputation and in the updates (mismatch and
drift). `MoEConfig` sets them for the lab (`LabConfig(moe=MoEConfig(...))`).

Routing tensors are LongTensor [R, B, T, layers, top_k] (or [B, T, layers, top_k] for a single
run): the experts each token used in each layer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from .policy import LabPolicy

#: The lab's `router_replay` modes, spelled as verl's `router_replay.mode`.
REPLAY_MODES = ("disabled", "R2", "R3")
#: The lab's sampling engines: the trainer's own computation, the weights rounded to bfloat16,
#: or Gaussian noise on the router's scores when it picks experts.
ENGINES = ("trainer", "bf16", "noise")
_NOISE_SEED = 5_555_555  # offsets a run's seed for its engine's router-noise generator
_EXPERT_SEED = 3_333_333  # offsets a run's seed for its router and experts' initial weights

#: The per-step numbers a lab run with `LabConfig.moe` adds to its metrics.
MOE_METRICS = {
    "routing_drift": "share of the experts the router picks in the update passes that differ "
                     "from π_old's picks for the same token (real tokens; replay or not)",
    "routing_mismatch": "share of the experts the engine used at sampling that differ from the "
                        "trainer's picks with the same weights at the start of the step",
}


@dataclass(frozen=True)
class MoEConfig:
    """The lab's mixture of experts: sizes, router replay and the sampling engine.

    experts, top_k, layers: experts per layer, experts kept per token, MoE layers.
    router_replay: "disabled", "R2" (replay π_old's routing, recorded when the trainer
        recomputes π_old: needs `anchor="proximal"`, as verl's R2 needs bypass_mode=False) or
        "R3" (replay the engine's routing in the recomputation and in every update).
    engine: "trainer" (the rollout is sampled by the trainer's computation), "bf16" (the
        weights rounded to bfloat16, arithmetic in float32) or "noise" (N(0, router_noise²)
        added to each router score when the engine picks its experts; the mixing weights are
        the noiseless scores', so with the same routing the engine's output is the trainer's).
    """

    experts: int = 4
    top_k: int = 2
    layers: int = 2
    router_replay: str = "disabled"
    engine: str = "trainer"
    router_noise: float = 0.0

    def __post_init__(self):
        for name in ("experts", "top_k", "layers"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive integer, got {value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k must be ≤ experts ({self.experts}), "
                             f"got {self.top_k}")
        if self.router_replay not in REPLAY_MODES:
            raise ValueError(f"MoEConfig.router_replay must be one of {REPLAY_MODES}, "
                             f"got {self.router_replay!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"MoEConfig.engine must be one of {ENGINES}, got {self.engine!r}")
        if not self.router_noise >= 0:
            raise ValueError(f"MoEConfig.router_noise must be ≥ 0, got {self.router_noise!r}")
        if self.router_noise and self.engine != "noise":
            raise ValueError("MoEConfig.router_noise needs engine='noise', "
                             f"got engine={self.engine!r}")

    def replace(self, **changes) -> MoEConfig:
        from dataclasses import replace
        return replace(self, **changes)


class MoEPolicy(LabPolicy):
    """`LabPolicy` with a mixture-of-experts body: R runs, `layers` top-k MoE layers.

    Layer l maps h to tanh(Σ_{e ∈ K} g_e (h W_e + b_e)), with router scores z = h W_router,
    K the top_k experts by z (or the replayed ones) and g = softmax(z restricted to K). The body
    is tanh(x) then the layers; with experts = top_k = layers = 1 it is LabPolicy's body.
    Routing is decided per token, so a [R, B, T] forward pass routes exactly as sampling did
    up to float rounding (the two add the context in different orders).

    `logits`, `log_probs`, `features` and `sample` keep LabPolicy's interface; `logits`,
    `log_probs` and `routed_logits` take `routing=` to replay, `sample` takes
    `return_routing=True` to record, and `routing(prompt, response)` is the router's own pick.
    """

    records_routing = True

    def __init__(self, seeds=(0,), vocab=16, hidden=32, length=8, motif=2, zipf=1.0,
                 experts=4, top_k=2, layers=2):
        MoEConfig(experts, top_k, layers)  # validates the sizes
        super().__init__(seeds, vocab, hidden, length, motif, zipf)
        del self.w_body, self.b_body  # the experts replace the dense MLP layer
        self.experts, self.top_k, self.layers = int(experts), int(top_k), int(layers)
        runs = [self._one_moe(s, hidden, self.experts, self.layers) for s in self.seeds]
        for name in runs[0]:
            setattr(self, name, nn.Parameter(torch.stack([r[name] for r in runs])))
        self.router_noise = 0.0  # an engine's noise on its picks (`lab_engine`)
        self.noise_generators = None
        self._recording = None  # routing of each sampling step, while `sample` records

    @staticmethod
    def _one_moe(seed, hidden, experts, layers):
        """One run's router and expert weights, torch's default initialisers under its seed."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + _EXPERT_SEED)
            routers = [nn.Linear(hidden, experts) for _ in range(layers)]
            mlps = [[nn.Linear(hidden, hidden) for _ in range(experts)] for _ in range(layers)]
        return {"w_router": torch.stack([r.weight.T for r in routers]),  # [L, H, E]
                "b_router": torch.stack([r.bias for r in routers]),  # [L, E]
                "w_expert": torch.stack([torch.stack([m.weight.T for m in row])
                                         for row in mlps]),  # [L, E, H, H]
                "b_expert": torch.stack([torch.stack([m.bias for m in row])
                                         for row in mlps])}  # [L, E, H]

    def _moe(self, x, routing=None, noise=None):
        """The body on x [R, ..., H]: (h [R, ..., H], used [R, ..., L, k], own [R, ..., L, k]).

        own: the router's pick in this pass (with the engine's `noise` [R, ..., L, E] on its
        scores, if any); used: `routing` if given (replay), else own."""
        h = torch.tanh(x)
        lead = h.shape[1:-1]
        used, own = [], []
        for layer in range(self.layers):
            scores = self._linear(h, self.w_router[:, layer], self.b_router[:, layer])
            noisy = scores if noise is None else scores + noise[..., layer, :]
            pick = noisy.topk(self.top_k, dim=-1).indices
            idx = pick if routing is None else routing[..., layer, :]
            gates = torch.softmax(scores.gather(-1, idx), dim=-1)  # [R, ..., k]
            R, E, H = h.shape[0], self.experts, h.shape[-1]
            flat = h.reshape(R, -1, H)  # every expert on every token: small E, small H
            out = torch.einsum("rnh,reho->rneo", flat, self.w_expert[:, layer])
            out = (out + self.b_expert[:, layer, None]).reshape(R, *lead, E, H)
            chosen = out.gather(-2, idx[..., None].expand(*idx.shape, H))
            h = torch.tanh((gates[..., None] * chosen).sum(-2))
            used.append(idx)
            own.append(pick)
        return h, torch.stack(used, -2), torch.stack(own, -2)

    def _body(self, x):
        """The router's own routing, with the engine's noise while sampling (LabPolicy's hook)."""
        noise = None
        if self._recording is not None and self._noise is not None:
            noise = self._noise[:, :, len(self._recording)]
        h, used, _ = self._moe(x, noise=noise)
        if self._recording is not None:
            self._recording.append(used)
        return h

    def _check_routing(self, routing, response):
        want = (*response.shape, self.layers, self.top_k)
        if routing.shape != want:
            raise ValueError(f"routing must have shape {want} (response shape, layers, "
                             f"top_k), got {tuple(routing.shape)}")
        if routing.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"routing must hold expert indices (int64), got {routing.dtype}")
        if routing.numel() and (routing.min() < 0 or routing.max() >= self.experts):
            raise ValueError(f"routing indices must be in [0, {self.experts}), got "
                             f"[{int(routing.min())}, {int(routing.max())}]")
        if routing.shape[-1] > 1:
            srt = routing.sort(-1).values
            if (srt[..., 1:] == srt[..., :-1]).any():
                raise ValueError("routing must name top_k different experts per token and layer")

    def routed_logits(self, prompt, response, routing=None, noise=None):
        """(logits [R, B, T, vocab], own routing [R, B, T, L, k]): the logits with `routing`
        replayed (None: the router's own), and the router's own pick in this pass. A single run
        takes [B, motif] and [B, T] (and [B, T, L, k]) and returns no runs dimension."""
        if response.dim() == 2:
            self._single_run()
            one = (lambda t: None if t is None else t[None])
            logits, own = self.routed_logits(prompt[None], response[None], one(routing),
                                             one(noise))
            return logits[0], own[0]
        if routing is not None:
            self._check_routing(routing, response)
        x = self._inputs(prompt, response)
        h, _, own = self._moe(x, routing, noise)
        return self._linear(h, self.w_head, self.b_head), own

    def features(self, prompt, response, routing=None):
        """The hidden state the LM head reads: [R, B, T, hidden] (or [B, T, hidden])."""
        if response.dim() == 2:
            self._single_run()
            rt = None if routing is None else routing[None]
            return self.features(prompt[None], response[None], rt)[0]
        if routing is not None:
            self._check_routing(routing, response)
        return self._moe(self._inputs(prompt, response), routing)[0]

    def logits(self, prompt, response, routing=None):
        """Next-token logits [R, B, T, vocab] (or [B, T, vocab]), `routing` replayed if given."""
        return self.routed_logits(prompt, response, routing)[0]

    def log_probs(self, response, prompt, routing=None):
        """log π(y_t | prompt, y_<t): [R, B, T] (or [B, T]), `routing` replayed if given."""
        logp = torch.log_softmax(self.logits(prompt, response, routing), dim=-1)
        return logp.gather(-1, response[..., None]).squeeze(-1)

    @torch.no_grad()
    def routing(self, prompt, response):
        """The router's own pick for every response token: [R, B, T, L, k] (or [B, T, L, k])."""
        return self.routed_logits(prompt, response)[1]

    @torch.no_grad()
    def sample(self, prompt, length, generators, return_routing=False):
        """LabPolicy.sample; with return_routing=True also the routing each token was sampled
        with, [R, B, length, L, k]. An engine's router noise (`router_noise`, run r's from
        noise_generators[r]) perturbs the picks only."""
        R, B = prompt.shape[:2]
        self._noise = None
        if self.router_noise:
            self._noise = self.router_noise * torch.stack([
                torch.randn(B, length, self.layers, self.experts, generator=g, device=g.device,
                            dtype=self.b_head.dtype) for g in self.noise_generators])
        self._recording = []
        try:
            tokens, logp = super().sample(prompt, length, generators)
        finally:
            steps, self._recording, self._noise = self._recording, None, None
        return (tokens, logp, torch.stack(steps, 2)) if return_routing else (tokens, logp)

    _noise = None


def _share(flags, mask):
    """Mean of per-token `flags` [..., B, T] over the real tokens (mask), per leading index."""
    if mask is None:
        mask = torch.ones_like(flags, dtype=torch.bool)
    w = mask.to(flags.dtype)
    return (flags * w).sum((-2, -1)) / w.sum((-2, -1)).clamp(min=1)


def _kept(routing, reference):
    if routing.shape != reference.shape:
        raise ValueError(f"routing {tuple(routing.shape)} and reference "
                         f"{tuple(reference.shape)} must have the same shape")
    return (routing[..., :, None] == reference[..., None, :]).any(-1)  # [..., T, L, k]


def changed_experts(routing, reference, mask=None):
    """Share of the experts in `routing` that are not among `reference`'s for the same token and
    layer (each token's top-k as a set: order does not count), over the real tokens.

    routing, reference [..., B, T, L, k]; mask [..., B, T]. Returns [...] (a run's share per
    leading index, as the diagnostics reduce the last two dims): 0 when every token used the
    same experts, 1 when none was shared."""
    return _share(1 - _kept(routing, reference).double().mean((-1, -2)), mask)


def tokens_rerouted(routing, reference, mask=None):
    """Share of the real tokens with a different expert set in at least one layer: [...]."""
    return _share((~_kept(routing, reference)).any(-1).any(-1).double(), mask)


def lab_policy(cfg, seeds):
    """The lab's MoEPolicy for a LabConfig with `moe` set (`LabConfig.policy`)."""
    m = cfg.moe
    pol = MoEPolicy(seeds, cfg.vocab, cfg.hidden, cfg.length, cfg.motif, experts=m.experts,
                    top_k=m.top_k, layers=m.layers)
    return pol.to(getattr(torch, cfg.dtype))


class LabRouting:
    """What the lab's loop does for a MoE policy (`LabConfig.moe`), step by step.

    - `engine(source)`: the policy that samples the rollout: `source` itself (engine
      "trainer"), or a copy of it with bfloat16-rounded weights or router noise;
    - `start(policy, batch)`: at the start of the step, the trainer's own routing on the rollout
      (π_old's) and the routing to replay in the updates (None, π_old's for R2, the engine's
      for R3); returns the routing π_old is recomputed with;
    - `logits(policy, prompts, tokens, rows)`: the update pass, replaying where asked, and the
      router's own picks against π_old's (routing_drift);
    - `metrics(idx)`: the step's MOE_METRICS per run.
    """

    def __init__(self, cfg, seeds, dev, anchors=None):
        self.cfg, self.moe = cfg, cfg.moe
        if self.moe.router_replay == "R2" and set(anchors or {cfg.anchor}) != {"proximal"}:
            raise ValueError("router_replay='R2' records π_old's routing while the trainer "
                             "recomputes π_old: it needs anchor='proximal' (verl: R2 needs "
                             "rollout_correction.bypass_mode=False)")
        self._engine = None
        if self.moe.engine != "trainer":
            self._engine = lab_policy(cfg, seeds).to(dev).requires_grad_(False)
            if self.moe.engine == "noise":
                self._engine.router_noise = self.moe.router_noise
                self._engine.noise_generators = [
                    torch.Generator(device=dev).manual_seed(s + _NOISE_SEED) for s in seeds]

    @torch.no_grad()
    def engine(self, source):
        if self._engine is None:
            return source
        state = source.state_dict()
        if self.moe.engine == "bf16":
            state = {k: v.to(torch.bfloat16).to(v.dtype) for k, v in state.items()}
        self._engine.load_state_dict(state)
        return self._engine

    @torch.no_grad()
    def start(self, policy, batch):
        self.old = policy.routing(batch.prompts, batch.tokens)  # π_old's own routing
        self.mismatch = changed_experts(batch.routing, self.old, batch.mask)
        mode = self.moe.router_replay
        self.replay = {"disabled": None, "R2": self.old, "R3": batch.routing}[mode]
        self.drift = []
        return batch.routing if mode == "R3" else None

    def logits(self, policy, prompts, tokens, runs, idx, mask):
        replay = None if self.replay is None else self.replay[runs, idx]
        logits, own = policy.routed_logits(prompts, tokens, replay)
        self.drift.append((changed_experts(own, self.old[runs, idx], mask),
                           mask.sum((1, 2)).double()))
        return logits

    def metrics(self):
        drift = torch.stack([d for d, _ in self.drift], 1)
        weight = torch.stack([w for _, w in self.drift], 1)
        return {"routing_drift": ((drift * weight).sum(1) / weight.sum(1)).cpu(),
                "routing_mismatch": self.mismatch.cpu()}


def engine_log_probs(policy, tokens, prompt, engine="bf16", router_noise=0.0, generator=None):
    """An engine's teacher-forced log π and routing for `tokens`: (logp, routing).

    engine "trainer": the policy itself; "bf16": the policy's weights rounded to bfloat16,
    arithmetic in float32; "noise": N(0, router_noise²) on the router's scores when it picks
    (drawn from `generator`), the mixing weights from the noiseless scores."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "noise" and not router_noise > 0:
        raise ValueError(f"engine='noise' needs router_noise > 0, got {router_noise!r}")
    with torch.no_grad():
        eng, noise = policy, None
        if engine == "bf16":
            eng = copy.deepcopy(policy)
            for p in eng.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
        if engine == "noise":
            shape = (*tokens.shape, policy.layers, policy.experts)
            noise = router_noise * torch.randn(shape, generator=generator,
                                               device=tokens.device, dtype=policy.b_head.dtype)
        logits, own = eng.routed_logits(prompt, tokens, noise=noise)
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    return logp, own




__all__ = ["ENGINES", "MOE_METRICS", "REPLAY_MODES", "LabRouting", "MoEConfig", "MoEPolicy",
           "changed_experts", "engine_log_probs", "lab_policy",
           "tokens_rerouted"]
