"""The moe problem's `torch` method: the fastest MoE the installed torch has,
no Triton (`torch_path` says which of three ways and why). Apart from
tunelab.problems.moe, which names it among its methods."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunelab.lazy import torch

if TYPE_CHECKING:
    from tunelab.problems.moe import FusedMoE

TORCH_PATHS = ("grouped_mm", "gather_bmm", "dense_bmm")


def torch_path(problem: FusedMoE, device) -> tuple:
    """(path, why) of the torch method for this problem on this device.

    - "grouped_mm": sort the (token, k) slots by expert, then two
      `torch._grouped_mm` calls with per-expert offsets (2-D x 3-D). On CUDA
      that is torch's CUTLASS grouped GEMM only for bf16 on sm_90/sm_100 (and
      16-byte aligned rows: K and N multiples of 8); anything else goes
      through torch's fallback, which copies the offsets to the host and loops
      over the experts, a host sync in the call. On the CPU there is no
      device to sync with, so the call is used wherever this torch has it.
    - "gather_bmm" (no fast grouped GEMM, M*topk <= E): each slot's expert
      weights gathered, one batched matmul per GEMM. Reads M*topk experts.
    - "dense_bmm" (no fast grouped GEMM, M*topk > E): every token through
      every expert in one batched matmul per GEMM, combined with the routing
      weights (zero for unrouted experts). E/topk times the flops, no copies.
    None of them loops over experts in Python or syncs with the host.
    """
    device = torch.device(device)
    grouped = getattr(torch, "_grouped_mm", None)
    numel = problem.M * problem.topk
    fallback = "gather_bmm" if numel <= problem.E else "dense_bmm"
    if grouped is None:
        return fallback, f"torch {torch.__version__} has no torch._grouped_mm"
    if device.type == "cpu":
        if _grouped_mm_works_on_cpu(problem.dtype):
            return "grouped_mm", "torch._grouped_mm on the CPU (no device, no sync)"
        return fallback, f"torch._grouped_mm does not run on the CPU for {problem.dtype} in this torch"
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return fallback, "torch._grouped_mm's fast path is CUDA-only here (ROCm's needs CK, else it syncs)"
    if problem.dtype != torch.bfloat16:
        return fallback, (
            f"torch._grouped_mm's CUDA fast path is bf16 only; {problem.dtype_name} would take "
            "its per-expert fallback, which syncs with the host"
        )
    major, _ = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        return fallback, f"torch._grouped_mm's CUDA fast path needs sm_90 or sm_100 (this GPU is sm_{major}x)"
    if problem.K % 8 or problem.N % 8:
        return fallback, "torch._grouped_mm needs 16-byte row strides (K and N multiples of 8)"
    return "grouped_mm", "torch._grouped_mm, CUTLASS grouped GEMM (bf16, sm_90/sm_100)"


_CPU_GROUPED: dict[object, bool] = {}


def _grouped_mm_works_on_cpu(dtype) -> bool:
    """Probe once per dtype: CPU support for _grouped_mm differs between torch versions."""
    if dtype not in _CPU_GROUPED:
        try:
            a = torch.zeros(4, 8, dtype=dtype)
            b = torch.zeros(2, 8, 8, dtype=dtype)
            torch._grouped_mm(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))
            _CPU_GROUPED[dtype] = True
        except Exception:  # noqa: BLE001 - any refusal means "not here"
            _CPU_GROUPED[dtype] = False
    return _CPU_GROUPED[dtype]


class TorchMoE:
    """torch's fastest MoE in the installed build: see `torch_path` for the
    paths and when each is taken; the bound launch's `path` and `path_reason`
    say which one this job runs. Activations are computed in fp32 and the
    top-k sum in fp32, as the Triton methods do."""

    name = "torch"
    kind = "torch"
    config_keys = ()
    config_types: dict = {}

    def unavailable(self, problem: FusedMoE):
        if problem.quantised:
            return (
                f"torch has no MoE over {problem.weight_format} weights; tunelab's torch method runs "
                "bf16/fp16/fp32 weights"
            )
        return None

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method torch cannot run here: {reason}")
        return TorchMoELaunch(problem, inputs)


class TorchMoELaunch:
    """A bound torch call. `path` forces a path (tests); by default `torch_path` picks."""

    def __init__(self, problem: FusedMoE, inputs: dict, path: str | None = None):
        self.p = problem
        x = inputs["x"]
        if path is None:
            self.path, self.path_reason = torch_path(problem, x.device)
        elif path in TORCH_PATHS:
            self.path, self.path_reason = path, "forced"
        else:
            raise ValueError(f"unknown torch path {path!r}; expected one of {list(TORCH_PATHS)}")
        self.inputs = inputs
        self.ids = inputs["topk_ids"].reshape(-1).to(torch.int64)
        self.weights = inputs["topk_weights"].float()
        self.out = torch.empty(problem.M, problem.K, dtype=problem.dtype, device=x.device)
        self.experts = torch.arange(problem.E, device=x.device, dtype=self.ids.dtype)
        self.slot_token = torch.arange(problem.M * problem.topk, device=x.device) // problem.topk

    def __call__(self):
        # Dispatch by name: a bound method kept on self would make a reference
        # cycle that holds the shape's weights until Python's cycle collector
        # runs (gigabytes per shape; the worker ran out of GPU memory on an H100).
        if self.path == "grouped_mm":
            self._grouped()
        elif self.path == "gather_bmm":
            self._gather()
        else:
            self._dense()
        return self.out

    def _act(self, h):
        """The activation of [rows, 2N] pre-activations, in fp32, back in the problem's dtype."""
        return self.p.activate(h.float()).to(self.p.dtype)

    def _combine(self, y_slots):
        """out = sum over k of weight * y, y_slots [M * topk, K] in slot order, in fp32."""
        p = self.p
        y = y_slots.view(p.M, p.topk, p.K).float()
        self.out.copy_((y * self.weights[:, :, None]).sum(dim=1))

    def _grouped(self):
        p, inp = self.p, self.inputs
        sorted_e, order = torch.sort(self.ids, stable=True)
        # Per-expert ends of the sorted slots, computed on the device (no sync).
        offs = torch.searchsorted(sorted_e, self.experts, right=True, out_int32=True)
        xs = inp["x"].index_select(0, self.slot_token.index_select(0, order))
        h = torch._grouped_mm(xs, inp["w1"].transpose(1, 2), offs=offs)
        if p.bias:
            h = h + inp["b1"].index_select(0, sorted_e)
        y = torch._grouped_mm(self._act(h), inp["w2"].transpose(1, 2), offs=offs)
        if p.bias:
            y = y + inp["b2"].index_select(0, sorted_e)
        y_slots = torch.empty_like(y).index_copy_(0, order, y)
        self._combine(y_slots)

    def _gather(self):
        p, inp = self.p, self.inputs
        xs = inp["x"].index_select(0, self.slot_token)
        h = torch.bmm(xs[:, None, :], inp["w1"].index_select(0, self.ids).transpose(1, 2))[:, 0]
        if p.bias:
            h = h + inp["b1"].index_select(0, self.ids)
        y = torch.bmm(self._act(h)[:, None, :], inp["w2"].index_select(0, self.ids).transpose(1, 2))[:, 0]
        if p.bias:
            y = y + inp["b2"].index_select(0, self.ids)
        self._combine(y)

    def _dense(self):
        p, inp = self.p, self.inputs
        E, M = p.E, p.M
        h = torch.matmul(inp["x"][None], inp["w1"].transpose(1, 2))  # [E, M, 2N]
        if p.bias:
            h = h + inp["b1"][:, None, :]
        a = self._act(h.reshape(E * M, 2 * p.N)).view(E, M, p.N)
        y = torch.bmm(a, inp["w2"].transpose(1, 2))  # [E, M, K]
        if p.bias:
            y = y + inp["b2"][:, None, :]
        # Routing weights per (token, expert), zero where the token does not go.
        combine = torch.zeros(M, E, dtype=torch.float32, device=h.device)
        combine.scatter_(1, self.ids.view(M, p.topk), self.weights)
        self.out.copy_(torch.einsum("me,emk->mk", combine, y.float()))
