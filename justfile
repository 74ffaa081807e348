# tunelab tasks. `just` alone lists them.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list --unsorted

# The Python for tests and bench scripts: .venv if `just setup` made one, else
# python3. (The binary finds the same one for its workers by itself.)
python := env_var_or_default("TUNELAB_PYTHON", if path_exists(".venv/bin/python") == "true" { ".venv/bin/python" } else { "python3" })

# pytest's worker processes (pytest-xdist): one per CPU this process may
# use, at most 4 (each imports torch and Triton; most tests are Triton's
# interpreter, CPU-bound). On the 2-core CI machine two cut pytest from 11 to
# 7 minutes (2026-11-24).
pytest_workers := `python3 -c 'import os; print(min(4, len(os.sched_getaffinity(0))))'`

# The peers' sources the comparisons run (vLLM's bundled triton_kernels and
# its fused-MoE kernel source), from vLLM's wheel (downloaded once into
# $TUNELAB_PEERS_CACHE, default ~/.cache/tunelab/peers) into the git-ignored
# .peers/ (docs/peers.md). Carry .peers to a GPU machine without network.
# Unpack the peers' sources into .peers/ (downloads vLLM's wheel once).
peers *ARGS:
    python3 scripts/peers.py {{ARGS}}

# The tunelab the recipes run: TUNELAB_BIN if set; else the one installed
# (`pip install .` in an active environment puts it on PATH; `just setup`
# puts it in .venv); else this checkout's release binary, which `cargo run`
# builds first (about 7 minutes on 2 cores the first time, seconds after).
# So a machine builds tunelab once either way.
tunelab := env_var_or_default("TUNELAB_BIN", `command -v tunelab || { test -x .venv/bin/tunelab && echo .venv/bin/tunelab; } || echo "cargo run --release --bin tunelab --"`)

# Build the release binary.
build:
    cargo build --release

# Which tunelab the recipes run.
which:
    @echo "{{tunelab}}"

# Workers run in .venv's Python (or TUNELAB_PYTHON, or python3): `tunelab config` says.
# The stripped release binary at .bin/tunelab, for a GPU machine without Rust:
# `bash bench/native_gpu_check.sh` there runs the native backend's GPU check.
gpu-bin:
    cargo build --release
    mkdir -p .bin
    cp target/release/tunelab .bin/tunelab
    strip .bin/tunelab

# Tune an experiment: `just tune gptoss`, `just tune gptoss --only E=32,N=2880`.
tune NAME *ARGS:
    {{tunelab}} run experiments/{{NAME}}.yaml {{ARGS}}

# Compare methods at their baseline (or --use-best) configs.
bench NAME *ARGS:
    {{tunelab}} run experiments/{{NAME}}.yaml --mode bench {{ARGS}}

# Check every manifest in experiments/.
validate:
    {{tunelab}} validate experiments/*.yaml

# Show the jobs a manifest expands to, per method.
plan NAME *ARGS:
    {{tunelab}} plan experiments/{{NAME}}.yaml {{ARGS}}

# Regenerate outputs and report of a results directory from its journal.
report DIR:
    {{tunelab}} report {{DIR}}

# Pack results directories' journals for committing (journal.jsonl -> journal.jsonl.gz).
pack +DIRS:
    {{tunelab}} pack {{DIRS}}

# `pip install .` there gives the `tunelab` command (.venv/bin/tunelab, which
# the recipes then run) and `import tunelab`; it compiles the Rust core once
# (the README says how long), and pip shows its progress.
# Make .venv with torch, triton, numpy, pytest (with pytest-xdist), pandas, mypy and ruff, and install tunelab into it.
setup:
    test -x .venv/bin/python || python3 -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check torch triton numpy
    @echo "setup: installing tunelab: pip compiles its Rust core now (see the README's Install for how long)"
    .venv/bin/python -m pip install --disable-pip-version-check ".[dev]"

# Also the type check and the installed wheel's API tests; pytest names its 15
# slowest tests (CI's time goes mostly to Triton's interpreter).
# Everything CI checks: formatting, lints, the HIP build, Rust tests, Python tests, the interpreter end to end.
test: lint lint-python
    just test-rust
    PYTHONPATH=python {{python}} -m pytest -q -n {{pytest_workers}} --durations=15 python/tests --ignore=python/tests/api
    just typecheck
    just test-api

# cargo-nextest where installed (.config/nextest.toml says why), else cargo
# test. One test more than CPUs: a tenth of the tests' time is spent waiting
# (workers starting, deadlines running out); on 2 cores 3 at once took 263 s
# against 281 s (2026-12-03).
# The Rust tests; the interpreter's need TUNELAB_TEST_PYTHON, which this sets.
test-rust *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    export TUNELAB_TEST_PYTHON={{python}}
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run --all-targets --test-threads "$(( $(nproc) + 1 ))" {{ARGS}}
    else
        cargo test --all-targets {{ARGS}}
    fi

# mypy over the package, the problem protocols and the example user problem (pyproject.toml).
typecheck:
    {{python}} -m mypy

# The wheel (`pip install .`, dev profile: it reuses the crates the test build
# compiled, which Cargo.toml's syn dev-dependency makes the ones it needs, and
# compiles pyo3, the runner's library and the module) goes
# into a fresh venv, target/api-venv, that sees {{python}}'s
# packages (torch, Triton, pytest) through a .pth file; {{python}}'s own
# environment is left as it was.
# Test the Python API and the `tunelab` command as `pip install .` installs them.
test-api:
    #!/usr/bin/env bash
    set -euo pipefail
    {{python}} -m venv --clear target/api-venv
    {{python}} -c 'import sysconfig; print(sysconfig.get_path("purelib")); print(sysconfig.get_path("platlib"))' \
        > "$(target/api-venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/outer-venv.pth"
    target/api-venv/bin/python -m pip install -q --disable-pip-version-check --no-deps . \
        --config-settings=build-args="--profile dev"
    TUNELAB_TEST_INSTALLED=1 target/api-venv/bin/python -m pytest -q --noconftest python/tests/api

# Lint the `hip` feature (AMD discovery); needs HIP headers: apt-get install libamdhip64-dev, or set HIP_PATH.
check-hip:
    #!/usr/bin/env bash
    set -euo pipefail
    for root in "${HIP_PATH:-}" /opt/rocm /usr; do
        if [ -n "$root" ] && [ -f "$root/include/hip/hip_runtime_api.h" ]; then
            HIP_PATH="$root" cargo clippy --features hip --all-targets -- -D warnings
            exit 0
        fi
    done
    echo "check-hip: skipped, no HIP headers found (apt-get install libamdhip64-dev, or set HIP_PATH)"

# The extension module has its own: `just lint-python-native`.
# rustfmt and clippy over the runner and its tests, warnings denied.
lint:
    cargo fmt --all -- --check
    just clippy

# Where HIP headers are found (CI installs them) clippy runs once, with the
# `hip` feature, which compiles all but the two `cfg(not(feature = "hip"))`
# lines a build without it has (the test build compiles those): one pass
# instead of two.
# clippy over the runner and its tests, warnings denied.
clippy:
    #!/usr/bin/env bash
    set -euo pipefail
    for root in "${HIP_PATH:-}" /opt/rocm /usr; do
        if [ -n "$root" ] && [ -f "$root/include/hip/hip_runtime_api.h" ]; then
            HIP_PATH="$root" cargo clippy --features hip --all-targets -- -D warnings
            exit 0
        fi
    done
    cargo clippy --all-targets -- -D warnings

# What `just test` compiles before its first test (clippy's pass and the test
# binaries), run nothing. CI starts it while pip installs torch: pip keeps
# about one core of two busy, and the build takes the other.
# Compile what `just test` compiles, without running anything.
build-tests:
    just clippy
    cargo test --all-targets --no-run

# ruff over the Python code: package, tests, bench and scripts (pyproject.toml's [tool.ruff]).
lint-python:
    {{python}} -m ruff check .
    {{python}} -m ruff format --check .

# Not part of `just test` (CI): it checks pyo3 and the runner's crates once
# more (about a minute on 2 cores); the wheel build in `just test-api`
# compiles the module anyway.
# clippy on the extension module (python/native): needs a Python for pyo3's build script.
lint-python-native:
    PYO3_PYTHON="$({{python}} -c 'import sys; print(sys.executable)')" cargo clippy -p tunelab-python -- -D warnings

# Regenerate schemas/manifest.schema.json and schemas/worker-protocol.schema.json from the Rust types.
schemas:
    cargo run --quiet -- schema > schemas/manifest.schema.json
    cargo run --quiet -- schema --worker-protocol > schemas/worker-protocol.schema.json

# Planner throughput on a 10^7-point space (a measurement, not a test).
bench-plan:
    cargo bench --bench plan_throughput

# How long the aot output takes to render a 500 KB image (a measurement, not a test).
bench-aot:
    cargo bench --bench aot_render

# What a worker call costs beyond the worker's own time (Python and native workers; no GPU needed).
bench-protocol *ARGS:
    TUNELAB_PYTHON={{python}} cargo bench --bench protocol_latency -- {{ARGS}}

# Tuning speed on GPU 0 (autotune vs grid vs halving, each also with native launches; 48 configs); writes results/bench/<gpu>/tuning_speed.*
bench-tuning *ARGS:
    TUNELAB_PYTHON={{python}} {{python}} bench/tuning_speed.py {{ARGS}}

# Search strategies against the exhaustive best on gpt-oss shapes (default --only E=32,N=2880); needs a GPU.
bench-strategies *ARGS: build
    TUNELAB_PYTHON={{python}} {{python}} bench/strategies.py --tunelab target/release/tunelab {{ARGS}}
