"""The kernel workbench: what a worker does with Triton's compiled kernels
beyond timing them.

- `jit`: the worker's hold on Triton's JIT. Every Triton launch and warm-up of
  a job goes through it, so a job's compile options (`maxnreg`, ...) and an
  `ir:` method's IR file reach every kernel the method compiles, and the
  kernels a job compiled are known (their registers, spills, shared memory).
- `irfile`: reading an IR file (entry kernel, signature, module attributes)
  and its content-addressed copy that Triton compiles from.
- `dump`: writing a job's kernels' IR (ttir, ttgir, llir, ptx, cubin, sass)
  and metadata (`run --keep-ir`).
- `passes`: `tunelab ir-pass`: passes of Triton's own pipeline applied to an
  IR file.
- `profile`: `tunelab profile`: winners re-run under Proton and Nsight Compute.

docs/workbench.md describes them for users.
"""
