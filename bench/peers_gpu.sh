#!/usr/bin/env bash
# The GPU half of the peers comparison (docs/peers.md), on an sm_90 GPU (H200)
# in the repository root, with `.peers` carried (`just peers` unpacks it where
# there is network) and the stripped release binary at .bin/tunelab (`just gpu-bin`):
#
#   bash bench/peers_gpu.sh
#
# 1. The GPU tests: fused_moe_vllm's GEMMs against vLLM 0.33.0's own kernel
#    source bit for bit (test_vllm_mirror.py), and the triton_kernels method
#    against the problem's MXFP4 reference, with the constraints it sets and
#    under a CUDA graph (test_moe_triton_kernels.py). About a minute.
# 2. experiments/gptoss-mxfp4.yaml at N = 2880 (both models, every M): the
#    new methods and the new M values; the committed journal's jobs are
#    resumed, not run again. The plan is printed first; measured jobs
#    (surrogate budget 8 and the baseline per group): 24 triton_kernels
#    groups of 9, 24 triton_kernels_heuristic jobs, 36 new groups of
#    tunelab's methods (12 shapes x triton, triton_dot_scaled, triton_ptx)
#    of 9: about 564 jobs, estimated 4-6 minutes (triton_kernels compiles in
#    the lane: two matmul kernels per new config).
#    PEERS_RUN_TIMEOUT=SECONDS interrupts the run then (it resumes next time).
#    PEERS_METHODS=triton_kernels runs only the two triton_kernels methods
#    (24 groups; tunelab's own methods keep the M values they have).
# 3. The comparison table (bench/peers_summary.py, into
#    results/bench/<device>/peers_summary.md), and the journal packed.
set -euo pipefail
PY=${TUNELAB_PYTHON:-python3}
BIN=${TUNELAB_BIN:-.bin/tunelab}
if [ ! -f .peers/manifest.json ]; then
    echo "peers_gpu: no .peers/manifest.json: run 'just peers' where there is network and carry .peers" >&2
    exit 2
fi
cat .peers/manifest.json | head -12
start=$(date +%s)
# A failing test is reported, not fatal: the timings below are the other half
# of the evidence, and a GPU session is short.
tests=0
PYTHONPATH=python "$PY" -m pytest -q python/tests/test_vllm_mirror.py python/tests/test_moe_triton_kernels.py || tests=$?
echo "peers_gpu: tests took $(( $(date +%s) - start )) s, exit $tests"
only="N=2880"
if [ "${PEERS_METHODS:-}" = triton_kernels ]; then
    only="N=2880,method=triton_kernels,method=triton_kernels_heuristic"
fi
"$BIN" plan experiments/gptoss-mxfp4.yaml --only "$only"
start=$(date +%s)
status=0
# PEERS_RUN_TIMEOUT (seconds): the run is interrupted then (SIGINT: what it
# recorded stays, and the next run resumes from it).
limit=()
if [ -n "${PEERS_RUN_TIMEOUT:-}" ]; then
    limit=(timeout -s INT "$PEERS_RUN_TIMEOUT")
fi
TUNELAB_PYTHON="$PY" "${limit[@]}" "$BIN" run experiments/gptoss-mxfp4.yaml --only "$only" || status=$?
echo "peers_gpu: run took $(( $(date +%s) - start )) s, exit $status"
for dir in results/gptoss-mxfp4/*/; do
    [ "$(basename "$dir")" = cpu-interpreter ] && continue
    # Benchmark evidence goes under results/bench/ (a results directory holds only the manifest's outputs).
    mkdir -p "results/bench/$(basename "$dir")"
    "$PY" bench/peers_summary.py "$dir" | tee "results/bench/$(basename "$dir")/peers_summary.md"
    "$BIN" pack "$dir"
done
[ "$status" = 0 ] && status=$tests
exit $status
