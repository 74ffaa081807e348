"""Triton kernels behind tunelab's builtin problems.

Each module holds one kernel family plus the host-side helpers a problem's
Method needs: splitting a job config into constexprs and launch options, the
grid, a launcher that does nothing but launch, and a compile-only entry point
for the compile workers. The fused MoE's family is split in two halves:
the host side (fused_moe, moe_persistent, quant_moe, which other code
imports from) and its @triton.jit code (moe_kernels, moe_persistent_kernels,
quant_moe_kernels, quant_moe_mx). Modules import triton, so the worker
imports them only after it has chosen between GPU and interpreter mode.
"""
