"""The fused mixture-of-experts problem (vLLM's fused MoE conventions).

Shape fields:
  M (tokens), E (experts), topk, K (hidden size), N (expert intermediate size
  per tensor-parallel shard), dtype (fp16|bf16|fp32),
  activation: "silu" (default; SiLU-and-mul, gate rows [0, N), up rows [N, 2N),
      what vLLM's tuner runs) or "swiglu_oai" (gpt-oss: gate/up interleaved,
      even rows gate, odd rows up, clamped at 7, biases),
  routing: "random" (default; top-k of seeded random router logits, softmax
      weights over the selected k) or "uniform" (token t goes to experts
      (t * topk + j) % E; balanced load),
  bias: optional bool (default true for swiglu_oai, false for silu).

Weights: w1 [E, 2N, K], w2 [E, K, N], b1 [E, 2N], b2 [E, K].
y[M, K] = sum over the token's experts of weight * (act(x @ w1[e].T + b1[e]) @ w2[e].T + b2[e]).

Routing (topk_ids, topk_weights) is part of the inputs, not of the timed call;
the token-to-expert alignment is part of the timed call, as in vLLM.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tunelab.lazy import torch

from tunelab.dtypes import element_size, torch_dtype
from tunelab.kernels.launch import interpreting

if TYPE_CHECKING:
    from tunelab.protocols import CompilingMethod, Method, ProblemClass, ProblemWithBytesFor, TypedMethod

ACTIVATIONS = ("silu", "swiglu_oai")
ROUTINGS = ("random", "uniform")
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0

# Input scales chosen so that outputs are O(1) and bf16 tolerances of 1e-2 are
# meaningful: gate/up pre-activations have std GATE_STD, each expert's output
# has std about 1 (ACT_RMS is the activation's measured RMS for that std).
GATE_STD = {"silu": 1.0, "swiglu_oai": 2.0}  # 2.0: some values reach the clamp at 7
ACT_RMS = {"silu": 0.60, "swiglu_oai": 3.1}
B1_STD = 0.25
B2_STD = 0.1

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def vllm_default_config(M: int, E: int) -> dict:
    """vLLM's fused-MoE config when no tuned file exists (bf16/fp16)."""
    return {
        "BLOCK_SIZE_M": 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128,
        "BLOCK_SIZE_N": 64 if M <= 64 else 128,
        "BLOCK_SIZE_K": 128 if M <= 64 else 64,
        "GROUP_SIZE_M": 16 if M // E > 128 else 1,
        "num_warps": 4 if M <= 128 else 8,
        "num_stages": 4 if M <= 32 else 3,
    }


class FusedMoE:
    """Problem class: see the module docstring for the shape fields."""

    def __init__(self, shape: dict):
        known = {"M", "E", "topk", "K", "N", "dtype", "activation", "routing", "bias"}
        # Manifests may carry descriptive fields (model name, ...): ignore those.
        self.shape = dict(shape)
        try:
            self.M = int(shape["M"])
            self.E = int(shape["E"])
            self.topk = int(shape["topk"])
            self.K = int(shape["K"])
            self.N = int(shape["N"])
        except KeyError as missing:
            raise ValueError(f"moe shape needs {missing.args[0]!r} (has {sorted(shape)}; known fields {sorted(known)})") from None
        self.dtype_name = shape.get("dtype", "bf16")
        self.dtype = torch_dtype(self.dtype_name)
        self.activation = shape.get("activation", "silu")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; expected one of {list(ACTIVATIONS)}")
        self.routing = shape.get("routing", "random")
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown routing {self.routing!r}; expected one of {list(ROUTINGS)}")
        self.bias = bool(shape.get("bias", self.activation == "swiglu_oai"))
        for name in ("M", "E", "topk", "K", "N"):
            if getattr(self, name) < 1:
                raise ValueError(f"moe shape field {name} must be >= 1, got {getattr(self, name)}")
        if self.topk > self.E:
            raise ValueError(f"topk ({self.topk}) must not exceed E ({self.E})")

    # ---- facts ------------------------------------------------------------

    @property
    def interleaved(self) -> bool:
        return self.activation == "swiglu_oai"

    def flops(self) -> float:
        return 2.0 * self.M * self.topk * (self.K * 2 * self.N + self.N * self.K)

    def expected_distinct_experts(self) -> float:
        """Experts that receive at least one token (expected value for random routing)."""
        if self.routing == "uniform":
            return float(min(self.E, self.M * self.topk))
        return self.E * (1.0 - ((self.E - self.topk) / self.E) ** self.M)

    def expert_bytes(self) -> float:
        """Bytes of one expert's weights (and biases)."""
        params = 2 * self.N * self.K + self.K * self.N
        if self.bias:
            params += 2 * self.N + self.K
        return float(params * element_size(self.dtype_name))

    def bandwidth_bound_bytes(self) -> float:
        """Bytes a bandwidth-bound kernel must move: each distinct selected
        expert's weights once, plus the activations in and out."""
        es = element_size(self.dtype_name)
        return self.expected_distinct_experts() * self.expert_bytes() + 2.0 * self.M * self.K * es

    def bytes(self) -> float:
        return self.bandwidth_bound_bytes()

    def bytes_for(self, inputs: dict) -> float:
        """Bytes a bandwidth-bound kernel must move for these inputs: the experts
        this routing actually selects. The expected count can be off by several
        percent at a given seed (M=4, E=128: 16 selected, 15.27 expected), which
        would misstate the % of the bound by as much."""
        distinct = int(torch.unique(inputs["topk_ids"]).numel())
        return distinct * self.expert_bytes() + 2.0 * self.M * self.K * element_size(self.dtype_name)

    def bound_us(self, bytes_per_second: float) -> float:
        """Time the bandwidth-bound bytes take at `bytes_per_second`, in microseconds."""
        return self.bandwidth_bound_bytes() / bytes_per_second * 1e6

    # ---- data -------------------------------------------------------------

    def inputs(self, seed: int, device) -> dict:
        device = torch.device(device)
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        dt = self.dtype
        M, E, topk, K, N = self.M, self.E, self.topk, self.K, self.N

        def randn(*shape, std=1.0):
            t = torch.randn(*shape, generator=gen, device=device, dtype=dt)
            return t.mul_(std) if std != 1.0 else t

        x = randn(M, K)
        w1 = randn(E, 2 * N, K, std=GATE_STD[self.activation] / math.sqrt(K))
        w2 = randn(E, K, N, std=1.0 / (math.sqrt(N) * ACT_RMS[self.activation]))
        logits = torch.randn(M, E, generator=gen, device=device, dtype=torch.float32)
        if self.routing == "random":
            top_vals, topk_ids = torch.topk(logits, topk, dim=1)
        else:
            t = torch.arange(M, device=device, dtype=torch.int64)[:, None]
            j = torch.arange(topk, device=device, dtype=torch.int64)[None, :]
            topk_ids = (t * topk + j) % E
            top_vals = torch.gather(logits, 1, topk_ids)
        topk_weights = torch.softmax(top_vals, dim=1).contiguous()
        out = {
            "x": x,
            "w1": w1,
            "w2": w2,
            "topk_ids": topk_ids.to(torch.int32).contiguous(),
            "topk_weights": topk_weights,
        }
        if self.bias:
            out["b1"] = randn(E, 2 * N, std=B1_STD * GATE_STD[self.activation])
            out["b2"] = randn(E, K, std=B2_STD)
        return out

    def split_gate_up(self, h: torch.Tensor):
        """(gate, up) of the first GEMM's output [rows, 2N] under this shape's convention."""
        if self.interleaved:
            return h[:, 0::2], h[:, 1::2]
        return h[:, : self.N], h[:, self.N :]

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.split_gate_up(h)
        if self.activation == "silu":
            return torch.nn.functional.silu(gate) * up
        gate = gate.clamp(max=SWIGLU_LIMIT)
        up = up.clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
        return (up + 1) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)

    def reference(self, inputs: dict) -> torch.Tensor:
        prev = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # no TF32 in the reference
        try:
            return self._reference(inputs)
        finally:
            torch.set_float32_matmul_precision(prev)

    def _reference(self, inputs: dict) -> torch.Tensor:
        x = inputs["x"].float()
        ids = inputs["topk_ids"].reshape(-1).long()
        wts = inputs["topk_weights"].reshape(-1).float()
        tokens = torch.arange(self.M, device=x.device).repeat_interleave(self.topk)
        out = torch.zeros(self.M, self.K, dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():
            sel = (ids == e).nonzero().squeeze(1)
            tok = tokens[sel]
            h = x[tok] @ inputs["w1"][e].float().T
            if self.bias:
                h += inputs["b1"][e].float()
            y = self.activate(h) @ inputs["w2"][e].float().T
            if self.bias:
                y += inputs["b2"][e].float()
            out.index_add_(0, tok, y * wts[sel, None])
        return out.to(self.dtype)

    def methods(self) -> dict[str, Method[FusedMoE]]:
        return {"fused_moe": TritonFusedMoE(), "torch": TorchMoE()}


class TritonFusedMoE:
    """Our Triton fused MoE (tunelab.kernels.fused_moe), vLLM-style config."""

    name = "fused_moe"
    kind = "triton"
    config_keys = CONFIG_KEYS
    config_types = {key: int for key in CONFIG_KEYS}

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        from tunelab.kernels.fused_moe import FusedMoELaunch, make_plan

        plan = make_plan(problem, _full_config(problem, config))
        return FusedMoELaunch(plan, inputs)

    def compile(self, problem: FusedMoE, config: dict) -> bool:
        """Compile the four kernels for this shape and config without launching.

        Needs no GPU: a compile worker runs with none visible (see tunelab.target).
        Returns False in interpreter mode, where nothing is compiled ahead."""
        if interpreting():
            return False
        from tunelab.kernels.fused_moe import compile_plan, make_plan

        compile_plan(make_plan(problem, _full_config(problem, config)))
        return True


def _full_config(problem: FusedMoE, config: dict) -> dict:
    full = vllm_default_config(problem.M, problem.E)
    full.update({k: config[k] for k in CONFIG_KEYS if k in config})
    return full


class TorchMoE:
    """Untuned torch: per-expert index_select, matmuls in the problem's dtype, index_add."""

    name = "torch"
    kind = "torch"
    config_keys = ()
    config_types: dict = {}

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        return _TorchLaunch(problem, inputs)


class _TorchLaunch:
    def __init__(self, problem: FusedMoE, inputs: dict):
        self.p = problem
        self.inputs = inputs
        x = inputs["x"]
        self.out = torch.empty(problem.M, problem.K, dtype=problem.dtype, device=x.device)
        self.acc = torch.empty(problem.M, problem.K, dtype=torch.float32, device=x.device)

    def __call__(self):
        p, inp = self.p, self.inputs
        ids = inp["topk_ids"].reshape(-1).long()
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=p.E).tolist()  # one host sync
        tok_sorted = order // p.topk
        w_sorted = inp["topk_weights"].reshape(-1)[order]
        self.acc.zero_()
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            tok = tok_sorted[start : start + c]
            h = inp["x"].index_select(0, tok) @ inp["w1"][e].T
            if p.bias:
                h += inp["b1"][e]
            y = p.activate(h) @ inp["w2"][e].T
            if p.bias:
                y += inp["b2"][e]
            self.acc.index_add_(0, tok, y.float() * w_sorted[start : start + c, None])
            start += c
        self.out.copy_(self.acc)


if TYPE_CHECKING:
    # The contract of tunelab.protocols, checked by mypy (`just typecheck`).
    _problem: ProblemClass = FusedMoE
    _bytes_for: type[ProblemWithBytesFor] = FusedMoE
    _fused: CompilingMethod[FusedMoE] = TritonFusedMoE()
    _fused_typed: TypedMethod[FusedMoE] = TritonFusedMoE()
    _torch: TypedMethod[FusedMoE] = TorchMoE()
