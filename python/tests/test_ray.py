"""`python -m tunelab.ray` on a local, CPU-only Ray cluster that the test
starts: a sharded interpreter run, merged, against a one-process run.

Skipped, saying why, where Ray is not installed (CI installs it in .ci/run)
or the tunelab binary is not built (`cargo build`; TUNELAB_BIN names another).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install ray; CI installs it in .ci/run)")

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("TUNELAB_BIN", REPO / "target" / "debug" / "tunelab"))
# The workers' Python: this one (CI's .venv has torch, Triton and Ray), or another.
WORKER_PYTHON = os.environ.get("TUNELAB_TEST_PYTHON") or sys.executable


def job_ids(results_dir: pathlib.Path):
    """Every job record's id in a results directory's live journal."""
    lines = (results_dir / "journal.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    return [e["job_id"] for e in entries if e["type"] == "job"]


@pytest.mark.skipif(not BINARY.is_file(), reason=f"no tunelab binary at {BINARY} (cargo build)")
def test_a_sharded_ray_run_merges_into_the_jobs_of_one_run(tmp_path):
    manifest = "experiments/quickstart.yaml"
    one = tmp_path / "one"
    subprocess.run(
        [str(BINARY), "run", manifest, "--interpret", "--quiet", "--python", WORKER_PYTHON, "--results-dir", str(one)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    want = job_ids(one / "quickstart" / "cpu-interpreter")

    merged = tmp_path / "ray"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), RAY_AUTH_MODE="disabled")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunelab.ray",
            manifest,
            "--shards",
            "2",
            "--interpret",
            "--num-cpus",
            "2",
            "--tunelab",
            str(BINARY),
            "--results-dir",
            str(merged),
            "--",
            "--python",
            WORKER_PYTHON,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "jobs finished over all shards" in out.stdout, out.stdout
    got = job_ids(merged / "quickstart" / "cpu-interpreter")
    assert len(got) == len(set(got)), "no job ran twice"
    assert sorted(got) == sorted(want), "the merged job set is one run's"
    # Each shard ran a share of its own.
    shards = [job_ids(merged / ".shards" / "2" / str(k) / "quickstart" / "cpu-interpreter") for k in (1, 2)]
    assert all(shards) and not set(shards[0]) & set(shards[1])
    assert (merged / "quickstart" / "cpu-interpreter" / "report.md").is_file()
