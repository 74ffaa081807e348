"""bench/tuning_speed.py and bench/trace_breakdown.py without a GPU: the
native contenders' command lines, the breakdown of a native lane's trace
(built here as tunelab's Rust code writes one: src/trace.rs,
src/backend/worker.rs, src/backend/native/), the check that a native run
really launched natively, the goal verdicts on synthetic rows, and the
markdown."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import load_bench

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


@pytest.fixture(scope="module")
def ts():
    return load_bench("tuning_speed")


@pytest.fixture(scope="module")
def tb():
    return load_bench("trace_breakdown")


class Trace:
    """Chrome trace events as tunelab::trace::write emits them: a named thread per track, X spans in µs."""

    def __init__(self):
        self.events, self.tids = [], {}

    def span(self, track, name, ts, dur, **args):
        if track not in self.tids:
            self.tids[track] = len(self.tids)
            self.events.append(
                {"name": "thread_name", "ph": "M", "pid": 1, "tid": self.tids[track], "args": {"name": track}}
            )
        self.events.append(
            {"name": name, "ph": "X", "pid": 1, "tid": self.tids[track], "ts": ts, "dur": dur, "args": args}
        )

    def call(self, track, op, ts, dur, worker_us, job=None):
        # Worker::call: the round trip, the job it names, the worker's own time.
        self.span(track, op, ts, dur, job=job, worker_us=worker_us, outcome="ok")

    def write(self, path):
        path.write_text(json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms"}))
        return path


def native_lane_trace():
    """Two Triton jobs with `launch: native` on lane 0, as the lane makes its calls (src/backend/native/lane_backend/).

    Every span is 100 µs unless said; protocol (round trip minus worker_us) per call is in the comments.
    """
    t = Trace()
    t.span("lane0", "start-up", 0, 5000, pid=1)
    t.call("lane0", "hello", 100, 4800, 200)  # not protocol: hello holds the worker's start-up
    t.span("lane0 jobs", "group", 6000, 2600, shape={"M": 8}, method="triton", jobs=2)
    t.call("lane0", "describe", 6010, 100, 90)  # 10
    # Job A: the first native job starts the native worker (helper kernels, start-up with hello inside).
    t.span("lane0 jobs", "wait for compile", 6120, 1, job="A")
    t.span("native0", "helper kernels", 6125, 200, ok=True)
    t.span("native0", "start-up", 6330, 1000, pid=2)
    t.call("native0", "hello", 6340, 980, 900)
    t.call("lane0", "share", 7340, 100, 80)  # 20
    t.call("native0", "import", 7450, 10, 5)  # 5
    t.call("lane0", "recipe", 7470, 100, 70, job="A")  # 30
    t.call("native0", "check", 7580, 100, 95, job="A")  # 5
    t.call("lane0", "compare", 7690, 100, 60)  # 40 (compare names no job)
    t.call("native0", "warmup", 7800, 100, 98, job="A")  # 2
    t.call("native0", "sample", 7910, 100, 99, job="A")  # 1
    # Job B: the shape is shared already.
    t.span("lane0 jobs", "wait for compile", 8020, 1, job="B")
    t.call("lane0", "recipe", 8030, 100, 70, job="B")  # 30
    t.call("native0", "check", 8140, 100, 95, job="B")  # 5
    t.call("lane0", "compare", 8250, 100, 60)  # 40
    t.call("native0", "warmup", 8360, 100, 98, job="B")  # 2
    t.call("native0", "sample", 8470, 100, 99, job="B")  # 1
    # After the group: shutdowns (not protocol), the journal's appends on the writer thread.
    t.call("native0", "shutdown", 8700, 10, 1)
    t.call("lane0", "shutdown", 8720, 10, 1)
    t.span("journal", "append", 7950, 500)
    t.span("journal", "append", 8580, 300)
    return t


# Group 2600 µs; covered: describe 100, waits 2, helper kernels 200, native start-up 1000 (its hello
# inside), share 100, import 10, 5 calls x 100 for each job: 2412; between calls 188 µs, 94 µs a job.
RUNNER_MS_PER_JOB = 0.094
# Protocol: Python 10 + 20 + 30 + 40 + 30 + 40 = 170 over 6 calls; native 5 + 5 + 2 + 1 + 5 + 2 + 1 = 21 over 7.
PROTOCOL_MS_PER_JOB = (170 + 21) / 2 / 1e3


def test_a_native_lane_is_its_python_and_native_tracks_together(tb, tmp_path):
    b = tb.breakdown(native_lane_trace().write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert list(b["lanes"]) == ["lane0"]  # native0 is part of lane 0, not a lane of its own
    assert lane["jobs"] == 2
    assert lane["native"]["jobs"] == 2
    assert lane["native"]["calls"]["check"]["calls"] == 2
    assert "helper kernels" not in lane["native"]["calls"] and "start-up" not in lane["native"]["calls"]
    assert lane["native"]["startup_in_groups_s"] == pytest.approx(1200e-6)
    assert lane["native"]["ready_s"] == pytest.approx(7330e-6)
    assert lane["runner_ms_per_job"] == pytest.approx(RUNNER_MS_PER_JOB)
    assert lane["protocol_ms_per_job"] == pytest.approx(PROTOCOL_MS_PER_JOB)
    assert lane["python_calls_per_job"] == 3 and lane["native"]["calls_per_job"] == 3.5
    assert lane["python_protocol_us_per_call"] == pytest.approx(170 / 6)
    assert lane["native"]["protocol_us_per_call"] == pytest.approx(21 / 7)
    assert tb.overhead_per_job_ms(b) == pytest.approx(RUNNER_MS_PER_JOB + PROTOCOL_MS_PER_JOB)
    text = tb.render(b)
    assert "native worker (native0): 2 of 2 jobs checked there" in text
    assert "runner overhead per job (between calls + protocol): 0.190 ms" in text


def test_how_the_lane_met_its_replies_is_counted_over_both_workers(tb, tmp_path):
    t = native_lane_trace()
    assert tb.breakdown(t.write(tmp_path / "old.json"))["lanes"]["lane0"]["replies_met"] is None
    # A runner that records `met`: every counted call says how its reply came (hello and shutdown do
    # not count).
    for e in t.events:
        if e["ph"] == "X" and "worker_us" in e["args"]:
            e["args"]["met"] = "asleep" if e["name"] in ("recipe", "hello") else "spinning"
            # And the workers say how they met the requests: the Python worker's recipe after the
            # native calls found it asleep.
            e["args"]["worker_met"] = "asleep" if e["name"] == "recipe" else "spinning"
    b = tb.breakdown(t.write(tmp_path / "met.json"))
    lane = b["lanes"]["lane0"]
    assert lane["replies_met"] == {"asleep": 2, "spinning": 11}
    assert lane["python_requests_met"] == {"asleep": 2, "spinning": 4}
    assert lane["native"]["requests_met"] == {"spinning": 7}
    text = tb.render(b)
    assert "replies met: asleep 2, spinning 11" in text
    assert "requests met by the Python worker: asleep 2, spinning 4" in text
    assert "requests met by the native worker: spinning 7" in text


def test_a_python_lane_is_unchanged_by_the_native_accounting(tb, tmp_path):
    t = Trace()
    t.span("lane0", "start-up", 0, 5000, pid=1)
    t.call("lane0", "hello", 100, 4800, 200)
    # The probe before the first group is start-up, as hello is: its 400 µs are not any job's.
    t.call("lane0", "probe", 5000, 500, 100)
    t.span("lane0 jobs", "group", 6000, 1000, jobs=2)
    t.call("lane0", "describe", 6010, 100, 90)  # 10
    for job, at in (("A", 6200), ("B", 6600)):
        t.call("lane0", "check", at, 100, 80, job=job)  # 20
        t.call("lane0", "warmup", at + 100, 100, 90, job=job)  # 10
        t.call("lane0", "sample", at + 200, 100, 70, job=job)  # 30
    t.call("lane0", "shutdown", 7100, 10, 1)
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert lane["native"] is None and lane["jobs"] == 2
    # 1000 - 100 (describe) - 6 x 100 = 300 µs between calls; protocol 10 + 2 x 60 = 130 µs.
    assert lane["runner_ms_per_job"] == pytest.approx(0.150)
    assert tb.overhead_per_job_ms(b) == pytest.approx(0.150 + 0.065)


def test_checks_sent_ahead_count_what_the_worker_waited_not_what_the_lane_did(tb, tmp_path):
    t = Trace()
    t.span("lane0", "start-up", 0, 5000, pid=1)
    t.call("lane0", "hello", 100, 4800, 200)
    t.span("native0", "start-up", 200, 300, pid=2)
    t.call("native0", "hello", 210, 280, 250)
    t.span("lane0 jobs", "group", 6000, 1350, jobs=3)
    t.call("lane0", "describe", 6010, 100, 90)  # 10
    t.call("lane0", "recipes", 6120, 100, 80)  # 20
    # Job A's check waited for (the first), B's and C's sent while the one before ran: each span starts
    # when the answer before it was read, and the lane recorded A and B inside B's and C's spans.
    t.call("native0", "check", 6230, 400, 390, job="A")  # 10
    # Their protocol is the worker's own wait before each (idle_us), not round trip minus worker time
    # (5 and 3: the lane read A's and B's answers a little late).
    t.span("native0", "check", 6630, 350, job="B", worker_us=345, outcome="ok", sent_ahead=True, worker_idle_us=4)  # 4
    t.span("native0", "check", 6980, 350, job="C", worker_us=347, outcome="ok", sent_ahead=True, worker_idle_us=2)  # 2
    t.call("native0", "shutdown", 7400, 10, 1)
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert lane["jobs"] == 3 and lane["native"]["checks_sent_ahead"] == 2
    # 1350 - 100 - 100 - 1100 = 50 µs between calls (the start of the group, before describe, and
    # its end); protocol 10 + 20 + 10 + 4 + 2 = 46 µs.
    assert lane["runner_ms_per_job"] == pytest.approx(0.050 / 3)
    assert tb.overhead_per_job_ms(b) == pytest.approx((0.050 + 0.046) / 3)
    assert lane["native"]["sent_ahead_idle_us"] == 3 and lane["native"]["sent_ahead_round_trip_us"] == 4
    assert (
        "checks sent ahead (before the answer ahead of them was read): 2 of 3; the native worker "
        "waited 3 us (median) between its answer and each (counted as its protocol; round trip minus "
        "worker time 4 us)"
    ) in tb.render(b)
    # A runner whose native worker does not say how long it waited: round trip minus worker time.
    for e in t.events:
        e.get("args", {}).pop("worker_idle_us", None)
    b = tb.breakdown(t.write(tmp_path / "older.json"))
    assert tb.overhead_per_job_ms(b) == pytest.approx((0.050 + 0.048) / 3)


def test_a_wait_for_a_compile_with_a_check_under_way_is_not_protocol(tb, tmp_path):
    """`inputs: native`: the lane times jobs beside the compile pool, and may wait for the next job's
    compile with a check under way (reading its answer after the wait) or leave the native worker idle
    before a check it sends ahead. Those waits are the compile pool's, not the runner's."""
    t = Trace()
    t.span("lane0", "start-up", 0, 500, pid=1)
    t.call("lane0", "hello", 10, 480, 100)
    t.span("lane0 jobs", "group", 1000, 3000, jobs=3)
    t.call("native0", "check", 1000, 100, 90, job="A")  # 10
    # B's check was sent, then the lane waited 1000 µs for C's compile and read B's answer after it.
    t.call("native0", "check", 1100, 1200, 95, job="B")  # 1200 - 95 - 1000 = 105
    t.span("lane0 jobs", "wait for compile", 1200, 1000, job="C", recipe=True)
    # C's check went out ahead after that wait; the worker had idled 1100 µs, 1000 of them in the wait.
    t.span(
        "native0", "check", 2300, 100, job="C", worker_us=90, outcome="ok", sent_ahead=True, worker_idle_us=1100
    )  # 100
    # The finalists' re-timing rested the GPU 400 µs: neither protocol nor runner time.
    t.span("lane0 jobs", "rest", 2500, 400)
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert lane["wait_for_compile_s"] == pytest.approx(0.001)
    assert lane["protocol_ms_per_job"] == pytest.approx((10 + 105 + 100) / 3 / 1e3)
    # 3000 µs of group - the calls (100 + 1200, the wait inside it, + 100) - the rest (400) = 1200 µs.
    assert lane["rest_s"] == pytest.approx(0.0004)
    assert lane["runner_between_calls_s"] == pytest.approx(0.0012)
    assert "GPU resting between the finalists' re-timing batches" in tb.render(b)
    # C's recipe came with its compile (a wait saying so); A's and B's did not.
    assert lane["native"]["recipes_from_pool"] == 1
    assert "launch recipes made by the compile pool with the compile: 1 of 3 jobs" in tb.render(b)


def gpu_wait_trace(at=True):
    """A native lane timing jobs beside the compile pool (`inputs: native`), its workers saying when
    they read each request (`worker_at_us`; dropped with at=False, as older runners wrote). µs."""
    t = Trace()

    def call(track, op, ts, dur, worker_us, read_at, job=None, **args):
        extra = {"worker_at_us": read_at} if at else {}
        t.span(track, op, ts, dur, job=job, worker_us=worker_us, outcome="ok", **args, **extra)

    t.span("lane0", "start-up", 0, 500, pid=1)
    t.call("lane0", "hello", 10, 480, 100)
    for job, end in (("A", 1500), ("B", 2000), ("C", 3000)):
        t.span("compile0", "compile", end - 400, 400, job=job)
    t.span("lane0 jobs", "group", 1000, 4000, jobs=3)
    # A slow describe (a worker slow to wake) while nothing is compiled yet: it delays nothing.
    call("lane0", "describe", 1010, 400, 10, 1200)
    call("native0", "build", 1420, 50, 40, 1425)
    t.span("lane0 jobs", "wait for compile", 1470, 30, job="A", recipe=True)
    # A compiled at 1500, read at 1520: 20. The lane read A's answer 80 µs late, with B's check
    # already queued: the worker went on to B 10 µs after answering A (B compiled at 2000): 10.
    call("native0", "check", 1500, 600, 500, 1520, job="A")
    call("native0", "check", 2100, 400, 300, 2030, job="B", sent_ahead=True, worker_idle_us=10)
    t.span("lane0 jobs", "wait for compile", 2500, 500, job="C", recipe=True)
    # C compiled at 3000, read at 3050: 50.
    call("native0", "check", 3000, 300, 200, 3050, job="C")
    # Every job begun: the rest of the group waits on the runner alone, but for the protocol's rest.
    # Idle 3250-3310, 3490-3500, 4500-4510 and 4790-5000: 290.
    call("native0", "check", 3300, 200, 180, 3310, job="A")
    t.span("lane0 jobs", "rest", 3500, 1000)
    call("native0", "check", 4500, 300, 280, 4510, job="B")
    return t


def test_the_gpu_waited_for_the_runner_only_while_a_compiled_job_waited(tb, tmp_path):
    b = tb.breakdown(gpu_wait_trace().write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert lane["jobs"] == 3
    assert lane["gpu_waited_ms_per_job"] == pytest.approx((20 + 10 + 50 + 290) / 3 / 1e3)
    assert tb.gpu_waited_ms_per_job(b) == lane["gpu_waited_ms_per_job"]
    # The lane's side counts the slow describe and A's late answer, which delayed nothing.
    assert tb.overhead_per_job_ms(b) > lane["gpu_waited_ms_per_job"] + 0.3 / 3
    assert (
        "GPU waited for the runner per job (the worker that times idle while a compiled job was ready for it): 0.123 ms"
    ) in tb.render(b)
    # Traces whose workers do not say when they read each request: not known.
    b = tb.breakdown(gpu_wait_trace(at=False).write(tmp_path / "older.json"))
    assert b["lanes"]["lane0"]["gpu_waited_ms_per_job"] is None and tb.gpu_waited_ms_per_job(b) is None
    assert "GPU waited" not in tb.render(b)


def test_a_worker_slow_to_write_its_reply_is_counted(tb, tmp_path):
    # Two compiled jobs. The worker had A's answer at 1200 but (preempted) wrote it only at 1500: B's
    # check, sent ahead, was read at 1510 with 10 µs of idle_us. The GPU waited 1000-1010, 1200-1510
    # and 1790-1800: 330, though the worker's own idle_us says 10.
    t = Trace()
    t.span("lane0", "start-up", 0, 500, pid=1)
    t.span("lane0 jobs", "group", 1000, 800, jobs=2)
    t.span("native0", "check", 1000, 510, job="A", worker_us=190, outcome="ok", worker_at_us=1010)
    t.span(
        "native0",
        "check",
        1510,
        290,
        job="B",
        worker_us=280,
        outcome="ok",
        worker_at_us=1510,
        sent_ahead=True,
        worker_idle_us=10,
    )
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    lane = b["lanes"]["lane0"]
    assert lane["gpu_waited_ms_per_job"] == pytest.approx(((1010 - 1000) + (1510 - 1200) + (1800 - 1790)) / 2 / 1e3)


def test_a_lost_call_is_busy_over_its_span_and_a_restart_is_not_waiting(tb, tmp_path):
    t = gpu_wait_trace()
    # A check lost to a timeout (no answer: no worker times), then the lane's worker restarted.
    t.span("native0", "check", 4800, 100, job="C", worker_us=None, outcome="lost")
    t.span("lane0", "start-up", 4900, 100, pid=3)
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    # As before, less 4800-5000, now covered by the lost call and the start-up (4790-4800 stays).
    assert b["lanes"]["lane0"]["gpu_waited_ms_per_job"] == pytest.approx((20 + 10 + 50 + 290 - 200) / 3 / 1e3)


def test_on_a_python_lane_the_python_worker_is_the_one_that_times(tb, tmp_path):
    t = Trace()
    t.span("lane0", "start-up", 0, 500, pid=1)
    t.span("lane0 jobs", "group", 1000, 1000, jobs=2)
    # No compile spans: both jobs ready from the group's start. Idle 1000-1050, 1300-1400, 1700-2000.
    t.span("lane0", "check", 1040, 300, job="A", worker_us=250, outcome="ok", worker_at_us=1050)
    t.span("lane0", "check", 1390, 320, job="B", worker_us=300, outcome="ok", worker_at_us=1400)
    b = tb.breakdown(t.write(tmp_path / "trace.json"))
    assert b["lanes"]["lane0"]["gpu_waited_ms_per_job"] == pytest.approx((50 + 100 + 300) / 2 / 1e3)


def test_native_overhead_adds_the_journal_and_names_its_parts(ts, tb, tmp_path):
    out = ts.overhead_from_trace(tb.breakdown(native_lane_trace().write(tmp_path / "trace.json")))
    journal_ms = 0.4  # mean of the 500 and 300 µs appends
    assert out["overhead_ms_per_job"] == pytest.approx(RUNNER_MS_PER_JOB + PROTOCOL_MS_PER_JOB + journal_ms)
    assert out["lane_overhead_ms_per_job"] == pytest.approx(RUNNER_MS_PER_JOB + PROTOCOL_MS_PER_JOB)
    parts = out["overhead_parts_ms"]
    assert parts["between_calls"] == pytest.approx(RUNNER_MS_PER_JOB)
    assert parts["protocol_python"] == pytest.approx(0.085) and parts["protocol_native"] == pytest.approx(0.0105)
    assert parts["journal"] == pytest.approx(journal_ms)


def test_a_native_run_that_fell_back_to_python_is_an_error(ts, tb, tmp_path):
    ok = tb.breakdown(native_lane_trace().write(tmp_path / "native.json"))
    ts.check_native_ran("native-grid", ok, "", tmp_path)  # every job checked natively: no error
    # The same run with job B checked by the Python worker (a native worker that did not start).
    t = native_lane_trace()
    t.events = [e for e in t.events if not (e.get("name") == "check" and e["args"].get("job") == "B")]
    t.call("lane0", "check", 8140, 100, 95, job="B")
    partial = tb.breakdown(t.write(tmp_path / "partial.json"))
    with pytest.raises(ts.BenchError, match="checked 1 of 2 jobs"):
        ts.check_native_ran("native-grid", partial, "warning: method `triton` (launch: native) ...", tmp_path)
    # No native track at all (NVRTC missing: every launch from Python).
    t = Trace()
    t.span("lane0 jobs", "group", 0, 1000)
    t.call("lane0", "check", 10, 100, 90, job="A")
    with pytest.raises(ts.BenchError, match="checked 0 of 1 jobs"):
        ts.check_native_ran("native-grid", tb.breakdown(t.write(tmp_path / "python.json")), "", tmp_path)


def test_native_contenders_run_the_same_manifest_with_an_override(ts, tmp_path):
    args = ts.parse_args(["--contenders", "native-halving,autotune,native-grid"])
    assert args.contenders == ["autotune", "native-grid", "native-halving"]
    grid = ts.tunelab_command("tunelab", "native-grid", tmp_path)
    halving = ts.tunelab_command("tunelab", "native-halving", tmp_path)
    assert grid[:3] == ["tunelab", "run", "experiments/bench-gemm.yaml"]
    assert grid[-2:] == ["--set", "methods.triton.launch=native"] and "search.strategy=halving" not in grid
    assert "search.strategy=halving" in halving and "methods.triton.launch=native" in halving
    assert "methods.triton.launch=native" not in ts.tunelab_command("tunelab", "halving", tmp_path)
    with pytest.raises(SystemExit):
        ts.parse_args(["--contenders", "native-random"])
    inputs = ts.tunelab_command("tunelab", "native-inputs-halving", tmp_path)
    assert inputs[-4:] == ["--set", "methods.triton.launch=native", "--set", "inputs=native"]
    assert "search.strategy=halving" in inputs
    assert "inputs=native" not in grid
    raced = ts.tunelab_command("tunelab", "native-inputs-raced-grid", tmp_path)
    assert raced[-6:] == [
        "--set",
        "methods.triton.launch=native",
        "--set",
        "inputs=native",
        "--set",
        "protocol.race=0.05",
    ]
    assert not any(a.startswith("search.strategy") for a in raced)
    assert all("protocol.race" not in a for a in inputs)


def _row(ts, winner, wall_s, retimed_us, **extra):
    keys = ts.CONFIG_KEYS
    config = dict(zip(keys, winner))
    return {"winner": config, "wall_s": wall_s, "winner_retimed_us": retimed_us, "gpu_util": None, **extra}


BEST = (128, 256, 64, 8, 8, 4)
OTHER = (128, 128, 64, 8, 8, 3)


def _rows(ts, native_grid_wall, native_overhead, native_winner=BEST, native_retimed=200.0):
    auto = _row(ts, BEST, 32.0, 200.0, process_s=40.0, gap_to_grid_pct=0.0, same_winner_as_grid=True)
    rows = {"autotune": auto, "grid": _row(ts, BEST, 8.0, 200.0, gap_to_grid_pct=0.0, speedup_vs_autotune=4.0)}
    rows["native-grid"] = _row(
        ts,
        native_winner,
        native_grid_wall,
        native_retimed,
        speedup_vs_autotune=32.0 / native_grid_wall,
        speedup_vs_autotune_process=40.0 / native_grid_wall,
        lane_overhead_ms_per_job=native_overhead,
        overhead_ms_per_job=native_overhead + 0.02,
        overhead_parts_ms={"between_calls": 0.05, "protocol_python": 0.1, "protocol_native": 0.01, "journal": 0.02},
    )
    return rows


def _native_goals(ts, goals):
    return {g["goal"]: g for g in goals if g["goal"].startswith((ts.GOALS[4], ts.GOALS[5]))}


def test_native_goals_against_both_autotune_figures(ts):
    # 4.5 s: 7.1x the tuning call (32 s), 8.9x autotune's whole process (40 s).
    goals = _native_goals(ts, ts.goal_status(_rows(ts, 4.5, 0.15)))
    call = next(g for k, g in goals.items() if "tuning call" in k)
    process = next(g for k, g in goals.items() if "whole process" in k)
    overhead = next(g for k, g in goals.items() if k.startswith(ts.GOALS[5]))
    assert "native-grid" in call["goal"] and "32.0 s" in call["goal"] and "40.0 s" in process["goal"]
    assert (call["met"], process["met"]) == (False, True)
    assert call["measured"].startswith("7.1x") and process["measured"].startswith("8.9x")
    assert "same config" in call["measured"]
    assert overhead["met"] and overhead["measured"].startswith("0.150 ms per job")
    assert "of the native worker's 0.010" in overhead["measured"]
    assert "not counted: the journal append, 0.020" in overhead["measured"]
    assert len(goals) == 3  # no native-halving row: no goal for it


def test_native_goals_need_the_winner_and_the_overhead(ts):
    # 3 s is 10.7x and 13.3x, but autotune's winner is 2 % faster than native-grid's (re-timed): not met.
    goals = ts.goal_status(_rows(ts, 3.0, 0.25, native_winner=OTHER, native_retimed=204.0))
    native = _native_goals(ts, goals)
    speed = [g for k, g in native.items() if k.startswith(ts.GOALS[4])]
    assert len(speed) == 2 and not any(g["met"] for g in speed)
    assert "differs and is -1.96 %" in speed[0]["measured"]
    # Within 1 %: met.
    goals = ts.goal_status(_rows(ts, 3.0, 0.25, native_winner=OTHER, native_retimed=201.0))
    assert all(g["met"] for k, g in _native_goals(ts, goals).items() if k.startswith(ts.GOALS[4]))
    # 0.25 ms per job is over 0.2 ms.
    overhead = [g for k, g in _native_goals(ts, goals).items() if k.startswith(ts.GOALS[5])]
    assert len(overhead) == 1 and not overhead[0]["met"]


def test_the_native_overhead_goal_counts_what_the_gpu_waited_where_the_trace_says(ts):
    # The lane's side is 0.25 ms a job, but the native worker waited 0.12 ms a job for the runner: met,
    # with the lane's figure shown beside it.
    rows = _rows(ts, 3.0, 0.25)
    rows["native-grid"]["gpu_waited_ms_per_job"] = 0.12
    overhead = [g for k, g in _native_goals(ts, ts.goal_status(rows)).items() if k.startswith(ts.GOALS[5])]
    assert len(overhead) == 1 and overhead[0]["met"]
    assert "what the GPU waited for the runner" in overhead[0]["goal"]
    assert overhead[0]["measured"].startswith(
        "0.120 ms per job; the lane's side, another measure: 0.250 (between calls 0.050"
    )
    rows["native-grid"]["gpu_waited_ms_per_job"] = 0.21
    overhead = [g for k, g in _native_goals(ts, ts.goal_status(rows)).items() if k.startswith(ts.GOALS[5])]
    assert not overhead[0]["met"]


def test_the_markdown_shows_native_contenders_and_their_goals(ts, tb, tmp_path):
    shape = {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16"}
    winner = dict(zip(ts.CONFIG_KEYS, BEST))
    util = {"mean": 0.5, "samples": 10, "source": "NVML"}
    autotune = {
        "wall_s": 32.0,
        "process_s": 40.0,
        "bench_time_s": 30.0,
        "util": util,
        "winner": winner,
        "winner_us": 185.0,
        "winner_us_autotuner": 185.0,
        "configs_timed": 48,
        "configs_failed": 0,
        "check": {"passed": True},
    }
    native = {
        "wall_s": 4.0,
        "util": util,
        "winner": winner,
        "winner_us": 184.0,
        "winner_from_final": True,
        "counts": {"ok": 48},
        "failures": [],
        "timed_kernel_fraction": 0.3,
        "timed_kernel_fraction_with_finals": 0.35,
        "exit_code": 0,
        "tunelab_log_tail": [],
        **ts.overhead_from_trace(tb.breakdown(native_lane_trace().write(tmp_path / "t.json"))),
    }
    env = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "sm_count": 132,
        "cuda": "13.0",
        "torch": "2",
        "triton": "3",
        "python": "3.12",
        "cpus": 16,
        "tunelab": ".bin/tunelab",
        "tunelab_version": "0.1.0",
        "nvrtc": "NVRTC 13.0 (wheel)",
    }
    verify = {"retimed": [{"config": winner, "us": 199.0}], "launch_cost": None}
    commands = {"self": "python3 bench/tuning_speed.py", "contenders": {"native-grid": "tunelab run ..."}}
    facts = ts.assemble(shape, [winner] * 48, env, {"autotune": autotune, "native-grid": native}, verify, commands, [])
    assert facts["grid_reference"] == "native-grid"
    assert facts["contenders"]["native-grid"]["speedup_vs_autotune_process"] == pytest.approx(10.0)
    assert facts["contenders"]["autotune"]["speedup_vs_autotune_process"] is None
    md = ts.render_markdown(facts)
    assert "| tunelab grid, native launches | 4.0 | 8.0x | 10.0x |" in md
    assert "--set methods.triton.launch=native" in md
    # 8.0x the tuning call and 10.0x the whole process: both at least 8x, with the same winner.
    assert f"- met: {ts.GOALS[4]} (native-grid, 4.0 s; against autotune's tuning call, 32.0 s): 8.0x" in md
    assert f"- met: {ts.GOALS[4]} (native-grid, 4.0 s; against autotune's whole process, 40.0 s): 10.0x" in md
    # 0.190 ms waited for the runner (the 0.4 ms journal append is shown, not counted): met.
    assert (
        f"- met: {ts.GOALS[5]} (native-grid; between calls + protocol, the lane's side: the trace does not "
        "say when the workers began each request): 0.190 ms"
    ) in md
    assert "**tunelab grid, native launches**" in md and "native worker (native0)" in md
    json.dumps(facts)  # the JSON file is this dict


def _binary():
    binary = next(
        (
            p
            for p in (
                REPO / ".bin" / "tunelab",
                REPO / "target" / "release" / "tunelab",
                REPO / "target" / "debug" / "tunelab",
            )
            if p.is_file()
        ),
        None,
    )
    if binary is None:
        pytest.skip("no tunelab binary built")
    return binary


def test_a_real_run_without_native_launches_is_caught(ts, tmp_path):
    # tunelab's interpreter launches `launch: native` Triton methods from Python (no GPU): the
    # trace the binary writes then has no native worker, and the native contender must fail.
    wrapper = tmp_path / "tunelab"
    wrapper.write_text(
        f'#!/bin/sh\nif [ "$1" = run ]; then shift; exec {_binary()} run --interpret "$@"; fi\nexec {_binary()} "$@"\n'
    )
    wrapper.chmod(0o755)
    grid = ts.run_tunelab(wrapper, "grid", tmp_path, "0")
    assert grid["breakdown"]["lanes"]["lane0"]["jobs"] == 2 and grid["overhead_ms_per_job"] is not None
    with pytest.raises(ts.BenchError, match="the native worker checked 0 of 2 jobs"):
        ts.run_tunelab(wrapper, "native-grid", tmp_path, "0")


def test_dry_run_lists_the_native_contenders(tmp_path):
    binary = _binary()
    proc = subprocess.run(
        [sys.executable, str(BENCH / "tuning_speed.py"), "--dry-run", "--tunelab", str(binary)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TUNELAB_PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for name in ("autotune", "grid", "halving", "native-grid", "native-halving"):
        assert f"    {name}: " in out
    native_line = next(line for line in out.splitlines() if line.startswith("    native-grid: "))
    assert native_line.endswith("--set methods.triton.launch=native")
    assert "same 48 jobs planned" in out
