"""Shared set-up for tunelab's Python tests.

Without a GPU the tests run Triton's interpreter: TRITON_INTERPRET=1 is set
here, before any test module imports triton (Triton reads it when a kernel is
decorated). With a GPU they run the real kernels and the worker's GPU paths.
"""

import importlib.util
import json
import os
import pathlib
import queue
import subprocess
import sys
import tempfile
import threading

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
EXTPKG_DIR = PYTHON_DIR / "tests" / "extpkg"
BENCH_DIR = PYTHON_DIR.parent / "bench"

for path in (PYTHON_DIR, EXTPKG_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402  (after the path set-up; torch does not import triton)

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
if INTERPRET:
    from tunelab import interpreter  # noqa: E402

    interpreter.install()  # as the workers do: Triton's interpreter without its repeated swaps
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
MODE = "interpreter" if INTERPRET else "gpu"

# Generous: a worker starts in a few seconds, but a loaded 2-core CI box is slow.
RESPONSE_TIMEOUT_S = 120


@pytest.fixture
def device():
    return DEVICE


def load_bench(name: str):
    """bench/<name>.py as a module (the benchmarks are scripts, not a package;
    bench/ goes on sys.path for the ones that import each other)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WorkerProcess:
    """A `python -m tunelab.worker` child driven over pipes, as the runner drives it.

    A reader thread moves stdout lines into a queue so every read can time out
    instead of hanging the test run; stderr goes to a file (a pipe nobody reads
    would fill up and stall the worker).
    """

    def __init__(self, *args, extra_path=(EXTPKG_DIR,), env_overrides=None):
        env = dict(os.environ)
        for key, value in (env_overrides or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), *map(str, extra_path)])
        env["PYTHONUNBUFFERED"] = "1"
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunelab.worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        self._lines = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        self._next_id = 1

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # EOF

    def send_raw(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout=RESPONSE_TIMEOUT_S):
        """The next protocol line, parsed; fails the test on junk or silence."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"worker sent nothing for {timeout}s; stderr:\n{self.stderr_text()}")
        if line is None:
            pytest.fail(f"worker closed stdout (exit {self.proc.poll()}); stderr:\n{self.stderr_text()}")
        try:
            return json.loads(line)
        except ValueError:
            pytest.fail(f"worker stdout carried a non-protocol line: {line!r}")

    def request(self, op, **fields):
        """One request; the response without `worker_us`, `met` and `at_ns`, which are checked here."""
        request_id = self._next_id
        self._next_id += 1
        self.send_raw((json.dumps({"id": request_id, "op": op, **fields}) + "\n").encode())
        response = self.read()
        assert response["id"] == request_id, response
        worker_us = response.pop("worker_us")
        assert isinstance(worker_us, float) and worker_us >= 0, response
        assert response.pop("met") in ("ready", "spinning", "asleep"), response
        assert isinstance(response.pop("at_ns"), int), response
        return response

    def at_eof(self, timeout=RESPONSE_TIMEOUT_S) -> bool:
        """True when stdout closed with no further lines."""
        try:
            return self._lines.get(timeout=timeout) is None
        except queue.Empty:
            return False

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # EOF on stdin ends the loop
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


@pytest.fixture
def spawn_worker():
    """Start workers for one test and make sure none outlives it."""
    started = []

    def spawn(*args, **kwargs):
        worker = WorkerProcess(*args, **kwargs)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.close()


@pytest.fixture(scope="module")
def shared_worker():
    """One lane worker for a module's tests: starting torch costs seconds each time."""
    worker = WorkerProcess()
    yield worker
    worker.close()
