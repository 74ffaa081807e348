"""Triton kernels behind tunelab's builtin problems.

Each module holds one kernel family plus the host-side helpers a problem's
Method needs: splitting a job config into constexprs and launch options, the
grid, a launcher that does nothing but launch, and a compile-only entry point
for the compile workers. Modules import triton, so the worker imports them only
after it has chosen between GPU and interpreter mode.
"""
