"""The tunelab worker: one process that serves the Rust runner over JSON lines.

    python -m tunelab.worker [--role lane|compile] [--target cuda:90:32]

It builds inputs, runs methods and references, compares, and returns raw timing
samples; the runner owns everything else (see docs/worker-protocol.md). A lane
worker owns one GPU (or runs Triton's interpreter on the CPU); a compile worker
only fills Triton's cache. Given a --target, a compile worker compiles for that
GPU without touching one (see tunelab.target); the runner starts it with no
GPU visible.

The protocol stream is a private duplicate of the original stdout. At start-up
file descriptor 1 and `sys.stdout` are both pointed at stderr, so whatever a
kernel, Triton, torch or a user's problem prints, from Python or from native
code, lands on stderr and cannot corrupt a response.
"""

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from types import SimpleNamespace
from typing import Any, Callable, Optional

from tunelab import PROTOCOL_VERSION
from tunelab.failures import (
    BAD_REQUEST,
    COMPILE_ERROR,
    PROBLEM_ERROR,
    WorkerError,
    bad_request,
    classify,
    stage,
    summarize,
)
from tunelab.timers import CudaEventTimer, SmClock, WallTimer
from tunelab.worker_io import (
    _RefuseImport,
    _Requests,
    _claim_stdout,
    _die_with_runner,
    _encode,
    _spin_seconds,
    _truthy,
    _warm_triton_key,
    choose_mode,
)
from tunelab.worker_native import NativeOps
from tunelab.worker_problem import (
    _bytes_for,
    _description,
    _make_problem,
    _poison,
    _require_ir_applied,
    _triton_cache_dir,
    _type_names,
    _unavailable,
)
from tunelab.worker_request import Job, _int_field, _number_field
from tunelab.workbench import jit
from tunelab.workbench.jit import COMPILE_OPTIONS

# The worker is split along its seams: tunelab.worker_request (request
# fields), tunelab.worker_problem (calling a problem and its methods),
# tunelab.worker_native (the native-launch ops, a mixin of Worker) and
# tunelab.worker_io (the protocol's I/O and the process's set-up). What
# other code imports from here stays importable from here.
__all__ = [
    "FLUSH_WITH",
    "KEEP_PREPARED",
    "TIMINGS",
    "CudaEventTimer",
    "Job",
    "Prepared",
    "SmClock",
    "WallTimer",
    "Worker",
    "WorkerError",
    "_Requests",
    "choose_mode",
    "classify",
    "main",
    "summarize",
]

_MAX_SAMPLES = 1_000_000
FLUSH_WITH = ("read", "memset")  # how a sample's L2 flush evicts the cache
# What a sample times: "cold" (L2 flushed before each launch when flush_bytes > 0),
# "hot" (no flush), "graph" (graph_calls launches captured in one CUDA graph).
TIMINGS = ("cold", "hot", "graph")
_MAX_GRAPH_CALLS = 10_000
_MAX_TURNS = 8  # jobs one sample_turns batch may name


# --------------------------------------------------------------------------
# the worker


# Passing jobs a lane worker keeps prepared at once (all of one shape), the
# least recently checked dropped first. A group's finalists are re-timed in
# interleaved rounds, each a `check` with `"reuse": true` and a batch: with
# them still prepared, such a check answers the verdict it gave before
# instead of binding, launching and comparing again, and a graph batch
# replays the graph it captured before (an H100 gptoss-mxfp4 run,
# 2026-11-25: 4800 re-timing checks took 162 s of a 316 s run, 113 s of it
# their batches). Eight covers the finalists (protocol.finalists, 5 by
# default) among a surrogate group's eight configs and its baseline.
KEEP_PREPARED = 8


class Prepared:
    """A job kept ready between its check and its warmup/sample calls."""

    def __init__(
        self,
        job_id: str,
        problem: Any,
        inputs: Any,
        launch: Any,
        ctx: Any = None,
        verdict: Optional[dict[str, Any]] = None,
        asked: Optional[tuple[int, float, float, float]] = None,
    ):
        self.job_id = job_id
        self.problem = problem
        self.inputs = inputs
        self.launch = launch
        # The job's JIT context (compile options, IR file): a launch through
        # Triton's JIT after the check must compile what the check compiled.
        self.ctx = ctx
        # graph_calls -> the CUDA graph of that many launches (timing "graph"),
        # freed with the job.
        self.graphs: dict[int, Any] = {}
        # The passing check's answer (without `then`), given again to a
        # `check` that asks to reuse it.
        self.verdict = verdict or {}
        # (seed, atol, rtol, max_mismatch) of that check.
        self.asked = asked

    def free(self) -> None:
        """Give back at once the memory pools of the CUDA graphs this job
        captured (their launches' allocations), whoever else still refers
        to the graph objects."""
        for graph in self.graphs.values():
            if hasattr(graph, "reset"):  # not the CPU emulation's marker
                graph.reset()
        self.graphs.clear()


class Worker(NativeOps):
    def __init__(self, role: str, mode: str, target: Any = None) -> None:
        self.role = role
        self.mode = mode
        # Set for a compile worker that compiles for a GPU it cannot see. Such
        # a worker never imports torch (see tunelab.target and tunelab.lazy).
        self.target = target
        if target is None:
            import torch

            self.torch = torch
            self.device = torch.device("cuda" if mode == "gpu" else "cpu")
        else:
            self.torch = None
            self.device = None
        # job_id -> a passing job of the current shape, oldest first (KEEP_PREPARED).
        self._kept: dict[str, Prepared] = {}
        # The job the last check prepared (None after a failed one).
        self._last: Optional[str] = None
        # A lane with a target builds nothing itself (`inputs: native`): the
        # native worker builds the shape's data from this description.
        # (key, the problem's description, its layout)
        self._native_data: Optional[tuple[tuple[str, str, int], dict[str, Any], dict[str, Any]]] = None
        # (key, inputs, expected output, bytes) of the last shape checked.
        self._shape_cache: Optional[tuple[tuple[str, str, int], Any, Any, float]] = None
        # The shape's tensors shared with a native worker: (key, output, reply).
        self._shared: Optional[tuple[tuple[str, str, int], Any, dict[str, Any], Any]] = None
        self.stopping = False
        # What a planted slowdown queues on a GPU (tunelab.variant.tensor_core_burn).
        self._burn: Optional[Any] = None
        self._timer: Optional[CudaEventTimer | WallTimer] = None
        self._handlers = {
            "hello": self.hello,
            "probe": self.probe,
            "describe": self.describe,
            "compile": self.compile,
            "check": self.check,
            "warmup": self.warmup,
            "sample": self.sample,
            "sample_turns": self.sample_turns,
            "keep_ir": self.keep_ir,
            "release": self.release,
            "shutdown": self.shutdown,
            "share": self.share,
            "compare": self.compare,
            "recipe": self.recipe,
            "recipes": self.recipes,
            "native_data": self.native_data,
            "digest": self.digest,
        }

    # ---- dispatch

    def handle_line(self, raw: bytes, met: Optional[str] = None) -> bytes:
        """One request line in, its response line out (JSON, newline-ended); never raises.

        Every response ends with `worker_us`: the time from here until the
        response is text, its encoding included, so the runner, subtracting
        it from the round trip, sees what the pipe and the runner's side
        cost and nothing the worker did. Before it, `met`: how the request
        was met (`_Requests.met`), when given, and before that `at_ns`: when
        the request was read, on the host's monotonic clock.
        """
        started = time.perf_counter()
        # When this request was read, on the host's monotonic clock (the runner's trace places the
        # worker's own time inside the round trip with it; docs/worker-protocol.md).
        at_ns = time.monotonic_ns()
        text = _encode(self._handle(raw))  # a JSON object: ends with "}"
        met_field = b"" if met is None else b',"met":"%s"' % met.encode()
        text = b'%s,"at_ns":%d%s}' % (text[:-1], at_ns, met_field)
        us = (time.perf_counter() - started) * 1e6
        return b'%s,"worker_us":%.1f}\n' % (text[:-1], us)

    def _handle(self, raw: bytes) -> dict[str, Any]:
        try:
            request = json.loads(raw)
        except Exception as exc:
            return _failure(None, BAD_REQUEST, f"malformed JSON: {exc}")
        if not isinstance(request, dict):
            return _failure(None, BAD_REQUEST, "a request must be a JSON object")
        request_id = request.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            return _failure(None, BAD_REQUEST, f"'id' must be an integer, got {request_id!r}")
        op = request.get("op")
        handler = self._handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            known = ", ".join(self._handlers)
            return _failure(request_id, BAD_REQUEST, f"unknown op {op!r}; expected one of {known}")
        try:
            body = handler(request)
        except WorkerError as err:
            return _failure(request_id, err.failure_class, err.message)
        except Exception as exc:
            # A bug in the worker itself: report it rather than die, so the
            # runner sees a class and a message instead of a crash.
            print(f"tunelab worker: internal error in {op}:", file=sys.stderr)
            traceback.print_exception(exc, file=sys.stderr)
            return _failure(request_id, PROBLEM_ERROR, "internal worker error: " + summarize(exc))
        return {"id": request_id, "ok": True, **body}

    # ---- ops

    def hello(self, request: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        if torch is None:
            # A compile worker: torch is not imported, and importing it now
            # to report its version would undo the point.
            torch_version, cuda_version = None, None
        else:
            torch_version, cuda_version = str(torch.__version__), torch.version.cuda
        try:
            import triton

            triton_version = triton.__version__
        except Exception:
            triton_version = None
        if self.target is not None and self.role == "lane":
            device = f"inputs built natively; compiles for {self.target}"
        elif self.target is not None:
            device = f"compile-only for {self.target}"
        elif self.mode == "gpu":
            device = torch.cuda.get_device_name()
        else:
            device = "cpu"
        return {
            "protocol": PROTOCOL_VERSION,
            "python": platform.python_version(),
            "torch": torch_version,
            "triton": triton_version,
            "mode": self.mode,
            "device": device,
            "cuda": cuda_version,
        }

    def probe(self, request: dict[str, Any]) -> dict[str, Any]:
        """Import and construct the problem at one shape and look up the
        named methods, without building inputs or touching a GPU. The runner
        asks once per experiment before its first job (and `tunelab validate`
        for user problems), so an unimportable problem or a missing method
        stops the run at once instead of failing every job."""
        name, shape, names = request.get("problem"), request.get("shape"), request.get("methods")
        if not isinstance(name, str) or not isinstance(shape, dict):
            raise bad_request("probe needs 'problem' (string) and 'shape' (object)")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise bad_request("probe needs 'methods': a list of method names")
        with stage("problem"):
            problem = _make_problem(name, shape)
            available = problem.methods()
        kinds = request.get("kinds", {})
        if not isinstance(kinds, dict):
            raise bad_request("probe: 'kinds' must map method names to their kinds")
        methods: dict[str, dict[str, Any]] = {}
        for n in names:
            if n not in available:
                methods[n] = {"found": False, "config_types": None}
                continue
            declared = getattr(available[n], "config_types", None)
            types = None if declared is None else _type_names(n, declared)
            if types is not None and kinds.get(n) == "triton":
                # The worker passes these to every kernel of a Triton method
                # (tunelab.workbench.jit), so a config may vary them.
                types = {**_type_names(n, COMPILE_OPTIONS), **types}
            methods[n] = {
                "found": True,
                "config_types": types,
                "description": _description(available[n]),
            }
        return {"methods": methods, "available": [str(n) for n in available]}

    def describe(self, request: dict[str, Any]) -> dict[str, Any]:
        name, shape = request.get("problem"), request.get("shape")
        if not isinstance(name, str) or not isinstance(shape, dict):
            raise bad_request("describe needs 'problem' (string) and 'shape' (object)")
        with stage("problem"):
            problem = _make_problem(name, shape)
            methods = problem.methods()
            facts = {
                "flops": float(problem.flops()),
                "bytes": float(problem.bytes()),
                "methods": [str(method) for method in methods],
            }
        if self.target is None:
            # A compile worker with a target refuses torch, so it cannot tell
            # whether a library method runs here: only workers that can answer do.
            facts["unavailable"] = {
                str(key): reason for key, method in methods.items() if (reason := _unavailable(method, problem))
            }
        if "seed" in request and self.role == "lane" and self.target is None:
            # The runner describes a shape before its first job, which may still
            # be compiling: build the inputs and reference now, not after that.
            seed = _int_field(request, "seed")
            started = time.perf_counter()
            self._drop_prepared()  # never hold two shapes' buffers at once
            _, _, facts["bytes"] = self._shape_data(problem, name, shape, seed)
            facts["inputs_s"] = time.perf_counter() - started
        return facts

    def compile(self, request: dict[str, Any]) -> dict[str, Any]:
        job = Job(request.get("job"))
        problem, method = self._problem_and_method(job)
        compile_method = getattr(method, "compile", None)
        # The interpreter compiles nothing; constructing the problem above
        # still catches a bad shape early.
        if compile_method is None or self.mode == "interpreter":
            return {"compiled": False, "seconds": 0.0, "kernels": []}
        ask = request.get("recipe")
        if ask is not None and (
            not isinstance(ask, dict) or not isinstance(ask.get("cache_dir"), str) or not ask["cache_dir"]
        ):
            raise bad_request("'recipe' must be an object with 'seed' and 'cache_dir', where the cubin goes")
        ctx = self._job_context(job)
        started = time.perf_counter()
        compiled = self._compile(job, problem, method, ctx)
        seconds = time.perf_counter() - started
        answer = {
            "compiled": True if compiled is None else bool(compiled),
            "seconds": seconds,
            "kernels": [jit.resources(k) for k in ctx.kernels.values()],
        }
        if ask is not None:
            # Not in `seconds`: that is the compile's alone.
            answer["recipe"] = self._recipe_after_compile(job, (problem, method, ctx), ask)
        return answer

    def keep_ir(self, request: dict[str, Any]) -> dict[str, Any]:
        """Compile one job (or find it in the cache) and write its kernels' IR
        and metadata under `dir` (tunelab.workbench.dump). Needs no GPU in a
        compile worker with a target; the interpreter has no IR to keep."""
        job = Job(request.get("job"))
        directory = request.get("dir")
        if not isinstance(directory, str) or not directory:
            raise bad_request("keep_ir needs 'dir': the directory to write the IR to")
        problem, method = self._problem_and_method(job)
        if self.mode == "interpreter":
            raise WorkerError(
                PROBLEM_ERROR,
                "the interpreter compiles nothing, so there is no IR to keep; "
                "keep it with a worker that compiles for a GPU (--target)",
            )
        if getattr(method, "compile", None) is None:
            return {"kernels": []}
        ctx = self._job_context(job)
        self._compile(job, problem, method, ctx)
        from tunelab.workbench import dump

        with stage("problem"):
            kernels = dump.write_kernels(ctx.kernels.values(), directory, load=self.target is None)
        return {"kernels": kernels}

    def check(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_lane("check")
        job = Job(request.get("job"))
        seed = _int_field(request, "seed", default=0)
        tolerance = request.get("tolerance")
        if not isinstance(tolerance, dict):
            raise bad_request("check needs a 'tolerance' object {atol, rtol, max_mismatch}")
        atol = _number_field(tolerance, "atol")
        rtol = _number_field(tolerance, "rtol")
        max_mismatch = _number_field(tolerance, "max_mismatch", default=0.0)

        self._last = None
        # What the verdict depends on besides the job: a reused one must
        # have been given for the same.
        asked = (seed, atol, rtol, max_mismatch)
        kept = self._kept.get(job.job_id)
        if request.get("reuse") is True and kept is not None and kept.asked == asked:
            return self._check_again(job.job_id, request.get("then"))
        self._forget(job.job_id)
        problem, method = self._problem_and_method(job)
        reason = _unavailable(method, problem)
        if reason:
            raise WorkerError(PROBLEM_ERROR, f"method {job.method!r} cannot run here: {reason}")
        if job.ir is not None and self.mode == "interpreter":
            raise WorkerError(
                PROBLEM_ERROR,
                f"method {job.method!r} runs from IR ({job.ir}), which needs a GPU: "
                "the interpreter runs the kernel's Python source",
            )
        ctx = self._job_context(job)
        inputs, expected, nbytes = self._shape_data(problem, job.problem, job.shape, seed)
        with stage("problem"):
            flops = float(problem.flops())
        if self.mode == "gpu" and hasattr(method, "compile"):
            # Compile (or find in the cache) before launching, so a compiler
            # failure is reported as compile_error and never as launch_error.
            self._compile(job, problem, method, ctx)
        with jit.active(ctx):
            with stage("bind"):
                launch = method.bind(problem, inputs, job.config)
                out = getattr(launch, "out", None)
                if not isinstance(out, self.torch.Tensor):
                    raise TypeError(f"{type(launch).__name__}.out must be a torch.Tensor, got {type(out).__name__}")
            if job.plant_us > 0:
                with stage("launch"):
                    launch = self._plant(launch, job.plant_us)
            with stage("bind"):
                _poison(self.torch, out)
            with stage("launch"):
                launch()
                self._synchronize()
        _require_ir_applied(job, ctx)
        ctx.recording = False
        with stage("problem"):
            from tunelab.compare import compare

            result = compare(out, expected, atol=atol, rtol=rtol, max_mismatch=max_mismatch)
        result.pop("mismatch")  # the protocol reports the fraction
        # What the compiler made of the job's kernels, loaded on the GPU: the
        # driver's registers and spills, Triton's shared memory.
        kernels = [jit.resources(k, load=True) for k in ctx.kernels.values()]
        reply = {**result, "flops": flops, "bytes": nbytes, "kernels": kernels}
        if result["passed"]:
            # Failures are never timed, so only a passing job stays prepared.
            self._keep(Prepared(job.job_id, problem, inputs, launch, ctx, verdict=dict(reply), asked=asked))
        then = request.get("then")
        if then is not None and result["passed"]:
            reply["then"] = self._then(job.job_id, then)
        return reply

    def _check_again(self, job_id: str, then: object) -> dict[str, Any]:
        """A `check` with `"reuse": true` of a job still prepared: the verdict
        its check gave (its output is not compared again), then `then`."""
        prepared = self._kept.pop(job_id)
        self._kept[job_id] = prepared  # the most recently checked now
        self._last = job_id
        reply = {**prepared.verdict, "reused": True}
        if then is not None:
            reply["then"] = self._then(job_id, then)
            self._trim()  # its batch may have captured a graph
        return reply

    @property
    def prepared(self) -> Optional[Prepared]:
        """The job the last check prepared, or None after a failed one."""
        return self._kept.get(self._last) if self._last is not None else None

    def _keep(self, prepared: Prepared) -> None:
        """`prepared` is kept (see `_trim`)."""
        self._kept[prepared.job_id] = prepared
        self._last = prepared.job_id
        self._trim()

    def _trim(self) -> None:
        """The oldest kept jobs dropped down to KEEP_PREPARED, or down to the
        newest alone where torch holds three quarters of the GPU's memory. It
        counts what torch reserves, not what it has allocated: a kept job's
        CUDA graphs hold their launches' temporaries in private pools, which
        are reserved once the capture frees them. Torch's cache of free blocks
        counts too, so the limit is high: the weights a MoE worker caches
        take at most a quarter."""
        keep = KEEP_PREPARED
        if self.mode == "gpu":
            cuda = self.torch.cuda
            if cuda.memory_reserved() > 0.75 * cuda.get_device_properties(self.device).total_memory:
                keep = 1
        while len(self._kept) > keep:
            self._forget(next(iter(self._kept)))

    def _then(self, job_id: str, then: object) -> dict[str, Any]:
        """What a passing check's request asks to follow in the same call: the
        warm-up and the first batch, as `warmup` and `sample` take them. Their
        failure is reported here, so the check's verdict still stands."""
        if (
            not isinstance(then, dict)
            or not isinstance(then.get("warmup"), dict)
            or not isinstance(then.get("sample"), dict)
        ):
            raise bad_request('check: \'then\' must be {"warmup": {...}, "sample": {...}}')
        try:
            warmed = self.warmup({**then["warmup"], "job_id": job_id})
            started = time.perf_counter()
            sampled = self.sample({**then["sample"], "job_id": job_id})
            wall_ms = (time.perf_counter() - started) * 1e3
        except WorkerError as err:
            return {"ok": False, "class": err.failure_class, "message": err.message}
        return {"ok": True, "warmup": warmed, "sample": sampled, "wall_ms": wall_ms}

    def warmup(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_lane("warmup")
        prepared = self._prepared_for(request)
        min_launches, min_ms = _warmup_fields(request)
        with stage("launch"), jit.active(prepared.ctx):
            launches, ms = self._timing().warmup(prepared.launch, min_launches, min_ms)
        return {"launches": launches, "ms": ms}

    def sample(self, request: dict[str, Any]) -> dict[str, Any]:
        self._require_lane("sample")
        prepared = self._prepared_for(request)
        count, flush_bytes, flush_with, timing, graph_calls = _sample_fields(request, "sample")
        timer = self._timing()
        with stage("launch"), jit.active(prepared.ctx):
            # A planted slowdown sizes its spin at the clock the GPU runs now.
            getattr(prepared.launch, "before_batch", lambda: None)()
            if timing == "graph":
                us, clock = timer.sample_graph(prepared, count, graph_calls)
                name = timer.graph_name
            else:
                # hot: the same event pairs, never a flush, whatever flush_bytes says.
                us, clock = timer.sample(prepared.launch, count, flush_bytes if timing == "cold" else 0, flush_with)
                name = timer.name
        return {"us": us, "timer": name, "sm_clock_mhz": clock}

    def sample_turns(self, request: dict[str, Any]) -> dict[str, Any]:
        """A warm-up of each prepared job named, then one batch of `count`
        samples of each, the jobs taking turns sample by sample (an A/B
        round: docs/ab.md, "Taking turns")."""
        self._require_lane("sample_turns")
        job_ids = request.get("job_ids")
        if (
            not isinstance(job_ids, list)
            or not 2 <= len(job_ids) <= _MAX_TURNS
            or not all(isinstance(j, str) for j in job_ids)
            or len(set(job_ids)) != len(job_ids)
        ):
            raise bad_request(f"sample_turns: job_ids must be 2 to {_MAX_TURNS} distinct job ids")
        warmup = request.get("warmup")
        if not isinstance(warmup, dict):
            raise bad_request('sample_turns: warmup must be {"min_launches": ..., "min_ms": ...}')
        min_launches, min_ms = _warmup_fields(warmup)
        count, flush_bytes, flush_with, timing, graph_calls = _sample_fields(request, "sample_turns")
        prepared = [self._prepared_for({"job_id": j}) for j in job_ids]
        timer = self._timing()
        # Each job's launches run in its own context (its compile options,
        # its swapped modules), a graph's capture included, as `sample`'s do.
        turned = [SimpleNamespace(launch=_in_context(p), graphs=p.graphs) for p in prepared]

        with stage("launch"):
            for p in prepared:
                getattr(p.launch, "before_batch", lambda: None)()
                with jit.active(p.ctx):
                    timer.warmup(p.launch, min_launches, min_ms)
            if timing == "graph":
                us, clock = timer.sample_graph_turns(turned, count, graph_calls)
                name = timer.graph_name
            else:
                launches = [t.launch for t in turned]
                us, clock = timer.sample_turns(launches, count, flush_bytes if timing == "cold" else 0, flush_with)
                name = timer.name
        return {"us": us, "timer": name, "sm_clock_mhz": clock}

    def release(self, request: dict[str, Any]) -> dict[str, Any]:
        self._drop_prepared()
        return {}

    def _forget(self, job_id: str) -> None:
        prepared = self._kept.pop(job_id, None)
        if prepared is not None:
            prepared.free()
        if self._last == job_id:
            self._last = None

    def _drop_prepared(self) -> None:
        """Forget every prepared job, their graphs' memory given back at once."""
        for job_id in list(self._kept):
            self._forget(job_id)

    def shutdown(self, request: dict[str, Any]) -> dict[str, Any]:
        self._drop_prepared()
        self.stopping = True
        return {}

    # ---- helpers

    def _shape_data(self, problem: Any, name: str, shape: dict[str, Any], seed: int) -> tuple[Any, Any, float]:
        """(inputs, reference, bytes) for one shape, built once per (problem, shape, seed).

        Configs of one shape arrive back to back and their inputs and
        reference do not depend on the config, so they are built once per
        shape: the reference (fp32, often a slow loop) would otherwise cost
        more than the job. Each check still gets a new, poisoned output.
        """
        key = (name, json.dumps(shape, sort_keys=True), seed)
        if self._shape_cache is None or self._shape_cache[0] != key:
            # Free the previous shape's tensors first, its prepared jobs' too.
            self._drop_prepared()
            self._shape_cache = None
            self._collect_if_crowded()
            self._shared = None
            with stage("problem"):
                inputs = problem.inputs(seed, self.device)
                expected = problem.reference(inputs)
                nbytes = _bytes_for(problem, inputs)
                self._synchronize()
            from tunelab.compare import reference_fault

            fault = reference_fault(expected)
            if fault is not None:
                raise WorkerError(PROBLEM_ERROR, fault)
            self._shape_cache = (key, inputs, expected, nbytes)
        return self._shape_cache[1:]

    def _job_context(self, job: Job) -> Any:
        """The JIT context of a job: its compile options, and for an `ir:`
        method the IR file (read, and copied under its hash into Triton's cache)."""
        ir = ir_path = None
        if job.ir is not None:
            from tunelab.workbench.irfile import IrFile, IrFileError

            try:
                ir = IrFile.load(job.ir)
                ir_path = ir.cached_copy(_triton_cache_dir())
            except (IrFileError, OSError) as exc:
                raise WorkerError(PROBLEM_ERROR, str(exc)) from exc
        return jit.JobContext(job.config, ir, ir_path, job.modules)

    def _plant(self, launch: Any, plant_us: float) -> Any:
        """The launch with a slowdown of `plant_us` planted after it (tunelab.variant)."""
        from tunelab import variant

        if self.mode == "gpu":
            if self._burn is None:  # one burn's buffers for every planted job
                self._burn = variant.tensor_core_burn(self.torch)
            return variant.plant_on_gpu(self.torch, launch, plant_us, self._burn)
        return variant.plant_on_cpu(launch, plant_us)

    def _compile(self, job: Job, problem: Any, method: Any, ctx: Any) -> Any:
        """`Method.compile` under the job's context; for an `ir:` method, the
        source kernel first, to hold the IR file to the specialisation, warps
        and target the source compiles at this shape (tunelab.workbench.ircheck)."""
        compile_method = getattr(method, "compile", None)
        if compile_method is None:
            return None
        if ctx.ir is not None:
            from tunelab.workbench import ircheck

            source = ctx.without_ir()
            with stage("compile"), jit.active(source):
                compile_method(problem, job.config)
            problems = ircheck.against_source(ctx.ir, list(source.kernels.values()))
            if problems:
                raise WorkerError(
                    COMPILE_ERROR,
                    f"IR file {job.ir} does not fit method {job.method!r} at this shape and config: {problems}",
                )
        with stage("compile"), jit.active(ctx):
            compiled = compile_method(problem, job.config)
        _require_ir_applied(job, ctx)
        return compiled

    def _require_lane(self, op: str) -> None:
        if self.role != "lane":
            raise bad_request(f"a {self.role} worker does not serve {op!r}; start one with --role lane")

    def _problem_and_method(self, job: Job) -> tuple[Any, Any]:
        with stage("problem"):
            problem = _make_problem(job.problem, job.shape)
            methods = problem.methods()
        if job.method not in methods:
            known = ", ".join(map(str, methods)) or "none"
            raise bad_request(f"problem {job.problem!r} has no method {job.method!r} (it has: {known})")
        return problem, methods[job.method]

    def _prepared_for(self, request: dict[str, Any]) -> Prepared:
        job_id = request.get("job_id")
        prepared = self._kept.get(job_id) if isinstance(job_id, str) else None
        if prepared is None:
            have = ", ".join(self._kept) or "none"
            raise bad_request(f"job {job_id!r} is not prepared (prepared: {have}); send a passing check first")
        return prepared

    def _timing(self) -> CudaEventTimer | WallTimer:
        if self._timer is None:
            self._timer = CudaEventTimer(self.torch) if self.mode == "gpu" else WallTimer()
        return self._timer

    def _collect_if_crowded(self) -> None:
        """Free GPU tensors that only reference cycles still hold.

        A method's launch objects can sit in reference cycles (closures over
        their inputs), which Python's cycle collector frees only when enough
        Python objects have been allocated: a worker that allocates few
        Python objects but gigabytes of weights per shape can run out of GPU
        memory on tensors nothing uses (an H100 run, 2026-11-22: 73 GiB held
        at E=128 N=2880). A collection takes tens of milliseconds, so it runs
        only at a shape change with more than an eighth of the GPU allocated.
        """
        if self.mode != "gpu":
            return
        cuda = self.torch.cuda
        if cuda.memory_allocated() * 8 > cuda.get_device_properties(self.device).total_memory:
            gc.collect()
            cuda.empty_cache()

    def _synchronize(self) -> None:
        if self.mode == "gpu":
            self.torch.cuda.synchronize()


def _warmup_fields(fields: dict[str, Any]) -> tuple[int, float]:
    """A warm-up's (min_launches, min_ms), checked: a `warmup` request's, or `sample_turns`' `warmup`."""
    min_launches = _int_field(fields, "min_launches", default=3, minimum=0, maximum=_MAX_SAMPLES)
    return min_launches, _number_field(fields, "min_ms", default=5.0)


def _in_context(p: Prepared) -> Callable[[], object]:
    """`p`'s launch inside its job context, for timers that launch several jobs in turn."""

    def launch() -> object:
        with jit.active(p.ctx):
            return p.launch()

    return launch


def _sample_fields(request: dict[str, Any], op: str) -> tuple[int, int, str, str, int]:
    """A sample request's (count, flush_bytes, flush_with, timing, graph_calls), checked."""
    count = _int_field(request, "count", minimum=1, maximum=_MAX_SAMPLES)
    flush_bytes = _int_field(request, "flush_bytes", default=0, minimum=0)
    flush_with = request.get("flush_with", "read")
    if flush_with not in FLUSH_WITH:
        raise bad_request(f"{op}: flush_with must be one of {list(FLUSH_WITH)}, got {flush_with!r}")
    timing = request.get("timing", "cold")
    if timing not in TIMINGS:
        raise bad_request(f"{op}: timing must be one of {list(TIMINGS)}, got {timing!r}")
    graph_calls = _int_field(request, "graph_calls", default=10, minimum=1, maximum=_MAX_GRAPH_CALLS)
    return count, flush_bytes, flush_with, timing, graph_calls


def _failure(request_id: Optional[int], failure_class: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "class": failure_class, "message": message}


# --------------------------------------------------------------------------
# process set-up and the loop


def _parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tunelab.worker", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--role",
        choices=("lane", "compile"),
        default="lane",
        help="lane: check and time jobs on one device (default); compile: only fill Triton's cache",
    )
    parser.add_argument(
        "--target",
        help="compile for this GPU (cuda:90:32, hip:gfx942:64) without touching one and without torch: a "
        "compile worker, or a lane whose inputs the native worker builds (inputs: native)",
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "gpu"),
        default="auto",
        help="auto: a GPU when torch sees one, else Triton's interpreter (default); gpu: the runner found "
        "this lane's GPU, so stop if torch sees none",
    )
    args = parser.parse_args(argv)
    if args.target is not None and args.role == "lane" and args.mode == "gpu":
        parser.error("--target makes a lane without torch (inputs: native), which sees no GPU: not --mode gpu")
    if args.mode == "gpu" and (args.role != "lane" or _truthy(os.environ.get("TRITON_INTERPRET", "0"))):
        parser.error("--mode gpu is for a lane on a GPU, without TRITON_INTERPRET")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = _parse_args(argv)
    _die_with_runner()
    protocol = _claim_stdout()
    target = None
    if args.target is not None:
        from tunelab.target import compile_for, parse_target

        from tunelab.dtypes import use_stand_ins

        # Triton's native argument specialiser imports torch the first time it
        # runs when torch is installed (five seconds on an H100 host, for
        # nothing: the stand-ins are not tensors). Refusing the import makes
        # Triton go without it, as on a machine with no torch.
        sys.meta_path.insert(0, _RefuseImport("torch", args.role))
        target = parse_target(args.target)
        mode = "gpu"  # never asks torch for a GPU: none is visible to this process
        compile_for(target)
        use_stand_ins()
        if args.role == "lane":
            # Its first recipe looks a kernel up in Triton's cache: hash
            # Triton's sources meanwhile (see _warm_triton_key).
            _warm_triton_key()
    elif args.mode == "gpu":
        warming = _warm_triton_key()
        mode = choose_mode(require_gpu=True)
        # Done by now (torch takes longer); joined so that nothing imports
        # Triton while the thread may still be importing its packages.
        warming.join()
    else:
        mode = choose_mode()
    if mode == "interpreter":
        from tunelab import interpreter

        interpreter.install()  # Triton's interpreter without its repeated swaps (tunelab/interpreter.py)
    worker = Worker(role=args.role, mode=mode, target=target)
    requests = _Requests(sys.stdin.fileno(), _spin_seconds())
    while not worker.stopping:
        line = requests.readline()
        if not line:
            break  # the runner closed our stdin: nothing more to serve
        if not line.strip():
            continue
        protocol.write(worker.handle_line(line, requests.met))
        protocol.flush()  # the runner is waiting for this line
    return 0


if __name__ == "__main__":
    code = main()
    # Skip the interpreter's teardown: with torch and a CUDA context loaded it
    # takes up to a second, and a worker has nothing left to save. Logs first.
    sys.stderr.flush()
    os._exit(code)
