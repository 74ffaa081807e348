"""The dtype spellings manifests use, mapped to torch dtypes."""

import torch

TORCH_DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


def torch_dtype(name: str):
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(TORCH_DTYPES)}") from None


def element_size(name: str) -> int:
    return {"fp16": 2, "bf16": 2, "fp32": 4}[name]
