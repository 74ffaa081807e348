"""Builtin problem `gemm`: C = A @ B with A [M, K], B [K, N], all in one dtype.

Shape keys: M, N, K (positive integers) and dtype (fp16, bf16 or fp32).
Methods: `matmul` (tunelab's Triton kernel, tunable) and `torch_matmul`
(torch.matmul, a baseline; its config is ignored).
"""

from tunelab.lazy import torch

from tunelab.dtypes import element_size, torch_dtype


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
        self.dtype = torch_dtype(self.dtype_name)

    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K

    def bytes(self) -> float:
        # Read A and B once, write C once: the least any method can move.
        return float((self.M * self.K + self.K * self.N + self.M * self.N) * element_size(self.dtype_name))

    def inputs(self, seed: int, device) -> dict:
        """A and B with entries ~ N(0, 1/sqrt(K)) each, so every C entry is ~ N(0, 1).

        Keeping C of order one makes atol and rtol mean the same thing at every K
        and keeps fp16 far from overflow. The generator lives on the target device
        so large inputs are not built on the host and copied.
        """
        generator = torch.Generator(device=device).manual_seed(int(seed))
        scale = self.K ** -0.25

        def operand(rows, cols):
            x = torch.randn(rows, cols, generator=generator, device=device, dtype=torch.float32)
            return x.mul_(scale).to(self.dtype)

        return {"a": operand(self.M, self.K), "b": operand(self.K, self.N)}

    def reference(self, inputs: dict):
        # fp32 product of the already-rounded inputs: the only differences left
        # are summation order and the rounding of C to the output dtype.
        return torch.matmul(inputs["a"].float(), inputs["b"].float())

    def methods(self) -> dict:
        return {"matmul": TritonMatmul(), "torch_matmul": TorchMatmul()}

    def new_output(self, inputs: dict):
        a = inputs["a"]
        return torch.empty((self.M, self.N), dtype=a.dtype, device=a.device)


class TritonMatmul:
    """tunelab's own Triton GEMM (tunelab.kernels.matmul)."""

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

        return matmul.compile_only(problem.M, problem.N, problem.K, problem.dtype, config)


class TorchMatmul:
    """torch.matmul (cuBLAS on GPU) writing into the preallocated output."""

    config_types: dict = {}

    def bind(self, problem: Gemm, inputs: dict, config: dict) -> Launch:
        a, b = inputs["a"], inputs["b"]
        out = problem.new_output(inputs)

        def run():
            torch.matmul(a, b, out=out)

        return Launch(run, out)
