"""The worker process around the ops: its protocol stream and how it reads
requests and writes answers, and its set-up.

- I/O: the protocol's stdout claimed from everything else that prints
  (`_claim_stdout`), answers encoded as JSON lines (`_encode`), and request
  lines read with a spin, then a sleep (`_Requests`; docs/worker-protocol.md,
  "Waiting for a line").
- set-up: GPU or Triton's interpreter (`choose_mode`), torch refused where a
  worker must not import it (`_RefuseImport`), Triton's key hashed on a
  thread (`_warm_triton_key`), and the watch that ends a worker whose runner
  is gone (`_die_with_runner`).

Moved out of tunelab.worker, whose `main` puts them together (and which
still exports what other code imports from it, e.g. `_Requests`).
"""

import json
import math
import os
import select
import sys
import threading
import time
from typing import Any, BinaryIO


def _claim_stdout() -> BinaryIO:
    """Keep the real stdout for the protocol; send everything else to stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # native code writing to fd 1 (printf, ptxas) now reaches stderr
    sys.stdout = sys.stderr
    return os.fdopen(protocol_fd, "wb")


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "on", "yes")


def choose_mode(require_gpu: bool = False) -> str:
    """GPU when torch sees one and the interpreter was not asked for.

    Must run before anything imports triton: Triton reads TRITON_INTERPRET
    when a kernel is decorated, so the variable is set here for the CPU case.
    With `require_gpu` (`--mode gpu`: the runner found this lane's GPU), a
    worker whose torch sees none stops with why, rather than interpreting.
    """
    if require_gpu:
        import torch

        if not torch.cuda.is_available():
            facts = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda}", f"HIP {torch.version.hip}"]
            for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
                if var in os.environ:
                    facts.append(f"{var}={os.environ[var]!r}")
            sys.exit(
                f"tunelab worker: --mode gpu, and torch sees no GPU here ({', '.join(facts)}); "
                "tunelab found one: is this Python's torch built for it? "
                "`tunelab run --interpret` runs on the CPU instead"
            )
        return "gpu"
    if _truthy(os.environ.get("TRITON_INTERPRET", "0")):
        return "interpreter"
    import torch

    if torch.cuda.is_available():
        return "gpu"
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"


def _encode(response: dict[str, Any]) -> bytes:
    """The response as compact JSON, without a newline."""
    try:
        text = json.dumps(response, allow_nan=False, separators=(",", ":"))
    except ValueError:
        # JSON has no NaN or infinity; a problem's flops or a timer could
        # still produce one. Send null rather than an unparsable line.
        text = json.dumps(_finite(response), allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


# How long the worker spins for its next request after answering one before it
# sleeps (docs/worker-protocol.md, "Waiting for a line"); TUNELAB_SPIN_US sets
# it (0 always sleeps). Waking a CPU that went idle costs more than the
# runner's work between two calls; on a native lane this worker waits while the
# native worker warms up and samples a job (17 ms median, 36 ms p90 on an H200).
WORKER_SPIN_US = 50_000
# A spin step (a poll) that takes longer than this was preempted: another
# thread wanted the CPU, and the worker sleeps instead.
_CONTENDED_S = 50e-6
# How often a spin looks whether the host is crowded (_crowded).
_CROWD_LOOK_S = 100e-6


def _spin_seconds() -> float:
    try:
        return max(0, int(os.environ.get("TUNELAB_SPIN_US", WORKER_SPIN_US))) / 1e6
    except ValueError:
        return WORKER_SPIN_US / 1e6


class _Requests:
    """Request lines from a pipe: spinning for the next one for a while after
    each answer (polling without sleeping, and giving up as soon as the spin
    is preempted or any thread waits for a CPU), then asleep until it comes.

    Reads the file descriptor itself: a buffered reader could hold a line
    that `poll` does not see.
    """

    def __init__(self, fd: int, spin_s: float):
        self._fd = fd
        self._spin_s = spin_s
        self._buf = bytearray()
        self.met = "ready"
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def readline(self) -> bytes:
        """The next line with its newline; the last one without; b"" at end of file.

        `met` then says how its last byte was met: "ready" (read with an
        earlier line), "spinning" or "asleep".
        """
        self.met = "ready"
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            self.met = self._wait()
            chunk = os.read(self._fd, 65536)
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += chunk

    def _wait(self) -> str:
        # A request already in the pipe (sent ahead) is read at once, before
        # any look at /proc/loadavg, and met "ready".
        if self._poll.poll(0):
            return "ready"
        if self._spin_s > 0:
            poll, clock = self._poll.poll, time.perf_counter
            now = clock()
            until, next_look = now + self._spin_s, now
            while now < until:
                if now >= next_look:
                    next_look = now + _CROWD_LOOK_S
                    if _crowded():
                        break
                if poll(0):
                    return "spinning"
                # No yield: it would hand the CPU to whatever else is runnable
                # on it for a whole slice (milliseconds), and the request
                # would wait that long.
                step, now = now, clock()
                if now - step > _CONTENDED_S:
                    # Preempted: this CPU is wanted, so it will not idle, and
                    # sleeping costs no wake-up from idle.
                    break
        self._poll.poll()
        return "asleep"


def _crowded() -> bool:
    """Whether more threads are runnable than the host has CPUs online
    (/proc/loadavg; never where there is none): one of them waits for a CPU,
    and a spin would keep it waiting, since the scheduler places a woken
    thread on an idle CPU and a spinning one does not look idle."""
    global _LOADAVG
    if _LOADAVG is None:
        try:
            _LOADAVG = (os.open("/proc/loadavg", os.O_RDONLY), os.sysconf("SC_NPROCESSORS_ONLN"))
        except (OSError, ValueError):
            _LOADAVG = (None, 0)
    fd, cpus = _LOADAVG
    if fd is None:
        return False
    try:
        return int(os.pread(fd, 128, 0).split()[3].split(b"/")[0]) > cpus
    except (OSError, IndexError, ValueError):
        return False


_LOADAVG: tuple[int | None, int] | None = None  # (/proc/loadavg's descriptor, CPUs online), opened once


def _warm_triton_key() -> threading.Thread:
    """Has Triton hash its own sources on a thread (returned, started), while this one imports torch.

    The first kernel a process looks up in Triton's cache makes Triton hash
    its compiler's sources and libtriton (0.35 s of a lane's first `recipes`
    call on an H200 host, 2026-11-23), after the seconds of `import torch`.
    Reading and hashing release the GIL, so a thread pays it meanwhile. Only
    under `--mode gpu`: importing Triton before `choose_mode` could fall back
    to the interpreter would leave Triton's own jit functions compiled ones.
    """

    def warm() -> None:
        try:
            from triton.runtime.cache import triton_key

            triton_key()  # kept by functools.lru_cache for the first lookup
        except Exception:
            pass  # only an optimisation: the first lookup computes it as before

    thread = threading.Thread(target=warm, name="warm-triton-key", daemon=True)
    thread.start()
    return thread


class _RefuseImport:
    """A meta-path finder that makes `import NAME` (and its submodules) fail."""

    def __init__(self, name: str, role: str):
        self.name = name
        self.who = "a compile worker" if role == "compile" else "a lane whose inputs are built natively"

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ImportError(f"{self.who} does not import {fullname}")
        return None


RUNNER_PID_VAR = "TUNELAB_RUNNER_PID"


def _die_with_runner() -> None:
    """End this worker when the runner that started it is gone.

    A runner stopped by SIGKILL cannot stop its workers, and a worker busy
    in a kernel that hangs never reads the closed pipe: it would run on,
    holding its GPU. A thread checks twice a second whether the runner
    (named by TUNELAB_RUNNER_PID) is still this process's parent, or, for a
    worker started through a wrapper that did not exec, still alive.
    """
    value = os.environ.get(RUNNER_PID_VAR, "")
    if not value.isdigit():
        return
    runner = int(value)
    direct = os.getppid() == runner

    def gone() -> bool:
        if direct:
            return os.getppid() != runner
        try:
            os.kill(runner, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def watch() -> None:
        while not gone():
            time.sleep(0.5)
        os.kill(os.getpid(), 9)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()
