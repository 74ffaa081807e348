"""Tolerance comparison of a method's output against the reference.

A pure function over two tensors so the worker's correctness gate can be unit
tested without a worker, a GPU or a kernel. Every number it returns is a plain
Python int or float and is finite, so it can go straight into a JSON response
(JSON has no NaN or infinity, and the Rust runner rejects them).
"""

import torch

# Added to |ref| in the relative error so that a zero reference gives a large
# but finite ratio instead of a division by zero.
_TINY = torch.finfo(torch.float32).tiny


def reference_fault(ref) -> str | None:
    """Why `ref` cannot be a reference, or None: a NaN or an infinity in it
    would fail every method's check with a mismatch that names no cause."""
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point():
        return None
    values = ref.detach()
    nan = int(torch.isnan(values).sum())
    inf = int(torch.isinf(values).sum())
    if nan == 0 and inf == 0:
        return None
    found = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n)
    return (
        f"the reference output holds {found} values (of {values.numel()}): the problem's reference or "
        "its inputs overflow at this shape, so no method can be checked against it"
    )


def compare(out, ref, atol: float, rtol: float, max_mismatch: float) -> dict:
    """Compare `out` with `ref` elementwise, both taken as fp32.

    An element mismatches when |out - ref| > atol + rtol * |ref| (a NaN on
    either side always mismatches). The check passes when the output holds no
    NaN or infinity and at most `max_mismatch` (a fraction) of the elements
    mismatch. The error maxima are taken over elements where both sides are
    finite, so one NaN does not hide how far off the rest of the output is.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape {tuple(ref.shape)}")
    got = out.detach().to(torch.float32)
    want = ref.detach().to(device=got.device, dtype=torch.float32)

    nan_count = int(torch.isnan(got).sum())
    inf_count = int(torch.isinf(got).sum())
    elements = got.numel()

    err = (got - want).abs()
    allowed = atol + rtol * want.abs()
    # `err <= allowed` is False for NaN, so NaN outputs count as mismatches.
    mismatch = elements - int((err <= allowed).sum())

    finite = torch.isfinite(got) & torch.isfinite(want)
    finite_err = err[finite]
    if finite_err.numel() > 0:
        max_abs_err = float(finite_err.max())
        # fp64: a large error over a zero reference divided by TINY overflows fp32.
        rel = finite_err.double() / (want[finite].abs().double() + _TINY)
        max_rel_err = float(rel.max())
    else:
        max_abs_err = 0.0
        max_rel_err = 0.0

    mismatch_frac = mismatch / elements if elements else 0.0
    return {
        "passed": nan_count + inf_count == 0 and mismatch_frac <= max_mismatch,
        "max_abs_err": max_abs_err,
        "max_rel_err": max_rel_err,
        "mismatch": mismatch,
        "mismatch_frac": mismatch_frac,
        "nan_count": nan_count,
        "inf_count": inf_count,
        "elements": elements,
    }
