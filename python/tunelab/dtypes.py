"""The dtype spellings manifests use, mapped to torch dtypes.

A compile worker never imports torch (it costs seconds; see tunelab.target):
there `use_stand_ins()` makes `torch_dtype` return stand-ins that Triton's
specialisation reads exactly as it reads torch dtypes (it goes by the dtype's
name), and `pointer` gives the tensor stand-in a compile-only launch passes.
"""

from tunelab.lazy import torch

_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4}
_STAND_INS = None  # name -> DtypeStandIn, once a compile worker asks for them


class DtypeStandIn:
    """Spelled like the torch dtype it stands for ("torch.bfloat16").

    One object per dtype, never copied: Triton caches what a dtype maps to by
    the object, so two objects for one dtype would be two cache entries.
    """

    def __init__(self, torch_name: str):
        self._torch_name = torch_name

    def __str__(self):
        return f"torch.{self._torch_name}"

    __repr__ = __str__


class PointerStandIn:
    """What Triton's JIT sees of a tensor argument: a dtype and a 16-byte aligned address."""

    def __init__(self, dtype):
        self.dtype = dtype

    @staticmethod
    def data_ptr():
        return 0


def use_stand_ins() -> None:
    """From now on `torch_dtype` and `INDEX`/`WEIGHT` dtypes are stand-ins (compile workers)."""
    global _STAND_INS
    names = {**_NAMES, "i32": "int32", "u8": "uint8", "fp8e4m3": "float8_e4m3fn"}
    _STAND_INS = {name: DtypeStandIn(torch_name) for name, torch_name in names.items()}


def stand_ins_active() -> bool:
    """Whether this process uses stand-ins (it has no torch and sees no GPU)."""
    return _STAND_INS is not None


def torch_name(name: str) -> str:
    """torch's name for a manifest dtype ("bf16" -> "bfloat16"), without torch."""
    if name not in _NAMES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_NAMES)}")
    return _NAMES[name]


def torch_dtype(name: str):
    if name not in _NAMES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_NAMES)}")
    if _STAND_INS is not None:
        return _STAND_INS[name]
    return getattr(torch, _NAMES[name])


def int32():
    """torch.int32, or its stand-in in a compile worker."""
    return _STAND_INS["i32"] if _STAND_INS is not None else torch.int32


def uint8():
    """torch.uint8 (packed MXFP4 values, E8M0 scales), or its stand-in in a compile worker."""
    return _STAND_INS["u8"] if _STAND_INS is not None else torch.uint8


def fp8_e4m3():
    """torch.float8_e4m3fn (fp8 weights and activations), or its stand-in in a compile worker."""
    return _STAND_INS["fp8e4m3"] if _STAND_INS is not None else torch.float8_e4m3fn


def is_fp32(dtype) -> bool:
    return str(dtype) == "torch.float32"


def pointer(dtype):
    """A stand-in for a contiguous tensor of `dtype`, for compiling without launching."""
    return PointerStandIn(dtype)


def element_size(name: str) -> int:
    return _SIZES[name]
