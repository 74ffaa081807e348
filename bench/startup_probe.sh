#!/usr/bin/env bash
# Experiment: where the lane's start-up goes, with and without the compile pool beside it.
set -u
PY=${PY:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "$@" | tee -a "$OUT/startup.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/startup.txt"
nproc | tee -a "$OUT/startup.txt"
for i in 1 2 3; do
  $PY - <<'PYEOF' 2>&1 | tee -a "$OUT/startup.txt"
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
import triton
t3 = time.perf_counter()
print(f"alone: import torch {t1-t0:.3f} s, cuda up {t2-t1:.3f} s, import triton {t3-t2:.3f} s")
PYEOF
done
# A wrapper that runs compile workers at a lower priority (nice 10).
cat > /tmp/py-nice <<W
#!/usr/bin/env bash
case " \$* " in *" --role compile "*) exec nice -n 10 $PY "\$@";; esac
exec $PY "\$@"
W
chmod +x /tmp/py-nice
run() { # name python extra...
  local name=$1 py=$2; shift 2
  rm -rf /tmp/cache-$name /tmp/res-$name
  local t0=$(date +%s%N)
  TRITON_CACHE_DIR=/tmp/cache-$name CUDA_VISIBLE_DEVICES=0 .bin/tunelab run experiments/bench-gemm.yaml \
    --set methods.triton.launch=native --trace "$OUT/$name.trace.json" --python "$py" --quiet \
    --results-dir /tmp/res-$name "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s%N)
  log "$name: rc $rc, wall $(( (t1 - t0) / 1000000 )) ms"
  $PY bench/trace_breakdown.py "$OUT/$name.trace.json" 2>&1 | grep -E "wall|compile pool|lane0: ready|native worker" | tee -a "$OUT/startup.txt"
}
run default-1 $PY
run nice-1 /tmp/py-nice
run cw8-1 $PY --compile-workers 8
run default-2 $PY
run nice-2 /tmp/py-nice
run cw8-2 $PY --compile-workers 8
cd "$OUT" && gzip -f *.trace.json
