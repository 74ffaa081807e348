"""OpenAI's triton_kernels MoE, called the way vLLM 0.33 calls it for gpt-oss's
MXFP4 experts on Hopper (the `triton_kernels` method of the moe problem).

What vLLM does, and this module does the same with triton_kernels' own code
(docs/peers.md has the facts and where each comes from):

- Weights (once per set of weights, outside the timed call): the packed E2M1
  codes [E, rows, K/2] and E8M0 scales [E, rows, K/32] are transposed so the
  MX axis is dim 1, the scale's K groups padded to a multiple of 4 (vLLM's
  sm_90 fix), and converted with triton_kernels' `convert_layout` into the
  layouts `make_default_matmul_mxfp4_w_layout(mx_axis=1)` and
  `make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)` choose
  (on sm_90: HopperMXValueLayout, HopperMXScaleLayout). The intermediate size
  is padded to a multiple of 64 with zero weights, as vLLM pads it for this
  backend. Biases become fp32.
- The timed call: the routing data built from the problem's top-k ids and
  weights as vLLM's `make_routing_data` builds it (ids as int16, weights as
  bf16, a bitmatrix of each token's experts, triton_kernels'
  `routing_from_bitmatrix`); `matmul_ogs` for gate/up with the gather and
  gpt-oss's SwiGLU fused (alpha 1.702, limit 7; gate and up interleaved,
  even columns gate, as the problem's weights are); `matmul_ogs` for down with
  the routing weights and the scatter, which sums each token's top-k rows.
- Tiles: triton_kernels' heuristic (`opt_flags`) picks them on the host at
  each call, within the constraints set with `update_opt_flags_constraints`
  (process-global). The config's keys are constraints per matmul (`w1_` the
  gate/up matmul, `w2_` the down one); 0 leaves a key to the heuristic. The
  launch sets a matmul's constraints right before it and resets them right
  after, so a CUDA graph captured around the call holds the kernels those
  constraints choose. The kernels each job compiled (names with BLOCK_M x
  BLOCK_N x BLOCK_K x SPLIT_K, warps and stages) are in its journal record.

vLLM sets {"split_k": 1} on sm_90; with no constraint at all the heuristic
runs bare. Both are configs of this space (docs/peers.md, "Two baselines").
"""

from __future__ import annotations

import weakref
from typing import Any

import triton
import triton.language as tl

from tunelab import peers, quant
from tunelab.kernels.launch import interpreting
from tunelab.lazy import torch

# Constraint keys per matmul, as triton_kernels' NVIDIA heuristic accepts them
# and as they apply to an MXFP4 weight on sm_90: `is_persistent` and
# `fused_scatter` are not here because the heuristic cannot take them for this
# call (no TMA for MXFP4 weights on Hopper; the down matmul sums top-k rows,
# which fused scatter does not), and block_n and num_warps are derived.
CONSTRAINTS = ("block_m", "block_k", "split_k", "num_stages", "epilogue_subtile")
MATMULS = ("w1", "w2")  # gate/up, down
CONFIG_KEYS = tuple(f"{m}_{c}" for m in MATMULS for c in CONSTRAINTS)
# The block_m values triton_kernels' routing data has tile maps for (16 to 128).
BLOCK_MS = (16, 32, 64, 128)
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
# vLLM pads the intermediate size to this for its Triton MXFP4 backend on CUDA.
INTERMEDIATE_ALIGN = 64
# vLLM's sm_90 fix: the scale's K groups padded to a multiple of this.
SCALE_GROUPS_ALIGN = 4


def constraints_of(config: dict, matmul: str) -> dict:
    """The opt_flags constraints of one matmul ("w1" or "w2") in a config: its
    nonzero keys, without the prefix."""
    out = {}
    for name in CONSTRAINTS:
        value = int(config.get(f"{matmul}_{name}", 0) or 0)
        if value < 0:
            raise ValueError(f"{matmul}_{name} must be >= 0 (0 leaves it to the heuristic), got {value}")
        if value:
            out[name] = value
    block_m = out.get("block_m")
    if block_m is not None and block_m not in BLOCK_MS:
        raise ValueError(
            f"{matmul}_block_m must be 0 or one of {list(BLOCK_MS)} "
            f"(the tile sizes triton_kernels' routing data maps), got {block_m}"
        )
    return out


# ---------------------------------------------------------------------------
# weights


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def padded_intermediate(n: int) -> int:
    return round_up(n, INTERMEDIATE_ALIGN)


def pad_weights(problem, inputs: dict) -> dict:
    """The problem's MXFP4 weights with the intermediate size padded to a
    multiple of 64 (zero codes, zero scale bytes, zero biases), as vLLM pads
    it: w1 [E, 2Np, K/2] (whole gate/up pairs appended: the activation of a
    zero pair is 0), w2 [E, K, Np/2], their scales, b1 [E, 2Np], b2 [E, K]."""
    N, Np = problem.N, padded_intermediate(problem.N)
    w1, s1 = inputs["w1"], inputs["w1_scale"]
    w2, s2 = inputs["w2"], inputs["w2_scale"]
    rows = 2 * (Np - N)
    if rows:
        w1 = torch.nn.functional.pad(w1, (0, 0, 0, rows))
        s1 = torch.nn.functional.pad(s1, (0, 0, 0, rows))
    # w2's reduction axis is stored padded to 32 already (quant.mx_padded).
    stored = quant.mx_padded(N)
    if Np > stored:
        w2 = torch.nn.functional.pad(w2, (0, (Np - stored) // 2))
        s2 = torch.nn.functional.pad(s2, (0, (Np - stored) // quant.MX_GROUP))
    out = {"w1": w1, "w1_scale": s1, "w2": w2, "w2_scale": s2, "b1": None, "b2": None}
    if problem.bias:
        out["b1"] = torch.nn.functional.pad(inputs["b1"].float(), (0, rows))
        out["b2"] = inputs["b2"].float()
    return out


def default_layouts():
    """((value layout, options), (scale layout, options)) as vLLM asks
    triton_kernels for them: on sm_90 the Hopper layouts, MX axis 1, 8 warps."""
    from triton_kernels.tensor_details import layout

    return (
        layout.make_default_matmul_mxfp4_w_layout(mx_axis=1),
        layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8),
    )


def hopper_layouts():
    """What `default_layouts` gives on sm_90, named without asking a GPU (tests)."""
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    return (HopperMXValueLayout, {"mx_axis": 1}), (HopperMXScaleLayout, {"mx_axis": 1, "num_warps": 8})


def swizzle_mxfp4(codes, scales, layouts=None):
    """(weight, scale) as triton_kernels Tensors in the layouts vLLM's
    `_swizzle_mxfp4` gives them on sm_90: codes uint8 [E, rows, K/2] and scales
    uint8 [E, rows, groups] of the problem's format. `layouts` as
    `default_layouts` returns them (its result where None)."""
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor

    (value_layout, value_opts), (scale_layout, scale_opts) = layouts or default_layouts()
    groups = scales.shape[-1]
    scales = torch.nn.functional.pad(scales, (0, -groups % SCALE_GROUPS_ALIGN))
    codes = codes.transpose(-2, -1)
    scales = scales.transpose(-2, -1)
    weight = convert_layout(wrap_torch_tensor(codes, dtype=FP4), value_layout, **value_opts)
    scale = convert_layout(wrap_torch_tensor(scales), scale_layout, **scale_opts)
    return weight, scale


class ConvertedWeights:
    """One set of weights in triton_kernels' layouts, with its precision configs."""

    def __init__(self, problem, inputs: dict, layouts=None):
        from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
        from triton_kernels.numerics import InFlexData

        padded = pad_weights(problem, inputs)
        self.w1, s1 = swizzle_mxfp4(padded["w1"], padded["w1_scale"], layouts)
        self.w2, s2 = swizzle_mxfp4(padded["w2"], padded["w2_scale"], layouts)
        self.b1, self.b2 = padded["b1"], padded["b2"]
        self.pc1 = PrecisionConfig(weight_scale=s1, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.pc2 = PrecisionConfig(weight_scale=s2, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.n_padded = padded_intermediate(problem.N)


# The converted weights of the last weights seen (a tuning run keeps one set
# of weights per (E, N) across its M values: converting 128 experts again for
# each M would cost more than timing them). Keyed by the weight tensor itself.
_CONVERTED: dict[str, Any] = {"ref": None, "key": None, "weights": None}


def converted(problem, inputs: dict) -> ConvertedWeights:
    w1 = inputs["w1"]
    key = (problem.E, problem.N, problem.K, problem.bias, str(w1.device))
    ref = _CONVERTED["ref"]
    if ref is not None and ref() is w1 and _CONVERTED["key"] == key:
        return _CONVERTED["weights"]
    _CONVERTED.update(ref=None, key=None, weights=None)  # free the old set first
    weights = ConvertedWeights(problem, inputs)
    _CONVERTED.update(ref=weakref.ref(w1), key=key, weights=weights)
    return weights


# ---------------------------------------------------------------------------
# routing


@triton.jit
def routing_bits_kernel(
    ids_ptr, bits_ptr, n_rows, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr, WORDS: tl.constexpr, BLOCK_ROWS: tl.constexpr
):
    """bits[row, w] = the OR of 1 << (e % 32) over the row's experts e with e // 32 == w
    (a negative id selects nothing). A row names an expert at most once, so the
    sum of those bits is their OR."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    slots = tl.arange(0, TOPK_PAD)
    ok = (rows < n_rows)[:, None] & (slots < TOPK)[None, :]
    ids = tl.load(ids_ptr + rows[:, None] * TOPK + slots[None, :], mask=ok, other=-1).to(tl.int32)
    ok = ok & (ids >= 0)
    word = ids // 32
    bit = tl.full(ids.shape, 1, tl.int64) << (ids % 32).to(tl.int64)
    for w in tl.static_range(WORDS):
        bits = tl.sum(tl.where(ok & (word == w), bit, 0), axis=1)
        tl.store(bits_ptr + rows * WORDS + w, bits.to(tl.uint32), mask=rows < n_rows)


ROUTING_BLOCK_ROWS = 128


def routing_bits(ids, n_experts: int):
    """The bitmatrix storage (uint32 [rows, ceil(E / 32)]) of top-k ids [rows, topk]."""
    rows, topk = ids.shape
    words = triton.cdiv(n_experts, 32)
    bits = torch.empty((rows, words), dtype=torch.uint32, device=ids.device)
    grid = (triton.cdiv(rows, ROUTING_BLOCK_ROWS),)
    routing_bits_kernel[grid](
        ids, bits, rows, TOPK=topk, TOPK_PAD=triton.next_power_of_2(topk), WORDS=words, BLOCK_ROWS=ROUTING_BLOCK_ROWS
    )
    return bits


def routing(topk_ids, topk_weights, n_experts: int):
    """(routing_data, gather_indx, scatter_indx) from top-k ids and weights, as
    vLLM's `make_routing_data` builds them for triton_kernels 3.5.1."""
    from triton_kernels.routing import routing_from_bitmatrix
    from triton_kernels.tensor import Bitmatrix

    ids = topk_ids.to(torch.int16)
    weights = topk_weights.to(torch.bfloat16)
    rows, topk = ids.shape
    bits = routing_bits(ids, n_experts)
    words = bits.shape[1]
    bitmatrix = Bitmatrix(bits, shape=[rows, words * 32], shape_max=[rows, None], scratchpad=None)
    return routing_from_bitmatrix(bitmatrix, weights, ids, n_experts, topk)


# ---------------------------------------------------------------------------
# the method


def unavailable_reason(problem) -> str | None:
    """Why the triton_kernels method cannot run this problem here, or None."""
    if problem.weight_format != "mxfp4" or problem.activation != "swiglu_oai":
        return (
            "tunelab runs triton_kernels the way vLLM runs gpt-oss: MXFP4 weights with gpt-oss's "
            f"swiglu_oai activation, not {problem.dtype_name} with {problem.activation}"
        )
    if problem.act_dtype_name != "bf16":
        return f"vLLM's triton_kernels call takes bf16 activations, not {problem.act_dtype_name}"
    if problem.K % quant.MX_GROUP:
        return f"triton_kernels needs K a multiple of {quant.MX_GROUP} (the MX group), got K={problem.K}"
    tk = peers.triton_kernels()
    if isinstance(tk, str):
        return tk
    if tk.api != "3.5.1":
        return (
            f"this method calls the triton_kernels 3.5.1 API that vLLM 0.33 pins; found the {tk.api} API ({tk.source})"
        )
    if interpreting():
        return "triton_kernels' matmul_ogs picks its tiles from the GPU's properties: it needs a CUDA GPU, not Triton's interpreter"
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return "triton_kernels' MXFP4 matmul runs here on an NVIDIA GPU only, and none is visible"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return (
            f"tunelab mirrors vLLM's triton_kernels call on sm_90 (Hopper) only; this GPU is sm_{major}{minor}, "
            "where vLLM sets other constraints (is_persistent, epilogue_subtile) and layouts"
        )
    return None


class TritonKernelsMoE:
    """OpenAI's triton_kernels matmul_ogs MoE as vLLM 0.33 runs gpt-oss's MXFP4 experts on sm_90, tiles by opt_flags within the config's constraints."""  # noqa: E501 - its first line is the description

    name = "triton_kernels"
    kind = "library"
    config_keys = CONFIG_KEYS
    config_types = {key: int for key in CONFIG_KEYS}

    @property
    def description(self) -> str:
        """The first line of the docstring, and which triton_kernels runs: the
        run header records it (worker `probe`)."""
        first = (type(self).__doc__ or "").strip().splitlines()[0]
        tk = peers.triton_kernels()
        return f"{first} ({tk if isinstance(tk, str) else tk.describe()})"

    def unavailable(self, problem):
        return unavailable_reason(problem)

    def bind(self, problem, inputs: dict, config: dict):
        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method triton_kernels cannot run here: {reason}")
        return TritonKernelsLaunch(problem, inputs, config)


class TritonKernelsLaunch:
    """A bound call: converted weights, preallocated intermediate and output,
    each matmul's constraints."""

    def __init__(self, problem, inputs: dict, config: dict):
        from triton_kernels.matmul_ogs import FnSpecs, FusedActivation, matmul_ogs
        from triton_kernels.swiglu import swiglu_fn

        self._matmul_ogs = matmul_ogs  # looked up once: the call is timed
        self.p = problem
        self.constraints = {m: constraints_of(config, m) for m in MATMULS}
        self.weights = converted(problem, inputs)
        self.ids, self.topk_weights = inputs["topk_ids"], inputs["topk_weights"]
        self.x = inputs["x"]
        device = self.x.device
        rows = problem.M * problem.topk
        self.inter = torch.empty((1, rows, self.weights.n_padded), dtype=torch.bfloat16, device=device)
        self.out = torch.empty((problem.M, problem.K), dtype=torch.bfloat16, device=device)
        # triton_kernels 3.5.1's spelling: the reduction over gate/up pairs is the third argument.
        self.act = FusedActivation(FnSpecs("swiglu", swiglu_fn, ("alpha", "limit")), (SWIGLU_ALPHA, SWIGLU_LIMIT), 2)

    def __call__(self):
        matmul_ogs = self._matmul_ogs
        p, w = self.p, self.weights
        routing_data, gather, scatter = routing(self.ids, self.topk_weights, p.E)
        with opt_flags_constraints(self.constraints["w1"]):
            matmul_ogs(
                self.x,
                w.w1,
                w.b1,
                routing_data,
                gather_indx=gather,
                precision_config=w.pc1,
                fused_activation=self.act,
                y=self.inter,
            )
        with opt_flags_constraints(self.constraints["w2"]):
            matmul_ogs(
                self.inter.view(p.M * p.topk, w.n_padded),
                w.w2,
                w.b2,
                routing_data,
                scatter_indx=scatter,
                precision_config=w.pc2,
                gammas=routing_data.gate_scal,
                y=self.out.view(1, p.M, p.K),
            )
        return self.out


class opt_flags_constraints:
    """Within the block, triton_kernels' opt_flags constraints are exactly
    `constraints` (others reset), and none after it. They are process-global:
    set right before a matmul_ogs call, cleared right after."""

    def __init__(self, constraints: dict):
        self.constraints = constraints

    def __enter__(self):
        from triton_kernels.matmul_ogs_details import opt_flags

        opt_flags.reset_opt_flags_constraints()
        if self.constraints:
            opt_flags.update_opt_flags_constraints(dict(self.constraints))
        return self

    def __exit__(self, *exc):
        from triton_kernels.matmul_ogs_details import opt_flags

        opt_flags.reset_opt_flags_constraints()
        return False


class recorded_opt_flags:
    """Within the block, every OptFlags triton_kernels' matmul_ogs chooses is
    appended to the list the block gets (tests, bench scripts): what the
    heuristic picked under the constraints in force."""

    def __enter__(self):
        import triton_kernels.matmul_ogs as matmul_ogs_module

        self.module = matmul_ogs_module
        self.original = matmul_ogs_module.make_opt_flags
        self.chosen: list = []

        def record(*args, **kwargs):
            flags = self.original(*args, **kwargs)
            self.chosen.append(flags)
            return flags

        matmul_ogs_module.make_opt_flags = record
        return self.chosen

    def __exit__(self, *exc):
        self.module.make_opt_flags = self.original
        return False
