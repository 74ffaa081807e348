"""Builtin problem `gemm`: C = A @ B.

Shape keys: M, N, K (positive integers) and dtype:
- fp16, bf16 or fp32: A [M, K], B [K, N] and C all in that dtype. Methods:
  `matmul` (tunelab's Triton kernel, tunable) and `torch_matmul`
  (torch.matmul, a baseline; its config is ignored).
- fp8: the a8w8 block-scale GEMM, C[M, N] = A[M, K] @ W[N, K]^T with A and W
  in fp8 (E4M3), A scaled per row and per block_k columns, W per
  [block_n, block_k] tile (docs/quantisation.md). Extra keys:
  `weight_quant` ("block", the default and only choice), `block_shape`
  ([block_n, block_k], default [128, 128]; block_k a power of two) and
  `out_dtype` (C's dtype: bf16, the default, fp16 or fp32). Method:
  `matmul_a8w8_blockscale` (tunelab.kernels.matmul_a8w8); the reference is
  the product of the dequantised operands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunelab.lazy import torch

from tunelab import native_data, quant
from tunelab.dtypes import element_size, torch_dtype

if TYPE_CHECKING:
    from tunelab.protocols import CompilingMethod, Method, ProblemClass, TypedMethod


class Launch:
    """A bound method: `out` is the preallocated result, calling it fills `out`.

    `native` is what a native launch needs, when the run offers it
    (tunelab.kernels.launch.compiled_runner); None otherwise."""

    __slots__ = ("out", "_run", "native")

    def __init__(self, run, out):
        self._run = run
        self.out = out
        self.native = getattr(run, "native", None)

    def __call__(self):
        self._run()


class Gemm:
    def __init__(self, shape: dict):
        try:
            self.M, self.N, self.K = (int(shape[key]) for key in ("M", "N", "K"))
        except KeyError as missing:
            raise ValueError(f"gemm shape needs {missing.args[0]} (shape keys: M, N, K, dtype)") from None
        if min(self.M, self.N, self.K) < 1:
            raise ValueError(f"gemm needs positive M, N, K; got M={self.M} N={self.N} K={self.K}")
        self.dtype_name = shape.get("dtype", "fp16")
        self.fp8 = self.dtype_name == "fp8"
        # [block_n, block_k] of the fp8 GEMM's scales; None for the others.
        self.block_shape: tuple[int, int] | None = None
        if self.fp8:
            self._fp8_fields(shape)
        else:
            for key in ("weight_quant", "block_shape", "out_dtype"):
                if key in shape:
                    raise ValueError(
                        f"gemm shape field {key!r} is for dtype fp8 (the a8w8 block-scale GEMM), not {self.dtype_name}"
                    )
            self.out_dtype_name = self.dtype_name
        self.dtype = torch_dtype(self.out_dtype_name)  # C's dtype

    def _fp8_fields(self, shape: dict):
        if shape.get("weight_quant", "block") != "block":
            raise ValueError(f"an fp8 gemm has block scales (weight_quant: block), not {shape['weight_quant']!r}")
        block = shape.get("block_shape", [128, 128])
        if (
            not isinstance(block, (list, tuple))
            or len(block) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)
        ):
            raise ValueError(f"block_shape must be [block_n, block_k] (positive integers), got {block!r}")
        if block[1] & (block[1] - 1):
            raise ValueError(f"block_shape's block_k must be a power of two, got {block[1]}")
        self.block_shape = (int(block[0]), int(block[1]))
        self.out_dtype_name = shape.get("out_dtype", "bf16")
        if self.out_dtype_name not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"out_dtype must be bf16, fp16 or fp32, got {self.out_dtype_name!r}")

    def scale_shapes(self):
        """(a_scale, w_scale) shapes of the fp8 GEMM."""
        bn, bk = self.block_shape
        return (self.M, quant.cdiv(self.K, bk)), (quant.cdiv(self.N, bn), quant.cdiv(self.K, bk))

    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def bytes(self) -> float:
        # Read A and B once, write C once: the least any method can move.
        if self.fp8:
            (am, ak), (wn, wk) = self.scale_shapes()
            return float(
                self.M * self.K
                + self.K * self.N
                + 4 * (am * ak + wn * wk)
                + self.M * self.N * element_size(self.out_dtype_name)
            )
        return float((self.M * self.K + self.K * self.N + self.M * self.N) * element_size(self.dtype_name))

    def inputs(self, seed: int, device) -> dict:
        """A and B with entries ~ N(0, 1/sqrt(K)) each, so every C entry is ~ N(0, 1).

        Keeping C of order one makes atol and rtol mean the same thing at every K
        and keeps fp16 far from overflow. The generator lives on the target device
        so large inputs are not built on the host and copied.
        """
        generator = torch.Generator(device=device).manual_seed(int(seed))
        scale = self.K**-0.25

        def operand(rows, cols):
            x = torch.randn(rows, cols, generator=generator, device=device, dtype=torch.float32)
            return x.mul_(scale).to(self.dtype)

        if self.fp8:
            # Quantised the way a model's activations and weights are: A per
            # 1 x block_k block (as the activation quantisation of
            # tunelab.quant does), W per block_n x block_k tile.
            assert self.block_shape is not None
            bn, bk = self.block_shape
            a = torch.randn(self.M, self.K, generator=generator, device=device, dtype=torch.float32).mul_(scale)
            w = torch.randn(self.N, self.K, generator=generator, device=device, dtype=torch.float32).mul_(scale)
            aq, a_scale = quant.quantize_act_fp8(a, bk)
            wq, w_scale = quant.quantize_fp8_block(w, bn, bk)
            return {"a": aq, "a_scale": a_scale, "w": wq, "w_scale": w_scale}
        return {"a": operand(self.M, self.K), "b": operand(self.K, self.N)}

    def reference(self, inputs: dict):
        # fp32 product of the already-rounded inputs: the only differences left
        # are summation order and the rounding of C to the output dtype.
        if self.fp8:
            assert self.block_shape is not None
            bn, bk = self.block_shape
            a = quant.dequantize_act_fp8(inputs["a"], inputs["a_scale"], bk)
            w = quant.dequantize_fp8(inputs["w"], inputs["w_scale"], (bn, bk))
            prev = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")
            try:
                return torch.matmul(a, w.T)
            finally:
                torch.set_float32_matmul_precision(prev)
        return torch.matmul(inputs["a"].float(), inputs["b"].float())

    def methods(self) -> dict[str, Method[Gemm]]:
        return {"matmul": TritonMatmul(), "torch_matmul": TorchMatmul(), "matmul_a8w8_blockscale": TritonMatmulA8W8()}

    def new_output(self, inputs: dict):
        a = inputs["a"]
        if native_data.is_stand_in(a):
            return native_data.output_stand_in(self.out_dtype_name, (self.M, self.N))
        return torch.empty((self.M, self.N), dtype=self.dtype, device=a.device)

    def native_data(self) -> dict:
        """The inputs as the native worker builds them (`inputs: native`): the
        same distributions as `inputs`, from the native worker's generator, and
        the fp32 product as the reference."""
        if self.fp8:
            raise ValueError("fp8 operands are quantised with their scales, which the native worker does not build")
        scale = self.K**-0.25
        return {
            "tensors": [
                native_data.normal("a", self.dtype_name, (self.M, self.K), scale),
                native_data.normal("b", self.dtype_name, (self.K, self.N), scale),
            ],
            "output": native_data.output(self.out_dtype_name, (self.M, self.N)),
            "reference": native_data.matmul("a", "b"),
        }


def _not_fp8(name: str, problem: "Gemm"):
    if problem.fp8:
        return f"{name} multiplies fp16/bf16/fp32 operands; fp8 shapes run matmul_a8w8_blockscale"
    return None


class TritonMatmul:
    """tunelab's own Triton GEMM (tunelab.kernels.matmul)."""

    def unavailable(self, problem: Gemm):
        return _not_fp8("matmul", problem)

    config_types = {
        "BLOCK_SIZE_M": int,
        "BLOCK_SIZE_N": int,
        "BLOCK_SIZE_K": int,
        "GROUP_SIZE_M": int,
        "num_warps": int,
        "num_stages": int,
    }

    def bind(self, problem: Gemm, inputs: dict, config: dict) -> Launch:
        from tunelab.kernels import matmul

        out = problem.new_output(inputs)
        return Launch(matmul.make_launcher(inputs["a"], inputs["b"], out, config), out)

    def compile(self, problem: Gemm, config: dict) -> bool:
        from tunelab.kernels import matmul

        if self.unavailable(problem):
            return False
        return matmul.compile_only(problem.M, problem.N, problem.K, problem.dtype, config)


class TorchMatmul:
    """torch.matmul (cuBLAS on GPU) writing into the preallocated output."""

    config_types: dict = {}

    def unavailable(self, problem: Gemm):
        return _not_fp8("torch_matmul", problem)

    def bind(self, problem: Gemm, inputs: dict, config: dict) -> Launch:
        a, b = inputs["a"], inputs["b"]
        out = problem.new_output(inputs)

        def run():
            torch.matmul(a, b, out=out)

        return Launch(run, out)


class TritonMatmulA8W8:
    """tunelab's fp8 GEMM with 1 x 128 activation and 128 x 128 weight block scales
    (tunelab.kernels.matmul_a8w8), aiter's gemm_a8w8_blockscale config keys."""

    config_types = {
        "BLOCK_SIZE_M": int,
        "BLOCK_SIZE_N": int,
        "BLOCK_SIZE_K": int,
        "GROUP_SIZE_M": int,
        "NUM_KSPLIT": int,
        "num_warps": int,
        "num_stages": int,
    }

    def unavailable(self, problem: Gemm):
        if not problem.fp8:
            return f"matmul_a8w8_blockscale multiplies fp8 operands (dtype: fp8), not {problem.dtype_name}"
        return None

    def bind(self, problem: Gemm, inputs: dict, config: dict) -> Launch:
        from tunelab.kernels import matmul_a8w8

        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method matmul_a8w8_blockscale cannot run here: {reason}")
        out = problem.new_output(inputs)
        run = matmul_a8w8.make_launcher(
            inputs["a"], inputs["w"], inputs["a_scale"], inputs["w_scale"], out, problem.block_shape, config
        )
        return Launch(run, out)

    def compile(self, problem: Gemm, config: dict) -> bool:
        from tunelab.kernels import matmul_a8w8

        if self.unavailable(problem):
            return False
        return matmul_a8w8.compile_only(problem.M, problem.N, problem.K, problem.block_shape, problem.dtype, config)


if TYPE_CHECKING:
    # The contract of tunelab.protocols, checked by mypy (`just typecheck`).
    _problem: ProblemClass = Gemm
    _matmul: CompilingMethod[Gemm] = TritonMatmul()
    _matmul_typed: TypedMethod[Gemm] = TritonMatmul()
    _torch_matmul: TypedMethod[Gemm] = TorchMatmul()
    _a8w8: CompilingMethod[Gemm] = TritonMatmulA8W8()
