"""The Python API and the `tunelab` entry point, as installed (`pip install .`).

Run against the installed wheel, never the checkout's python/ (which has no
compiled extension):

    python -m pytest --noconftest python/tests/api

`--noconftest` keeps python/tests/conftest.py, which puts python/ first on
sys.path for the worker tests, out of it. With TUNELAB_TEST_INSTALLED=1 (as
`just test-api` and CI set it) the first test fails unless the package comes
from site-packages. No GPU needed: runs use Triton's interpreter.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import tunelab

try:
    from tunelab import _native
except ImportError:
    # The checkout's python/tunelab (first on sys.path under python/tests/conftest.py) has no extension.
    if os.environ.get("TUNELAB_TEST_INSTALLED") == "1":
        raise
    pytest.skip(
        "the API tests run against the installed package: `just test-api` (pip install ., then pytest --noconftest)",
        allow_module_level=True,
    )

REPO = pathlib.Path(__file__).resolve().parents[3]
QUICKSTART = "experiments/quickstart.yaml"
BAD = "tests/fixtures/bad"
# The console script pip installed next to this interpreter.
ENTRY_POINT = pathlib.Path(sys.executable).parent / "tunelab"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    """Paths as the README writes them, relative to the repository root."""
    monkeypatch.chdir(REPO)
    # Workers must find tunelab as installed, not through a checkout on PYTHONPATH.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("TUNELAB_PYTHON", raising=False)


def command(*args, cwd=REPO, env=None, **kwargs):
    """The installed `tunelab` command, as a user runs it."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUNELAB_PYTHON")}
    environment.update(env or {})
    return subprocess.run(
        [str(ENTRY_POINT), *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600, **kwargs
    )


def test_the_package_under_test_is_the_installed_one():
    assert ENTRY_POINT.is_file(), f"no console script at {ENTRY_POINT}: is tunelab installed in {sys.executable}?"
    if os.environ.get("TUNELAB_TEST_INSTALLED") == "1":
        checkout = REPO / "python"
        for module in (tunelab, _native):
            assert checkout not in pathlib.Path(module.__file__).resolve().parents, module.__file__
    assert tunelab.__version__ == _native.__version__


# -- load / validate -----------------------------------------------------------


def test_load_returns_the_resolved_experiment():
    exp = tunelab.load(QUICKSTART)
    assert exp["name"] == "quickstart"
    assert exp["problem"] == "gemm"
    assert [m["name"] for m in exp["methods"]] == ["triton", "cuda", "torch"]
    triton = exp["methods"][0]
    assert triton["space"]["num_warps"] == [4, 8]
    assert triton["params"] == {"GROUP_SIZE_M": 8}
    assert len(triton["constraints"]) == 2
    assert exp["shapes"][0] == {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    assert exp["search"]["strategy"] == "grid"
    assert len(exp["interpreter"]["shapes"]) == 2


def test_load_applies_overrides():
    exp = tunelab.load(QUICKSTART, overrides={"protocol.min_samples": 50, "shapes.fixed.dtype": "fp16"})
    assert exp["protocol"]["min_samples"] == 50
    assert all(s["dtype"] == "fp16" for s in exp["shapes"])


@pytest.mark.parametrize(
    "name, where",
    [("unknown_key.yaml", "unknown_key.yaml:9:5"), ("yaml_syntax.yaml", "yaml_syntax.yaml:5:1")],
)
def test_a_bad_manifest_raises_the_commands_diagnostics(name, where):
    path = f"{BAD}/{name}"
    with pytest.raises(tunelab.ManifestError) as raised:
        tunelab.load(path)
    message = str(raised.value)
    assert where in message, message
    assert isinstance(raised.value, ValueError)
    # Word for word what `tunelab validate` prints.
    cli = command("validate", path)
    assert cli.returncode == 2
    assert cli.stderr == message


def test_validate_plans_too_and_reports_every_error():
    with pytest.raises(tunelab.ManifestError) as raised:
        tunelab.validate(f"{BAD}/rejects_all.yaml")
    assert "rejects_all.yaml:" in str(raised.value)
    summary = tunelab.validate(QUICKSTART)
    assert summary["shapes"] == 2 and summary["jobs"] > 0


def test_a_bad_only_filter_is_a_manifest_error():
    with pytest.raises(tunelab.ManifestError, match="nosuchkey"):
        tunelab.plan(QUICKSTART, only="nosuchkey=1")


def test_a_bad_device_profile_is_a_settings_error():
    with pytest.raises(tunelab.SettingsError, match="unknown device profile"):
        tunelab.plan(QUICKSTART, device="tpu")


# -- plan ----------------------------------------------------------------------


def test_plan_is_the_commands_json():
    summary = tunelab.plan(QUICKSTART, only="M=1024", device="h100")
    cli = command("plan", QUICKSTART, "--only", "M=1024", "--json", "--device", "h100")
    assert cli.returncode == 0, cli.stderr
    assert summary == json.loads(cli.stdout)
    assert summary["experiment"] == "quickstart"
    assert summary["shapes"] == 1
    assert summary["jobs"] == sum(m["jobs"] for m in summary["methods"])
    triton = summary["methods"][0]
    assert triton["method"] == "triton"
    assert triton["valid"] == triton["points"] - sum(n for _, n in triton["removed"])


def test_plan_with_jobs_lists_every_job():
    planned = tunelab.plan(QUICKSTART, interpret=True, jobs=True)
    jobs = planned["job_list"]
    assert len(jobs) == planned["jobs"] > 0
    cli = command("plan", QUICKSTART, "--interpret", "--jobs")
    assert [json.loads(line) for line in cli.stdout.splitlines()] == jobs
    assert {j["method"] for j in jobs} == {"triton", "cuda", "torch"}
    assert all({"id", "shape", "config", "baseline"} <= set(j) for j in jobs)


def test_schema_is_the_committed_one():
    assert tunelab.schema() == (REPO / "schemas/manifest.schema.json").read_text()


# -- journals ------------------------------------------------------------------


def test_read_journal_gives_records_runs_and_finals():
    records = tunelab.read_journal("tests/fixtures/journals/gemm.jsonl")
    assert isinstance(records, list) and len(records) > 0
    assert all({"job_id", "method", "shape", "config", "status"} <= set(r) for r in records)
    assert len({r["job_id"] for r in records}) == len(records), "one record per job"
    assert records.runs and records.runs[-1]["experiment"] == "quickstart"
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r["stats"]["median_us"] > 0 for r in ok)


def test_read_journal_names_the_jobs_a_later_definition_superseded(tmp_path):
    # A kernel edited between two runs: the same method, shape and config
    # recorded again under a new job id.
    lines = (REPO / "tests/fixtures/journals/gemm.jsonl").read_text().splitlines()
    first_job = next(json.loads(line) for line in lines if '"job_id"' in line and '"status"' in line)
    again = dict(first_job, job_id="feedfacefeedface")
    journal = tmp_path / "journal.jsonl"
    journal.write_text("\n".join(lines + [json.dumps(again)]) + "\n")
    records = tunelab.read_journal(journal)
    assert records.superseded == {first_job["job_id"]}
    current = records.current()
    assert len(current) == len(records) - 1
    assert {r["job_id"] for r in current} >= {"feedfacefeedface"}
    assert tunelab.read_journal("tests/fixtures/journals/gemm.jsonl").superseded == set()


def test_records_as_a_dataframe():
    pandas = pytest.importorskip("pandas")
    records = tunelab.read_journal("tests/fixtures/journals/moe.jsonl")
    frame = records.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert len(frame) == len(records)
    for column in ("job_id", "method", "status", "shape.M", "config.BLOCK_SIZE_M", "stats.median_us"):
        assert column in frame.columns, column
    best = frame[frame["status"] == "ok"].groupby("shape.M")["stats.median_us"].min()
    assert (best > 0).all()


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch):
    records = tunelab.read_journal("tests/fixtures/journals/gemm.jsonl")
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas -> ImportError
    with pytest.raises(ImportError, match="pip install pandas"):
        records.to_pandas()


def test_compare_a_run_with_itself_is_all_same():
    journal = "tests/fixtures/journals/moe.jsonl"
    cmp = tunelab.compare(journal, journal, fail_on_slower=0.02)
    assert cmp["rows"], cmp["notes"]
    assert {r["verdict"] for r in cmp["rows"]} == {"SAME"}
    assert cmp["geomean_speedup"] == pytest.approx(1.0)
    assert cmp["regressions"] == []
    assert "SAME" in cmp["markdown"]


def test_compare_against_a_shipped_file_is_the_commands():
    shipped = "experiments/shipped/vllm/E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json"
    run_dir = "results/gptoss/NVIDIA_H100_80GB_HBM3"
    cmp = tunelab.compare(shipped, run_dir)
    assert len(cmp["rows"]) == 18, "one row per M of the shipped file"
    assert all(r["new_method"] == "triton_vllm" for r in cmp["rows"])
    assert all(r["speedup"] == pytest.approx(r["base_us"] / r["new_us"]) for r in cmp["rows"])
    printed = command("compare", shipped, run_dir)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == cmp["markdown"]


def test_compare_says_which_side_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        tunelab.compare(tmp_path, "tests/fixtures/journals/moe.jsonl")


def test_reading_where_there_is_no_journal(tmp_path):
    with pytest.raises(FileNotFoundError, match="no journal"):
        tunelab.read_journal(tmp_path)


# -- run -----------------------------------------------------------------------


def test_run_calls_back_with_every_job_and_resumes(tmp_path):
    seen = []
    # The GIL is released while the run works: another Python thread keeps going.
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.wait(0.01):
            ticks.append(time.monotonic())

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    try:
        result = tunelab.run(QUICKSTART, interpret=True, quiet=True, results_dir=tmp_path, on_job=seen.append)
    finally:
        stop.set()
        ticker.join()
    took = time.monotonic() - started
    assert len(ticks) > 0.2 * took / 0.01, f"{len(ticks)} ticks in {took:.1f} s"
    assert result.exit_code == 0 and result.ok
    assert result.results == [tmp_path / "quickstart" / "cpu-interpreter"]
    records = result.records()
    planned = records.runs[-1]["planned_jobs"]
    assert len(seen) == planned == result.new_records == len(records)
    assert [r["job_id"] for r in seen] == [r["job_id"] for r in records]
    assert seen == list(records), "the callback gets the journal's records"
    # The CUDA C++ method needs a GPU: recorded as skipped (unavailable) in the interpreter.
    assert all(r["status"] == "ok" for r in seen if r["method"] != "cuda")
    assert all(
        r["status"] == "skipped" and r["failure"]["class"] == "unavailable" for r in seen if r["method"] == "cuda"
    )
    # Workers ran in this Python (the default), importing the installed package.
    fingerprint = records.runs[-1]["fingerprint"]
    assert fingerprint["python"] == ".".join(map(str, sys.version_info[:3]))

    again = []
    resumed = tunelab.run(QUICKSTART, interpret=True, quiet=True, results_dir=tmp_path, on_job=again.append)
    # Resuming runs nothing again. The jobs whose method could not run here
    # are asked again (they wait for a machine that can run them), and said
    # the same, so nothing new is recorded: the journal's history stays.
    assert resumed.exit_code == 0 and resumed.new_records == len(again) == 0
    assert resumed.records().runs[-1]["planned_jobs"] == 0


def test_a_callback_that_raises_does_not_stop_the_run(tmp_path):
    calls = []

    def callback(record):
        calls.append(record)
        raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        tunelab.run(QUICKSTART, interpret=True, quiet=True, results_dir=tmp_path, on_job=callback, only="M=32")
    assert len(calls) == 1, "no calls after the first exception"
    records = tunelab.read_journal(tmp_path / "quickstart" / "cpu-interpreter")
    assert len(records) == records.runs[-1]["planned_jobs"] > 1, "the run went on"


def test_run_refuses_a_bad_manifest_before_running(tmp_path):
    with pytest.raises(tunelab.ManifestError, match="unknown_key.yaml:9:5"):
        tunelab.run(f"{BAD}/unknown_key.yaml", interpret=True, results_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_run_with_an_unusable_python_raises_with_its_exit_code(tmp_path):
    with pytest.raises(tunelab.TunelabError) as raised:
        tunelab.run(QUICKSTART, interpret=True, quiet=True, results_dir=tmp_path, python=str(tmp_path / "nopython"))
    assert raised.value.exit_code == 4


def test_ctrl_c_stops_an_api_run_with_keyboard_interrupt(tmp_path):
    # In a child: the runner's Ctrl-C flag is process-wide and stays set.
    script = f"""
import os, signal, sys, tunelab
def on_job(record):
    os.kill(os.getpid(), signal.SIGINT)
try:
    tunelab.run({QUICKSTART!r}, interpret=True, quiet=True, results_dir={str(tmp_path)!r}, on_job=on_job)
except KeyboardInterrupt:
    records = tunelab.read_journal({str(tmp_path / "quickstart" / "cpu-interpreter")!r})
    print("interrupted after", len(records), "of", records.runs[-1]["planned_jobs"])
    try:
        tunelab.run({QUICKSTART!r}, interpret=True, quiet=True, results_dir={str(tmp_path)!r})
    except RuntimeError as e:
        print("then:", e)
    sys.exit(0)
sys.exit("not interrupted")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    said = next(line for line in out.stdout.splitlines() if line.startswith("interrupted after"))
    done, planned = (int(w) for w in said.split()[2:5:2])
    assert 1 <= done < planned, out.stdout
    assert "start a new Python process" in out.stdout


# -- the entry point ---------------------------------------------------------------


def test_entry_point_exit_codes_and_streams():
    ok = command("validate", QUICKSTART)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok  {QUICKSTART}  (2 shapes, ")
    assert ok.stderr == ""

    bad = command("validate", f"{BAD}/unknown_key.yaml")
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert "unknown_key.yaml:9:5" in bad.stderr and "did you mean `space`" in bad.stderr

    usage = command("frobnicate")
    assert usage.returncode == 2
    assert "Usage: tunelab" in usage.stderr

    version = command("--version")
    assert version.returncode == 0
    assert version.stdout == f"tunelab {tunelab.__version__}\n"

    missing = command("report", "/nonexistent/results")
    assert missing.returncode == 2
    assert "no such folder: /nonexistent/results" in missing.stderr


def test_entry_point_output_survives_a_pipe_closed_early():
    # `tunelab plan --jobs | head -1`: stop quietly, as the binary does.
    pipeline = subprocess.run(
        f"{ENTRY_POINT} plan {QUICKSTART} --jobs | head -1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pipeline.returncode == 0
    assert len(pipeline.stdout.splitlines()) == 1
    assert "panicked" not in pipeline.stderr


def test_entry_point_ctrl_c_finishes_the_job_in_flight_and_exits_130(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUNELAB_PYTHON")}
    child = subprocess.Popen(
        [str(ENTRY_POINT), "run", QUICKSTART, "--interpret", "--quiet", "--results-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    journal = tmp_path / "quickstart" / "cpu-interpreter" / "journal.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if journal.is_file() and '"type":"job"' in journal.read_text():
            break
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stdout + stderr
    records = tunelab.read_journal(journal.parent)
    assert 1 <= len(records) < records.runs[-1]["planned_jobs"]
    assert all(r["status"] == "ok" for r in records), "the job in flight was finished, not cut"


def test_the_default_python_is_the_one_tunelab_is_installed_in(tmp_path):
    shown = command("config", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("python"))
    assert line.endswith("# default: the Python tunelab is installed in"), line
    # The script's interpreter (its shebang: python or python3 of this environment).
    python = pathlib.Path(line.split("=", 1)[1].split("#")[0].strip())
    assert python.parent == pathlib.Path(sys.executable).parent, line
    assert _native.default_python() == (sys.executable, "default: the Python tunelab is installed in")

    # The usual layers still win over it.
    flagged = command("config", "--python", "/opt/py/bin/python3", cwd=tmp_path)
    assert "/opt/py/bin/python3" in flagged.stdout and "command-line flag" in flagged.stdout
    (tmp_path / "tunelab.toml").write_text('python = "/from/settings/python"\n')
    from_file = command("config", cwd=tmp_path, env={"TUNELAB_PYTHON": "/from/env/python"})
    assert "/from/env/python" in from_file.stdout and "TUNELAB_PYTHON" in from_file.stdout


def test_doctor_finds_the_installed_worker_package(tmp_path):
    doctor = command("doctor", cwd=tmp_path)
    worker = next(line for line in doctor.stdout.splitlines() if line.startswith("worker"))
    assert "installed in this Python" in worker, doctor.stdout
    assert str(REPO / "python") not in worker or os.environ.get("TUNELAB_TEST_INSTALLED") != "1"
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    # The wheel's command: its last line is the verdict, and it gives no
    # advice that needs a checkout and Cargo.
    assert doctor.stdout.splitlines()[-1].startswith("verdict     ready"), doctor.stdout
    assert "cargo" not in doctor.stdout + doctor.stderr, doctor.stdout
