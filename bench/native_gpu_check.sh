#!/usr/bin/env bash
# The native backend on a GPU, end to end, in one command: see
# bench/native_gpu_check.py for the steps. Usage, from the repository root:
#
#   TUNELAB_PYTHON=/opt/torch/.venv/bin/python3 bash bench/native_gpu_check.sh [OUT]
#
# OUT defaults to $OUT, else ./native-gpu-check. The tunelab binary is
# .bin/tunelab ($TUNELAB_BIN): `just gpu-bin` builds it (stripped).
set -u
cd "$(dirname "$0")/.."
if [ -z "${TUNELAB_PYTHON:-}" ]; then
    for p in /opt/torch/.venv/bin/python3 .venv/bin/python python3; do
        if command -v "$p" >/dev/null 2>&1; then TUNELAB_PYTHON=$p; break; fi
    done
fi
export TUNELAB_PYTHON
exec "$TUNELAB_PYTHON" bench/native_gpu_check.py "$@"
