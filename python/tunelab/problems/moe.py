"""The fused mixture-of-experts problem (vLLM's fused MoE conventions).

Shape fields:
  M (tokens), E (experts), topk, K (hidden size), N (expert intermediate size
  per tensor-parallel shard),
  dtype: fp16|bf16|fp32 (weights and activations), or a quantised weight
      format (docs/quantisation.md):
      "fp8": fp8 w8a8, E4M3 weights and activations; the activations are
          quantised inside the call from `act_dtype`;
      "mxfp4": MXFP4 weights (gpt-oss's format), `act_dtype` activations;
  act_dtype: for fp8 and mxfp4, the dtype of x, the intermediate before
      quantisation and the output (bf16, the default, or fp16; fp32 too for fp8);
  weight_quant: for fp8, "per_tensor" (default: one fp32 scale per expert and
      weight; activations get one scale per token) or "block" (one scale per
      block_shape tile; activations one per 1 x block_k block of a token);
  block_shape: [block_n, block_k] of "block" weights (block_k a power of two),
  activation: "silu" (default; SiLU-and-mul, gate rows [0, N), up rows [N, 2N),
      what vLLM's tuner runs) or "swiglu_oai" (gpt-oss: gate/up interleaved,
      even rows gate, odd rows up, clamped at 7, biases),
  routing: "random" (default; top-k of seeded random router logits, softmax
      weights over the selected k) or "uniform" (token t goes to experts
      (t * topk + j) % E; balanced load),
  bias: optional bool (default true for swiglu_oai, false for silu).

Weights: w1 [E, 2N, K], w2 [E, K, N], b1 [E, 2N], b2 [E, K].
y[M, K] = sum over the token's experts of weight * (act(x @ w1[e].T + b1[e]) @ w2[e].T + b2[e]).
Quantised: w1/w2 hold the quantised values (fp8 [E, rows, cols]; MXFP4 packed
uint8 [E, rows, cols padded to 32 / 2]) and w1_scale/w2_scale their scales
(tunelab.quant); the reference uses the dequantised weights and quantises the
activations as the kernels do (fp8), rounding the intermediate to act_dtype
where the kernels store it. MXFP4 inputs also hold w1_pairs and w2_pairs: the
same codes with each 32-bit word's bits in pair order (quant.to_pair_order),
the layout the CUDA C++ one-token kernel decodes in fewer instructions.

Routing (topk_ids, topk_weights) is part of the inputs, not of the timed call;
the token-to-expert alignment is part of the timed call, as in vLLM.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tunelab.lazy import torch

from tunelab import quant
from tunelab.dtypes import element_size, torch_dtype
from tunelab.kernels.launch import interpreting

if TYPE_CHECKING:
    from tunelab.protocols import (
        AvailabilityMethod,
        CompilingMethod,
        Method,
        ProblemClass,
        ProblemWithBytesFor,
        TypedMethod,
    )

ACTIVATIONS = ("silu", "swiglu_oai")
ROUTINGS = ("random", "uniform")
PLAIN_DTYPES = ("fp16", "bf16", "fp32")
WEIGHT_FORMATS = ("fp8", "mxfp4")
WEIGHT_QUANTS = ("per_tensor", "block")
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
# Quantised weights only (tunelab.kernels.quant_moe), config keys of tunelab's call only (vLLM's call,
# fused_moe_vllm, refuses them: vLLM 0.33 sets SWAP_AB itself by its own rule and SPLIT_K to 1):
# DOT_SCALED (MXFP4): 1 runs tl.dot_scaled (Triton's upcast), 0 tunelab's own dequantisation;
# SWAP_AB (fp8 and MXFP4): 1 makes the weights the MMA's left operand (tokens its short side).
# MX_PTX (MXFP4, DOT_SCALED=0, bf16 activations): 1 dequantises with inline PTX, two values an instruction.
# GEMV (MXFP4, BLOCK_SIZE_M 1): 1 computes one token a block on CUDA cores, no MMA (decode sizes);
# 2 the same in packed f16 arithmetic (compute capability 9.0 or newer).
# SPLIT_K (fp8 and MXFP4): K split over this many programs per tile (decode sizes: more programs in flight).
QUANT_KEYS = ("DOT_SCALED", "SWAP_AB", "MX_PTX", "GEMV", "SPLIT_K")


class _WeightCache:
    """Quantised weights by (E, N, K, format, ..., seed, device), least recently
    used first out, at most `limit_bytes` in all (see FusedMoE._weights).

    A tuning run deals its (shape, method) groups largest estimated cost
    first, so shapes of one (E, N) do not come back to back; quantising 128
    experts again for each would cost about as much as timing the group."""

    def __init__(self):
        import collections

        self.entries = collections.OrderedDict()

    @staticmethod
    def nbytes(weights: dict) -> int:
        return sum(t.numel() * t.element_size() for t in weights.values())

    def limit_bytes(self, device) -> int:
        device = torch.device(device)
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).total_memory // 4
        return 2 << 30

    def get(self, key, build, device, size_hint: float) -> dict:
        """The weights under `key`, built by `build()` when missing; older
        entries go first so that they and the new ones (about `size_hint`
        bytes) fit the limit."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        limit = self.limit_bytes(device)
        while self.entries and sum(self.nbytes(w) for w in self.entries.values()) + size_hint > limit:
            self.entries.popitem(last=False)
        weights = build()
        if self.nbytes(weights) <= limit:
            self.entries[key] = weights
        return weights

    def clear(self):
        self.entries.clear()


_WEIGHTS = _WeightCache()


def vllm_default_config(M: int, E: int, block_shape=None, fp8: bool = False) -> dict:
    """vLLM 0.33's fused-MoE config when no tuned file exists
    (`get_default_config`): for bf16/fp16 and per-tensor fp8 the M rule below
    (fp8 takes BLOCK_SIZE_K 128 at every M); for block-quantised fp8 one whose
    K step and, past M=8, N tile are the weights' block (docs/quantisation.md)."""
    if block_shape:
        bn, bk = block_shape
        return {
            "BLOCK_SIZE_M": 16 if M <= 64 else 64,
            "BLOCK_SIZE_N": 64 if M <= 8 else bn,
            "BLOCK_SIZE_K": bk,
            "GROUP_SIZE_M": 1 if M <= 16 else 32,
            "num_warps": 4,
            "num_stages": 4 if M <= 4 else 3,
        }
    return {
        "BLOCK_SIZE_M": 16 if M <= 32 else 32 if M <= 96 else 64 if M <= 512 else 128,
        "BLOCK_SIZE_N": 64 if M <= 64 else 128,
        "BLOCK_SIZE_K": 128 if fp8 or M <= 64 else 64,
        "GROUP_SIZE_M": 16 if M // E > 128 else 1,
        "num_warps": 4 if M <= 128 else 8,
        "num_stages": 4 if M <= 32 else 3,
    }


class FusedMoE:
    """Problem class: see the module docstring for the shape fields."""

    def __init__(self, shape: dict):
        known = {
            "M",
            "E",
            "topk",
            "K",
            "N",
            "dtype",
            "act_dtype",
            "weight_quant",
            "block_shape",
            "activation",
            "routing",
            "bias",
        }
        # Manifests may carry descriptive fields (model name, ...): ignore those.
        self.shape = dict(shape)
        try:
            self.M = int(shape["M"])
            self.E = int(shape["E"])
            self.topk = int(shape["topk"])
            self.K = int(shape["K"])
            self.N = int(shape["N"])
        except KeyError as missing:
            raise ValueError(
                f"moe shape needs {missing.args[0]!r} (has {sorted(shape)}; known fields {sorted(known)})"
            ) from None
        self.dtype_name = shape.get("dtype", "bf16")
        self._weight_fields(shape)
        self.dtype = torch_dtype(self.act_dtype_name)
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

    def _weight_fields(self, shape: dict):
        """weight_format ("plain", "fp8", "mxfp4"), act_dtype_name, weight_quant, block_shape."""
        d = self.dtype_name
        act = shape.get("act_dtype")
        wq = shape.get("weight_quant")
        block = shape.get("block_shape")
        if d in PLAIN_DTYPES:
            self.weight_format = "plain"
            if act is not None and act != d:
                raise ValueError(f"act_dtype ({act}) is for quantised weights; a {d} shape computes in {d}")
            if wq is not None or block is not None:
                raise ValueError(f"weight_quant and block_shape are for fp8 weights, not {d}")
            self.act_dtype_name, self.weight_quant, self.block_shape = d, None, None
            return
        if d not in WEIGHT_FORMATS:
            raise ValueError(f"unknown moe dtype {d!r}; expected one of {list(PLAIN_DTYPES + WEIGHT_FORMATS)}")
        self.weight_format = d
        self.act_dtype_name = act or "bf16"
        allowed = ("bf16", "fp16", "fp32") if d == "fp8" else ("bf16", "fp16")
        if self.act_dtype_name not in allowed:
            raise ValueError(f"act_dtype of {d} weights must be one of {list(allowed)}, got {self.act_dtype_name!r}")
        if d == "mxfp4":
            if wq is not None or block is not None:
                raise ValueError(
                    "mxfp4 weights have their own scales (one per 32 values along K): "
                    "weight_quant and block_shape are for fp8"
                )
            self.weight_quant, self.block_shape = None, None
            return
        self.weight_quant = wq or "per_tensor"
        if self.weight_quant not in WEIGHT_QUANTS:
            raise ValueError(f"weight_quant must be one of {list(WEIGHT_QUANTS)}, got {self.weight_quant!r}")
        if self.weight_quant == "per_tensor":
            if block is not None:
                raise ValueError("block_shape is for weight_quant: block, not per_tensor")
            self.block_shape = None
            return
        if (
            not isinstance(block, (list, tuple))
            or len(block) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)
        ):
            raise ValueError(
                f"weight_quant: block needs block_shape: [block_n, block_k] (positive integers), got {block!r}"
            )
        bn, bk = int(block[0]), int(block[1])
        if bk & (bk - 1):
            raise ValueError(f"block_shape's block_k must be a power of two (the kernels' K steps divide it), got {bk}")
        self.block_shape = (bn, bk)

    @property
    def quantised(self) -> bool:
        return self.weight_format != "plain"

    @property
    def act_group(self) -> int:
        """Activation quantisation group along the reduction axis (fp8): 0 per token, else block_k."""
        return self.block_shape[1] if self.block_shape else 0

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
        """Bytes of one expert's weights (and biases), as stored: fp8 one byte a
        weight plus its fp32 scales, MXFP4 half a byte plus a scale byte per 32
        (0.5 + 1/32 a weight; the zero padding of a reduction axis that is not a
        multiple of 32 is not counted: no kernel needs to read it)."""
        weights = 3 * self.N * self.K
        act_es = element_size(self.act_dtype_name)
        if self.weight_format == "fp8":
            if self.block_shape:
                bn, bk = self.block_shape
                scales = quant.cdiv(2 * self.N, bn) * quant.cdiv(self.K, bk) + quant.cdiv(self.K, bn) * quant.cdiv(
                    self.N, bk
                )
            else:
                scales = 2
            total = weights * 1.0 + scales * 4.0
        elif self.weight_format == "mxfp4":
            total = weights * quant.mxfp4_bytes_per_weight()
        else:
            total = weights * float(act_es)
        if self.bias:
            total += (2 * self.N + self.K) * act_es
        return float(total)

    def bandwidth_bound_bytes(self) -> float:
        """Bytes a bandwidth-bound kernel must move: each distinct selected
        expert's weights once, plus the activations in and out."""
        es = element_size(self.act_dtype_name)
        return self.expected_distinct_experts() * self.expert_bytes() + 2.0 * self.M * self.K * es

    def bytes(self) -> float:
        return self.bandwidth_bound_bytes()

    def bytes_for(self, inputs: dict) -> float:
        """Bytes a bandwidth-bound kernel must move for these inputs: the experts
        this routing actually selects. The expected count can be off by several
        percent at a given seed (M=4, E=128: 16 selected, 15.27 expected), which
        would misstate the % of the bound by as much."""
        distinct = int(torch.unique(inputs["topk_ids"]).numel())
        return distinct * self.expert_bytes() + 2.0 * self.M * self.K * element_size(self.act_dtype_name)

    def bound_us(self, bytes_per_second: float) -> float:
        """Time the bandwidth-bound bytes take at `bytes_per_second`, in microseconds."""
        return self.bandwidth_bound_bytes() / bytes_per_second * 1e6

    # ---- data -------------------------------------------------------------

    def inputs(self, seed: int, device) -> dict:
        if self.quantised:
            return self._quantised_inputs(seed, device)
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

    def _routing(self, gen, device):
        """(topk_ids int32, topk_weights fp32) drawn from `gen`, as `inputs` draws them."""
        M, E, topk = self.M, self.E, self.topk
        logits = torch.randn(M, E, generator=gen, device=device, dtype=torch.float32)
        if self.routing == "random":
            top_vals, topk_ids = torch.topk(logits, topk, dim=1)
        else:
            t = torch.arange(M, device=device, dtype=torch.int64)[:, None]
            j = torch.arange(topk, device=device, dtype=torch.int64)[None, :]
            topk_ids = (t * topk + j) % E
            top_vals = torch.gather(logits, 1, topk_ids)
        return topk_ids.to(torch.int32).contiguous(), torch.softmax(top_vals, dim=1).contiguous()

    def _quantised_inputs(self, seed: int, device) -> dict:
        """x, routing, quantised weights and their scales, biases.

        The weights come from a generator of their own, so they do not depend
        on M: shapes that differ only in M share them, and weights once built
        are kept (`_WeightCache`, a quarter of the GPU's memory at most), which
        saves quantising them again for every M of a tuning run."""
        device = torch.device(device)
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        x = torch.randn(self.M, self.K, generator=gen, device=device, dtype=torch.float32).to(self.dtype)
        topk_ids, topk_weights = self._routing(gen, device)
        return {"x": x, "topk_ids": topk_ids, "topk_weights": topk_weights, **self._weights(seed, device)}

    def _weights_key(self, seed: int, device) -> tuple:
        return (
            self.E,
            self.N,
            self.K,
            self.weight_format,
            self.act_dtype_name,
            self.weight_quant,
            self.block_shape,
            self.activation,
            self.bias,
            int(seed),
            str(device),
        )

    def _weights(self, seed: int, device) -> dict:
        build = lambda: self._build_weights(seed, device)  # noqa: E731
        size = self.E * self.expert_bytes()
        if self.weight_format == "mxfp4":  # the pair-order copies of the codes, rows padded as stored
            size += self.E * (2 * self.N * quant.mx_padded(self.K) + self.K * quant.mx_padded(self.N)) * 0.5
        return dict(_WEIGHTS.get(self._weights_key(seed, device), build, device, size))

    def _build_weights(self, seed: int, device) -> dict:
        """Master weights drawn in fp32 one expert at a time (as `inputs` scales
        them for bf16), each quantised at once, so the fp32 copy of all experts
        never exists."""
        E, N, K = self.E, self.N, self.K
        gen = torch.Generator(device=device)
        gen.manual_seed((int(seed) * 1_000_003 + 0x5EED) % (1 << 63))
        stds = {"w1": GATE_STD[self.activation] / math.sqrt(K), "w2": 1.0 / (math.sqrt(N) * ACT_RMS[self.activation])}
        out = {}
        mxfp4 = self.weight_format == "mxfp4"
        for name, rows, cols in (("w1", 2 * N, K), ("w2", K, N)):
            q_all: Any = None
            s_all: Any = None
            pairs_all: Any = None
            for e in range(E):
                w = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32).mul_(stds[name])
                q, s = self._quantize_weight(w)
                if q_all is None:
                    q_all = torch.empty((E, *q.shape), dtype=q.dtype, device=device)
                    s_all = torch.empty((E, *s.shape), dtype=s.dtype, device=device)
                    if mxfp4:
                        pairs_all = torch.empty_like(q_all)
                q_all[e], s_all[e] = q, s
                if mxfp4:
                    pairs_all[e] = quant.to_pair_order(q)
            out[name], out[name + "_scale"] = q_all, s_all
            if mxfp4:
                out[name + "_pairs"] = pairs_all
        if self.bias:
            out["b1"] = (
                torch.randn(E, 2 * N, generator=gen, device=device, dtype=torch.float32)
                * (B1_STD * GATE_STD[self.activation])
            ).to(self.dtype)
            out["b2"] = (torch.randn(E, K, generator=gen, device=device, dtype=torch.float32) * B2_STD).to(self.dtype)
        return out

    def _quantize_weight(self, w):
        """(values, scales) of one expert's fp32 weight [rows, cols] in this shape's format."""
        if self.weight_format == "mxfp4":
            return quant.quantize_mxfp4(w)
        if self.block_shape:
            return quant.quantize_fp8_block(w, *self.block_shape)
        return quant.quantize_fp8_per_tensor(w)

    def dequantized(self, inputs: dict, name: str, e: int):
        """fp32 weight `name` ("w1" or "w2") of expert e, as the kernels read it."""
        w = inputs[name][e]
        if not self.quantised:
            return w.float()
        s = inputs[name + "_scale"][e]
        if self.weight_format == "mxfp4":
            return quant.dequantize_mxfp4(w, s, self.K if name == "w1" else self.N)
        return quant.dequantize_fp8(w, s, self.block_shape)

    def _quantize_rows(self, a):
        """fp8 activations as the kernels quantise them, back in fp32 (identity for other formats)."""
        if self.weight_format != "fp8":
            return a.float()
        q, s = quant.quantize_act_fp8(a, self.act_group)
        return quant.dequantize_act_fp8(q, s, self.act_group)

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
        if self.quantised:
            return self._quantised_reference(inputs)
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

    def _quantised_reference(self, inputs: dict) -> torch.Tensor:
        """From the dequantised weights; fp8 activations quantised as the kernels
        do (x per token or block, the activated intermediate likewise after
        it is rounded to act_dtype, where the kernels store it)."""
        x = self._quantize_rows(inputs["x"])
        ids = inputs["topk_ids"].reshape(-1).long()
        wts = inputs["topk_weights"].reshape(-1).float()
        tokens = torch.arange(self.M, device=x.device).repeat_interleave(self.topk)
        out = torch.zeros(self.M, self.K, dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():
            sel = (ids == e).nonzero().squeeze(1)
            tok = tokens[sel]
            h = x[tok] @ self.dequantized(inputs, "w1", e).T
            if self.bias:
                h += inputs["b1"][e].float()
            a = self._quantize_rows(self.activate(h).to(self.dtype))
            y = a @ self.dequantized(inputs, "w2", e).T
            if self.bias:
                y += inputs["b2"][e].float()
            out.index_add_(0, tok, y * wts[sel, None])
        return out.to(self.dtype)

    def methods(self) -> dict[str, Method[FusedMoE]]:
        from tunelab.problems.moe_libraries import AiterMoE, VllmMoE
        from tunelab.problems.moe_torch import TorchMoE
        from tunelab.problems.moe_triton_kernels import TritonKernelsMoE

        return {
            "fused_moe": TritonFusedMoE(),
            "fused_moe_vllm": TritonFusedMoEVllm(),
            "fused_moe_persistent": TritonPersistentMoE(),
            "torch": TorchMoE(),
            "vllm": VllmMoE(),
            "aiter": AiterMoE(),
            "triton_kernels": TritonKernelsMoE(),
        }


class TritonFusedMoE:
    """Our Triton fused MoE (tunelab.kernels.fused_moe; quantised weights:
    tunelab.kernels.quant_moe), vLLM-style config."""

    name = "fused_moe"
    kind = "triton"
    config_keys = CONFIG_KEYS + QUANT_KEYS
    config_types = {key: int for key in CONFIG_KEYS + QUANT_KEYS}

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        if problem.quantised:
            from tunelab.kernels.quant_moe import QuantMoELaunch, make_quant_plan

            return QuantMoELaunch(make_quant_plan(problem, _full_config(problem, config)), inputs)
        from tunelab.kernels.fused_moe import FusedMoELaunch, make_plan

        plan = make_plan(problem, _full_config(problem, config))
        return FusedMoELaunch(plan, inputs)

    def compile(self, problem: FusedMoE, config: dict) -> bool:
        """Compile the call's kernels for this shape and config without launching.

        Needs no GPU: a compile worker runs with none visible (see tunelab.target).
        Returns False in interpreter mode, where nothing is compiled ahead."""
        if interpreting():
            return False
        if problem.quantised:
            from tunelab.kernels.quant_moe import compile_quant_plan, make_quant_plan

            compile_quant_plan(make_quant_plan(problem, _full_config(problem, config)))
            return True
        from tunelab.kernels.fused_moe import compile_plan, make_plan

        compile_plan(make_plan(problem, _full_config(problem, config)))
        return True


class TritonFusedMoEVllm:
    """The call exactly as vLLM 0.33's `fused_experts` makes it (what its tuned JSON configs are used by).

    The alignment kernel at every size, GEMM 1 writing gate and up
    ([M*topk, 2N], biases added, no activation), the activation kernel
    (silu_and_mul or swigluoai_and_mul), GEMM 2 times the routing weights,
    the top-k sum; five plain launches, no dependent launches and no
    self-alignment. Same kernels and compile contract as `fused_moe`
    (tunelab.kernels.fused_moe.vllm_plan); the config keys are vLLM's file
    keys: tunelab's own (DOT_SCALED, SWAP_AB, MX_PTX, GEMV, SPLIT_K) are
    refused, because vLLM decides them itself: SPLIT_K is always 1, and for
    fp8 w8a8 SWAP_AB is on exactly where vLLM turns it on (a GPU of compute
    capability 9.0, BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64;
    quant_moe.vllm_swap_ab). Tensor descriptors are off, vLLM's default on
    CUDA. fp8 weights add vLLM's activation quantisation before each GEMM
    (tunelab.kernels.quant_moe); MXFP4 weights are not run this way (see
    `unavailable`). python/tests/test_vllm_mirror.py holds the GEMMs to vLLM
    0.33.0's own kernel source bit for bit."""

    name = "fused_moe_vllm"
    kind = "triton"
    config_keys = CONFIG_KEYS
    config_types = {key: int for key in CONFIG_KEYS}

    def unavailable(self, problem: FusedMoE):
        if problem.weight_format == "mxfp4":
            return (
                "vLLM's MXFP4 MoE backends do not read fused-MoE JSON configs, so vLLM's call structure "
                "has nothing to tune for MXFP4 weights (the fused_moe method runs them)"
            )
        return None

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method fused_moe_vllm cannot run here: {reason}")
        if problem.quantised:
            from tunelab.kernels.quant_moe import QuantMoELaunch, make_quant_plan

            return QuantMoELaunch(make_quant_plan(problem, _vllm_config(problem, config), vllm_structure=True), inputs)
        from tunelab.kernels.fused_moe import FusedMoELaunch, vllm_plan

        return FusedMoELaunch(vllm_plan(problem, _full_config(problem, config)), inputs)

    def compile(self, problem: FusedMoE, config: dict) -> bool:
        """Compile the five kernels without launching (no GPU needed); False in interpreter mode."""
        if interpreting() or self.unavailable(problem):
            return False
        if problem.quantised:
            from tunelab.kernels.quant_moe import compile_quant_plan, make_quant_plan

            compile_quant_plan(make_quant_plan(problem, _vllm_config(problem, config), vllm_structure=True))
            return True
        from tunelab.kernels.fused_moe import compile_plan, vllm_plan

        compile_plan(vllm_plan(problem, _full_config(problem, config)))
        return True


class TritonPersistentMoE:
    """The whole call in one persistent Triton launch
    (tunelab.kernels.fused_moe.moe_persistent_kernel; the design is in
    PersistentMoELaunch's docstring).

    Config keys (missing ones come from persistent_default_config):
      BLOCK_SIZE_M     slots per block: the alignment pads each expert's run to it
      BLOCK_SIZE_N     GEMM 1 tile: w1 rows, as (gate, up) pairs (BLOCK_SIZE_N / 2 outputs)
      BLOCK_SIZE_K     GEMM 1 reduction step over the hidden size K
      BLOCK_SIZE_N2    GEMM 2 tile: output columns (of the hidden size K)
      BLOCK_SIZE_K2    GEMM 2 reduction step over the intermediate size N
      SPLIT_K          GEMM 1 tiles split into this many K slices, summed by the
                       last slice's program (1: no split; applies while GEMM 1 has
                       at most SPLIT_K_MAX_TILES tiles, i.e. decode sizes)
      num_warps, num_stages   as for any Triton kernel
      PROGRAMS_PER_SM  programs per SM asked for; the grid is SMs x min(this,
                       what one SM holds of this binary), so every program is
                       resident (the in-kernel waits need it)
      PREFETCH_W2      1: each program asks L2 for its GEMM 2 weights before
                       GEMM 1 (only where the selectable w2 rows fit 16 MiB)
      GEMV             0: the tiles above (tl.dot); 1: the GEMV schedule for a few
                       tokens (moe_persistent_gemv_kernel), whose GEMM 1 items are
                       one slot's BLOCK_SIZE_N w1 rows (BLOCK_SIZE_N / 2 outputs)
                       over the whole of K and whose GEMM 2 items are one token's
                       BLOCK_SIZE_N2 output columns over all its experts; it reads
                       num_warps and PROGRAMS_PER_SM too, and no other key

    The in-kernel synchronisation only runs on a GPU. Under Triton's
    interpreter, which runs programs one after another (a wait would never
    end), the kernel is launched once per phase instead, so the arithmetic of
    every phase and the workspace bookkeeping are still checked.
    """

    name = "fused_moe_persistent"
    kind = "triton"

    def unavailable(self, problem: FusedMoE):
        if problem.quantised:
            return f"the persistent kernel runs bf16/fp16/fp32 weights, not {problem.weight_format}"
        return None

    @property
    def config_keys(self):
        from tunelab.kernels.fused_moe import PERSISTENT_CONFIG_KEYS

        return PERSISTENT_CONFIG_KEYS

    @property
    def config_types(self):
        return {key: int for key in self.config_keys}

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        from tunelab.kernels.fused_moe import PersistentMoELaunch, make_persistent_plan

        return PersistentMoELaunch(make_persistent_plan(problem, _persistent_config(problem, config)), inputs)

    def compile(self, problem: FusedMoE, config: dict) -> bool:
        """Compile the kernel without launching (no GPU, no SM count needed: the
        grid is not part of the binary); False in interpreter mode."""
        if interpreting() or self.unavailable(problem):
            return False
        from tunelab.kernels.fused_moe import compile_persistent, make_persistent_plan

        compile_persistent(make_persistent_plan(problem, _persistent_config(problem, config)))
        return True


def _full_config(problem: FusedMoE, config: dict) -> dict:
    full = vllm_default_config(problem.M, problem.E, problem.block_shape, fp8=problem.weight_format == "fp8")
    full.update({k: config[k] for k in CONFIG_KEYS if k in config})
    for key in ("DOT_SCALED", "MX_PTX", "GEMV"):
        if problem.weight_format == "mxfp4":
            full[key] = int(config.get(key, 0))
        elif int(config.get(key, 0)):
            raise ValueError(f"{key} applies to mxfp4 weights only, not {problem.dtype_name}")
    for key, default in (("SWAP_AB", 0), ("SPLIT_K", 1)):
        if problem.quantised:
            full[key] = int(config.get(key, default))
        elif int(config.get(key, default)) != default:
            raise ValueError(f"{key} applies to quantised weights (fp8, mxfp4) only, not {problem.dtype_name}")
    return full


def _vllm_config(problem: FusedMoE, config: dict) -> dict:
    """The config of vLLM's call: vLLM decides SWAP_AB itself (quant_moe.vllm_swap_ab)."""
    full = _full_config(problem, config)
    full.pop("SWAP_AB", None)
    return full


def _persistent_config(problem: FusedMoE, config: dict) -> dict:
    from tunelab.kernels.fused_moe import PERSISTENT_CONFIG_KEYS, persistent_default_config

    full = persistent_default_config(problem.M, problem.N)
    full.update({k: config[k] for k in PERSISTENT_CONFIG_KEYS if k in config})
    return full


if TYPE_CHECKING:
    from tunelab.problems.moe_libraries import AiterMoE, VllmMoE
    from tunelab.problems.moe_torch import TorchMoE
    from tunelab.problems.moe_triton_kernels import TritonKernelsMoE

    # The contract of tunelab.protocols, checked by mypy (`just typecheck`).
    _problem: ProblemClass = FusedMoE
    _bytes_for: type[ProblemWithBytesFor] = FusedMoE
    _fused: CompilingMethod[FusedMoE] = TritonFusedMoE()
    _fused_typed: TypedMethod[FusedMoE] = TritonFusedMoE()
    _fused_vllm: TypedMethod[FusedMoE] = TritonFusedMoEVllm()
    _persistent: TypedMethod[FusedMoE] = TritonPersistentMoE()
    _torch: TypedMethod[FusedMoE] = TorchMoE()
    _vllm: AvailabilityMethod[FusedMoE] = VllmMoE()
    _vllm_typed: TypedMethod[FusedMoE] = VllmMoE()
    _aiter: AvailabilityMethod[FusedMoE] = AiterMoE()
    _triton_kernels: AvailabilityMethod[FusedMoE] = TritonKernelsMoE()
    _triton_kernels_typed: TypedMethod[FusedMoE] = TritonKernelsMoE()
