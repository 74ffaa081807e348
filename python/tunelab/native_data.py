"""A shape's data as a description the native worker builds (`inputs: native`).

With `inputs: native` in a manifest, a lane's Python worker never imports
torch (four seconds of a GPU host's start-up): the problem describes its
inputs and reference as plain data (`native_data(seed)`), the runner's native
worker allocates and fills them on the GPU (src/native/helpers.cu: a seeded
counter-based generator and the reference operators it knows), and a Triton
method's recipe binds the method to stand-in tensors that carry each tensor's
shape, strides and dtype and stand for the built tensors by a made-up
address. docs/native-backend.md, "Inputs built natively", has the design.

A problem's description, from `native_data(seed)`:

    {"tensors": [normal("a", "bf16", (M, K), std), ...],   # the inputs
     "output": output("bf16", (M, N)),                    # what methods write
     "reference": matmul("a", "b")}                        # its fp32 reference

`layout` turns it into the answer the runner reads (the tensors in order:
inputs, the output, the reference) and `stand_ins` into what `bind` is given.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from tunelab.dtypes import element_size, torch_dtype, torch_name

# One element of NaN, as the Python worker poisons outputs (tunelab.native.poison_pattern), for
# each element type the native worker fills and compares, by manifest spelling.
_POISON = {"fp16": "007e", "bf16": "c07f", "fp32": "0000c07f"}
# Stand-in addresses: far apart and 16-byte aligned, as Triton specialises
# pointers by their alignment; never dereferenced.
_ADDRESS_STEP = 1 << 40
_OUTPUT_ADDRESS = 1 << 60


class NativeDataError(ValueError):
    """A description the native worker cannot build; the message says what to change."""


def normal(name: str, dtype: str, shape: Sequence[int], std: float) -> dict:
    """An input of `std * N(0, 1)` draws, rounded once to `dtype`."""
    return {"name": name, "dtype": dtype, "shape": [int(s) for s in shape], "fill": {"normal": {"std": float(std)}}}


def zeros(name: str, dtype: str, shape: Sequence[int]) -> dict:
    return {"name": name, "dtype": dtype, "shape": [int(s) for s in shape], "fill": "zeros"}


def output(dtype: str, shape: Sequence[int]) -> dict:
    """The tensor a method writes (poisoned before every check)."""
    return {"dtype": dtype, "shape": [int(s) for s in shape]}


def matmul(a: str, b: str) -> dict:
    """The reference is `a @ b` in fp32 (a [M, K], b [K, N], row-major)."""
    return {"op": "matmul", "a": a, "b": b}


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _check_tensor(t: dict, what: str):
    if t.get("dtype") not in _POISON:
        raise NativeDataError(f"{what} is {t.get('dtype')!r}; the native worker builds {sorted(_POISON)}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not shape or not all(isinstance(s, int) and s > 0 for s in shape):
        raise NativeDataError(f"{what} has shape {shape!r}; it needs positive sizes")


def layout(description: dict, seed: int) -> dict:
    """The `native_data` answer: every tensor in the native worker's order
    (the inputs, `out`, then `reference`), how each is filled, and the
    reference operator over their indices."""
    inputs = list(description.get("tensors") or [])
    out = description.get("output")
    reference = description.get("reference")
    if not inputs or not isinstance(out, dict) or not isinstance(reference, dict):
        raise NativeDataError("native_data needs 'tensors' (the inputs), 'output' and 'reference'")
    names = [t.get("name") for t in inputs]
    if len(set(names)) != len(names) or {"out", "reference"} & set(names):
        raise NativeDataError(f"input names must be distinct and not 'out' or 'reference'; got {names}")
    for t in inputs:
        _check_tensor(t, f"input {t.get('name')!r}")
    _check_tensor(out, "the output")
    tensors: list[dict[str, Any]] = []
    for stream, t in enumerate(inputs):
        fill = t.get("fill")
        if isinstance(fill, dict) and "normal" in fill:
            fill = {"normal": {"std": float(fill["normal"]["std"]), "stream": stream}}
        elif fill != "zeros":
            raise NativeDataError(f"input {t['name']!r} has fill {fill!r}; normal(...) or zeros(...)")
        tensors.append(_tensor(t["name"], t["dtype"], t["shape"], fill))
    tensors.append(_tensor("out", out["dtype"], out["shape"], None))
    if reference.get("op") != "matmul":
        raise NativeDataError(f"reference op {reference.get('op')!r}; the native worker computes: matmul")
    try:
        a, b = inputs[names.index(reference["a"])], inputs[names.index(reference["b"])]
    except (KeyError, ValueError):
        raise NativeDataError(
            f"the matmul reference names {reference.get('a')!r} and {reference.get('b')!r}; the inputs are {names}"
        ) from None
    if len(a["shape"]) != 2 or len(b["shape"]) != 2 or a["shape"][1] != b["shape"][0]:
        raise NativeDataError(f"matmul of shapes {a['shape']} and {b['shape']}: a [M, K] and b [K, N] needed")
    (m, k), n = a["shape"], b["shape"][1]
    if out["shape"] != [m, n]:
        raise NativeDataError(f"the output has shape {out['shape']}; the matmul's is {[m, n]}")
    tensors.append(_tensor("reference", "fp32", [m, n], None))
    last = len(tensors) - 1
    return {
        "tensors": tensors,
        "out": last - 1,
        "reference": last,
        "poison": _POISON[out["dtype"]],
        "elements": _numel(out["shape"]),
        "uuid": "",
        "seed": int(seed),
        "reference_op": {
            "op": "matmul",
            "a": names.index(reference["a"]),
            "b": names.index(reference["b"]),
            "out": last,
            "m": m,
            "n": n,
            "k": k,
        },
    }


def _tensor(name: str, dtype: str, shape: list, fill) -> dict:
    return {
        "name": name,
        "dtype": torch_name(dtype),
        "shape": list(shape),
        "bytes": _numel(shape) * element_size(dtype),
        "fill": fill,
    }


class _Device:
    """What launchers read of a tensor's device."""

    type = "cuda"
    index = 0


class TensorStandIn:
    """A contiguous tensor that is not there: its shape, strides, dtype (a
    stand-in, tunelab.dtypes) and a made-up address that names a tensor the
    native worker built. Enough for a launcher to bind a kernel and for
    Triton to compile it; nothing reads its memory."""

    device = _Device()

    def __init__(self, dtype_name: str, shape: Sequence[int], address: int):
        self.dtype = torch_dtype(dtype_name)
        self.shape = tuple(int(s) for s in shape)
        self._address = address
        self._element_size = element_size(dtype_name)
        strides, step = [], 1
        for size in reversed(self.shape):
            strides.append(step)
            step *= size
        self._strides = tuple(reversed(strides))

    def data_ptr(self) -> int:
        return self._address

    def stride(self, dim: Optional[int] = None):
        return self._strides if dim is None else self._strides[dim]

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return _numel(self.shape)

    def element_size(self) -> int:
        return self._element_size

    def is_contiguous(self) -> bool:
        return True

    def size(self, dim: Optional[int] = None):
        return self.shape if dim is None else self.shape[dim]


def stand_ins(description: dict) -> tuple[dict, dict]:
    """(the inputs by name, address -> tensor index) for a problem's description."""
    inputs = {}
    addresses = {}
    for i, t in enumerate(description["tensors"]):
        inputs[t["name"]] = TensorStandIn(t["dtype"], t["shape"], (i + 1) * _ADDRESS_STEP)
        addresses[(i + 1) * _ADDRESS_STEP] = i
    return inputs, addresses


def output_stand_in(dtype: str, shape: Sequence[int]) -> TensorStandIn:
    """What a problem's `new_output` gives for stand-in inputs: the recipe
    maps its address to the built output."""
    return TensorStandIn(dtype, shape, _OUTPUT_ADDRESS)


def is_stand_in(tensor) -> bool:
    return isinstance(tensor, TensorStandIn)
