"""The moe problem's methods that call the user's installed libraries: vLLM's
`fused_experts` (the `vllm` method, tuned through vLLM's own config override)
and AMD aiter's `fused_moe` (the `aiter` method). Each is usable only where
its library imports and a GPU runs it, and says why not elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunelab.kernels.launch import interpreting
from tunelab.lazy import torch
from tunelab.problems.moe import CONFIG_KEYS, vllm_default_config

if TYPE_CHECKING:
    from tunelab.problems.moe import FusedMoE


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class VllmMoE:
    """vLLM's own `fused_experts` and kernel, the config set through vLLM's `override_config` (a tuned space), or vLLM's own choice where the config is empty.

    The config's keys are vLLM's file keys (BLOCK_SIZE_M, BLOCK_SIZE_N,
    BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages); keys a config leaves
    out take vLLM 0.33's default (`vllm_default_config`). vLLM reads the
    override on the host when it picks the call's config
    (`try_get_optimal_moe_config`), so the launch holds it around each call
    and a CUDA graph captures the kernels it chose. With no key at all the
    call runs with vLLM's own choice (its tuned JSON files or its default).
    Biases go in through `biased_moe_quant_config` (or the older
    `w1_bias`/`w2_bias` arguments); gpt-oss's activation is "swigluoai".
    Unquantised weights only."""  # noqa: E501 - its first line is the description

    name = "vllm"
    kind = "library"
    config_keys = CONFIG_KEYS
    config_types = {key: int for key in CONFIG_KEYS}

    @property
    def description(self) -> str:
        """The docstring's first line and the vLLM found (the run header records it)."""
        first = (type(self).__doc__ or "").strip().splitlines()[0]
        if not _installed("vllm"):
            return first
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{first} (vllm {version('vllm')})"
        except PackageNotFoundError:
            return first

    def unavailable(self, problem: FusedMoE):
        if not _installed("vllm"):
            return "vLLM is not installed in the worker's Python environment"
        if interpreting():
            return "vLLM's fused_experts needs a GPU (this worker runs Triton's interpreter)"
        if problem.quantised:
            return f"tunelab passes only unquantised weights to vLLM's fused_experts, not {problem.weight_format}"
        entry = _vllm_entry()
        if isinstance(entry, str):
            return entry
        if problem.bias and entry["bias"] is None:
            return "this vLLM's fused_experts takes no expert biases (no biased_moe_quant_config, no w1_bias)"
        return None

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method vllm cannot run here: {reason}")
        entry = _vllm_entry()
        assert not isinstance(entry, str)  # unavailable() said so otherwise
        return _LibraryLaunch(problem, inputs, _vllm_call(problem, inputs, entry, vllm_override(problem, config)))


def vllm_override(problem: FusedMoE, config: dict) -> dict | None:
    """The config vLLM's override gets: the config's file keys over vLLM 0.33's
    default, or None (vLLM's own choice) when the config names none."""
    given = {k: int(config[k]) for k in CONFIG_KEYS if k in config}
    if not given:
        return None
    full = vllm_default_config(problem.M, problem.E)
    full.update(given)
    return full


_VLLM = None


def _vllm_entry():
    """{"fn", "bias", "activation"} for the installed vLLM, or a one-line reason it cannot be used."""
    global _VLLM
    if _VLLM is None:
        import inspect

        try:
            from vllm.model_executor.layers.fused_moe import fused_experts
        except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
            _VLLM = f"vLLM is installed but fused_experts does not import ({type(exc).__name__}: {exc})"
            return _VLLM
        params = inspect.signature(fused_experts).parameters
        bias = None
        if "quant_config" in params:
            try:
                from vllm.model_executor.layers.fused_moe.config import biased_moe_quant_config  # noqa: F401 - does this vLLM have it

                bias = "quant_config"
            except ImportError:
                pass
        if bias is None and "w1_bias" in params:
            bias = "w1_bias"
        act = params.get("activation")
        try:
            from vllm.model_executor.layers.fused_moe import override_config
        except ImportError:
            override_config = None
        _VLLM = {
            "fn": fused_experts,
            "bias": bias,
            "activation": None if act is None else act.default,
            "override": override_config,
        }
    return _VLLM


def _vllm_call(problem: FusedMoE, inputs: dict, entry: dict, override: dict | None = None):
    import enum

    name = "swigluoai" if problem.activation == "swiglu_oai" else "silu"
    default = entry["activation"]
    # Newer vLLM takes an Enum whose values are these names; older ones take the string.
    activation = type(default)(name) if isinstance(default, enum.Enum) else name
    kwargs = {"activation": activation}
    if problem.bias:
        if entry["bias"] == "quant_config":
            from vllm.model_executor.layers.fused_moe.config import biased_moe_quant_config

            kwargs["quant_config"] = biased_moe_quant_config(inputs["b1"], inputs["b2"])
        else:
            kwargs.update(w1_bias=inputs["b1"], w2_bias=inputs["b2"])
    fn, args = entry["fn"], (inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"])
    if override is None:
        return lambda: fn(*args, **kwargs)
    if entry.get("override") is None:
        raise RuntimeError(
            "this vLLM has no override_config (vllm.model_executor.layers.fused_moe): its kernel's "
            "config cannot be set, so only an empty config (vLLM's own choice) runs"
        )
    override_config = entry["override"]

    def call():
        with override_config(override):
            return fn(*args, **kwargs)

    return call


class AiterMoE:
    """AMD aiter's `fused_moe` (aiter.fused_moe), SiLU-and-mul without biases
    in fp16/bf16, aiter's own kernel choice: no config keys. aiter runs on
    ROCm only. gpt-oss's clamped, interleaved SwiGLU with biases is not mapped
    onto aiter's activation types (tunelab cannot check such a mapping
    anywhere it runs), so those shapes report themselves unavailable."""

    name = "aiter"
    kind = "library"
    config_keys = ()
    config_types: dict = {}

    def unavailable(self, problem: FusedMoE):
        if not _installed("aiter"):
            return "aiter is not installed in the worker's Python environment"
        if interpreting() or not getattr(torch.version, "hip", None):
            return "aiter runs on AMD GPUs only (this worker has no ROCm GPU)"
        if problem.activation != "silu" or problem.bias:
            return "tunelab maps only SiLU-and-mul without biases onto aiter's fused_moe"
        if problem.dtype_name not in ("fp16", "bf16"):
            return f"aiter's fused_moe takes fp16 or bf16, not {problem.dtype_name}"
        try:
            from aiter.fused_moe import fused_moe  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            return f"aiter is installed but fused_moe does not import ({type(exc).__name__}: {exc})"
        return None

    def bind(self, problem: FusedMoE, inputs: dict, config: dict):
        reason = self.unavailable(problem)
        if reason:
            raise RuntimeError(f"method aiter cannot run here: {reason}")
        from aiter import ActivationType, QuantType
        from aiter.fused_moe import fused_moe

        args = (inputs["x"], inputs["w1"], inputs["w2"], inputs["topk_weights"], inputs["topk_ids"])
        call = lambda: fused_moe(*args, activation=ActivationType.Silu, quant_type=QuantType.No)  # noqa: E731
        return _LibraryLaunch(problem, inputs, call)


class _LibraryLaunch:
    """A library call that returns its output: copied into the preallocated `out`."""

    def __init__(self, problem: FusedMoE, inputs: dict, call):
        self.out = torch.empty(problem.M, problem.K, dtype=problem.dtype, device=inputs["x"].device)
        self._call = call

    def __call__(self):
        self.out.copy_(self._call())
        return self.out
