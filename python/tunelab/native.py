"""The Python side of native launches (docs/native-backend.md).

A lane's Python worker builds a shape's inputs and reference once, as for any
method. For native methods it also shares them, and one output tensor, with
the runner's native worker: each tensor's allocation is exported as a CUDA
(or HIP) IPC handle, which the native worker maps into its own address space,
so no byte goes through the host. The native worker launches into the shared
output; this worker then compares it with the reference (`tunelab.compare`,
the same rule as for every method).

For a Triton method launched natively (`launch: native`), this module also
turns the method's bound launch into a recipe the native worker can launch
without Python: the compiled binary, its symbol, block and shared memory, and
each kernel argument as a shared tensor or a typed scalar, in the order of the
compiled kernel's parameters (constexpr parameters, including integers Triton
specialised to 1, are not parameters), followed by Triton's scratch pointers.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any

# Triton scalar types -> the protocol's argument types. Each slot is 8 bytes
# and the driver reads a parameter's own size from it, so the narrower
# integer types travel as i32 / u32 (little-endian: the low bytes are the value).
_SCALAR = {
    "i1": "i32",
    "i8": "i32",
    "i16": "i32",
    "i32": "i32",
    "u1": "u32",
    "u8": "u32",
    "u16": "u32",
    "u32": "u32",
    "i64": "i64",
    "u64": "u64",
    "fp32": "f32",
    "f32": "f32",
    "fp64": "f64",
}

# C types of the protocol's scalar types, for generated launchers.
C_TYPES = {"i32": "int32_t", "u32": "uint32_t", "i64": "int64_t", "u64": "uint64_t", "f32": "float", "f64": "double"}


class NotNative(Exception):
    """The launch cannot be done natively; the message says why."""


# --------------------------------------------------------------------------
# sharing tensors


class _Driver:
    """cuIpcGetMemHandle / cuMemGetAddressRange (or HIP's), through ctypes."""

    def __init__(self, hip: bool):
        if hip:
            self.lib = ctypes.CDLL("libamdhip64.so")
            self._get_handle = self.lib.hipIpcGetMemHandle
            self._range = self.lib.hipMemGetAddressRange
            self.name = "hip"
        else:
            self.lib = ctypes.CDLL("libcuda.so.1")
            self._get_handle = self.lib.cuIpcGetMemHandle
            self._range = self.lib.cuMemGetAddressRange_v2
            self.name = "cu"
        self._get_handle.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        self._range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]

    def export(self, ptr: int):
        """(IPC handle bytes, allocation base) of the allocation holding `ptr`."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        code = self._range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        if code != 0:
            raise RuntimeError(f"{self.name}MemGetAddressRange failed with error {code}")
        handle = ctypes.create_string_buffer(64)
        code = self._get_handle(handle, ctypes.c_uint64(base.value))
        if code != 0:
            raise RuntimeError(
                f"{self.name}IpcGetMemHandle failed with error {code}: the allocation cannot be shared "
                "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True allocates memory IPC cannot export; unset it)"
            )
        return handle.raw, base.value


_DRIVER = None


def _driver(torch):
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver(hip=torch.version.hip is not None)
    return _DRIVER


def dtype_name(torch, dtype) -> str:
    return str(dtype).removeprefix("torch.")


def poison_pattern(torch, dtype) -> bytes:
    """One element of what the worker poisons an output with (see worker._poison)."""
    one = torch.empty(1, dtype=dtype)
    if dtype.is_floating_point or dtype.is_complex:
        one.fill_(float("nan"))
    elif dtype == torch.bool:
        one.fill_(False)
    else:
        one.fill_(torch.iinfo(dtype).min)
    return bytes(one.view(torch.uint8).tolist())


def describe_tensor(torch, name: str, t) -> dict:
    """A shared tensor as the native worker maps it."""
    handle, base = _driver(torch).export(t.data_ptr())
    return {
        "name": name,
        "dtype": dtype_name(torch, t.dtype),
        "element_size": t.element_size(),
        "shape": list(t.shape),
        "strides": list(t.stride()),
        "handle": handle.hex(),
        "offset": t.data_ptr() - base,
        "bytes": t.numel() * t.element_size(),
        "ptr": t.data_ptr(),
    }


def new_output(problem: Any, inputs: Any, expected: Any) -> Any:
    """The output a native method writes: the problem's own (`new_output`), or
    a tensor like the reference."""
    make = getattr(problem, "new_output", None)
    if make is not None:
        return make(inputs)
    import torch

    return torch.empty_like(expected)


# --------------------------------------------------------------------------
# Triton launches


def triton_args(signature: dict, names: list, values: list, tensors: dict, metadata) -> list:
    """The native worker's arguments for a compiled Triton kernel.

    `signature` maps each parameter name to its type as Triton compiled it
    (`"*bf16"`, `"i32"`, `"constexpr"`), `names` and `values` are the
    parameters and the values bound to them in order, and `tensors` maps a
    data pointer to the index of a shared tensor. Pointers name shared
    tensors; scalars carry their type; constexprs are left out. Triton's
    global and profile scratch pointers follow when the compiled kernel has
    them (Triton >= 3.3 and >= 3.5), as sizes per program.
    """
    args = []
    for index, (name, value) in enumerate(zip(names, values)):
        # Keyed by parameter name (Triton >= 3.2), or by position in older releases.
        ty = signature.get(name, signature.get(index))
        if ty is None:
            raise NotNative(f"parameter {name!r} is not in the compiled signature")
        if isinstance(ty, tuple):
            raise NotNative(f"parameter {name!r} is a tuple ({ty}); tuples are not launched natively")
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            ptr = value.data_ptr() if hasattr(value, "data_ptr") else value
            if ptr not in tensors:
                raise NotNative(
                    f"parameter {name!r} points at a tensor the problem's inputs and output do not hold; "
                    "a native launch can pass only those"
                )
            args.append({"tensor": tensors[ptr], "name": name, "type": ty})
            continue
        kind = _SCALAR.get(ty)
        if kind is None:
            raise NotNative(f"parameter {name!r} has type {ty}, which is not launched natively")
        args.append({kind: float(value) if kind.startswith("f") else int(value), "name": name, "type": ty})
    for field, name in (("global_scratch_size", "global_scratch"), ("profile_scratch_size", "profile_scratch")):
        if hasattr(metadata, field):
            args.append({"scratch": int(getattr(metadata, field) or 0), "name": name, "type": "*i8"})
    return args


def triton_recipe(kernel, compiled, grid, values, tensors: dict, cache_dir: str) -> dict:
    """Everything the native worker needs to launch `compiled` as Triton would.

    `kernel` is the JITFunction, `values` the full positional values of its
    parameters (constexprs included, as `tunelab.kernels.launch` binds them).
    The cubin is written to `cache_dir`, named by its hash.
    """
    md = compiled.metadata
    for flag in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(md, flag, False):
            raise NotNative(f"the kernel is compiled with {flag}; it is launched by Python")
    if getattr(md, "num_ctas", 1) != 1:
        raise NotNative(f"num_ctas={md.num_ctas} (thread-block clusters) is launched by Python")
    if getattr(md, "tensordesc_meta", None):
        raise NotNative("tensor descriptors (TMA) are launched by Python")
    try:
        cubin = compiled.asm["cubin"]
    except (AttributeError, KeyError):
        cubin = None
    if not isinstance(cubin, (bytes, bytearray)) or not cubin:
        raise NotNative("the compiled kernel has no cubin (not an NVIDIA target)")
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None)
    if not isinstance(signature, dict):
        raise NotNative("this Triton does not expose the compiled kernel's signature")
    names = [p.name for p in kernel.params]
    args = triton_args(signature, names, list(values), tensors, md)
    os.makedirs(cache_dir, exist_ok=True)
    digest = hashlib.sha256(cubin).hexdigest()[:24]
    path = os.path.join(cache_dir, f"triton-{digest}.cubin")
    if not os.path.exists(path):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    return {
        "image": path,
        "symbol": md.name,
        "grid": list(grid),
        "block": [32 * int(md.num_warps), 1, 1],
        "shared": int(md.shared),
        "args": args,
    }
