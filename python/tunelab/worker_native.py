"""The worker's ops for native launches (tunelab.native, docs/native-backend.md):
sharing a shape's tensors with the native worker (`share`), comparing or
hashing what a native launch wrote (`compare`, `digest`), describing a
shape's data for the native worker to build (`native_data`), and launch
recipes (`recipe`, `recipes`, and the one a compile worker makes after a
compile).

`NativeOps` is a mixin of tunelab.worker.Worker, which owns the state these
ops read (the shape's data, the shared tensors, the native description) and
the helpers they call; they are declared below so that a type checker sees
them, and defined by `Worker`.
"""

import json
import sys
import traceback
from typing import Any, Callable, Optional

from tunelab.failures import BAD_REQUEST, LAUNCH_ERROR, PROBLEM_ERROR, WorkerError, bad_request, stage, summarize
from tunelab.worker_problem import _make_problem, _require_ir_applied
from tunelab.worker_request import Job, _number_field, _shape_of
from tunelab.workbench import jit


class NativeOps:
    # What these ops use of the Worker they are mixed into (set and defined there).
    role: str
    mode: str
    target: Any
    torch: Any
    device: Any
    _native_data: Optional[tuple[tuple[str, str, int], dict[str, Any], dict[str, Any]]]
    _shape_cache: Optional[tuple[tuple[str, str, int], Any, Any, float]]
    _shared: Optional[tuple[tuple[str, str, int], Any, dict[str, Any], Any]]
    _require_lane: Callable[[str], None]
    _shape_data: Callable[[Any, str, dict[str, Any], int], tuple[Any, Any, float]]
    _synchronize: Callable[[], None]
    _problem_and_method: Callable[[Job], tuple[Any, Any]]
    _job_context: Callable[[Job], Any]
    _compile: Callable[[Job, Any, Any, Any], Any]

    def _recipe_after_compile(self, job: Job, compiled: tuple[Any, Any, Any], ask: dict[str, Any]) -> dict[str, Any]:
        """The job's native launch recipe, made by the compile worker that has
        just compiled it (`compile` with `recipe: {seed, cache_dir}`), so the
        lane need not ask its own worker. Only over stand-ins of the data the
        native worker builds (`inputs: native`): the tensors are named by the
        same indices in every worker. Answered as in `recipes`: `ok` and the
        recipe, or the failure, which is not the compile's (the lane asks
        again and the job's check records it)."""
        if self.target is None:
            return {
                "ok": False,
                "class": BAD_REQUEST,
                "message": "only a worker without a GPU (--target) makes recipes when it compiles",
            }
        try:
            return {"ok": True, **self._recipe(job, ask.get("seed", 0), ask["cache_dir"], compiled)}
        except WorkerError as err:
            return {"ok": False, "class": err.failure_class, "message": err.message}
        except Exception as exc:  # noqa: BLE001 - the recipe's bug, not the compile's, as in `recipes`
            print("tunelab worker: internal error making a recipe after a compile:", file=sys.stderr)
            traceback.print_exception(exc, file=sys.stderr)
            return {"ok": False, "class": PROBLEM_ERROR, "message": "internal worker error: " + summarize(exc)}

    def share(self, request: dict[str, Any]) -> dict[str, Any]:
        """Share a shape's inputs and a fresh output with the native worker."""
        self._require_lane("share")
        if self.mode != "gpu":
            raise WorkerError(PROBLEM_ERROR, "native methods need a GPU; this worker runs Triton's interpreter")
        name, shape, seed, key = _shape_of("share", request)
        if self._shared is not None and self._shared[0] == key:
            return self._shared[2]
        with stage("problem"):
            problem = _make_problem(name, shape)
        inputs, expected, _ = self._shape_data(problem, name, shape, seed)
        from tunelab import native

        torch = self.torch
        with stage("problem"):
            out = native.new_output(problem, inputs, expected)
            if tuple(out.shape) != tuple(expected.shape):
                raise ValueError(
                    f"the output {tuple(out.shape)} and the reference {tuple(expected.shape)} differ in shape"
                )
            tensors = [(k, v) for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_cuda]
            tensors.append(("out", out))
            # The reference too, where the native worker can compare with it
            # (tunelab_compare: contiguous, float32/16 or bfloat16): the runner
            # then asks it instead of this worker's `compare`.
            reference = None
            comparable = (torch.float32, torch.float16, torch.bfloat16)
            if expected.is_cuda and out.is_contiguous() and out.dtype in comparable and expected.dtype in comparable:
                reference = expected.contiguous()
                tensors.append(("reference", reference))
            described = [native.describe_tensor(torch, k, v) for k, v in tensors]
            reply = {
                "tensors": described,
                "out": len(tensors) - 1 - (reference is not None),
                "reference": len(tensors) - 1 if reference is not None else None,
                "poison": native.poison_pattern(torch, out.dtype).hex(),
                "elements": out.numel(),
                "uuid": str(torch.cuda.get_device_properties(self.device).uuid),
            }
        # The reference copy (when expected was not contiguous) lives as long as the share.
        self._shared = (key, out, reply, reference)
        return reply

    def _shared_for(self, request: dict[str, Any]) -> tuple[tuple[str, str, int], Any, dict[str, Any], Any]:
        name, shape = request.get("problem"), request.get("shape")
        seed = request.get("seed", 0)
        key = (name, json.dumps(shape, sort_keys=True), seed)
        if self._shared is None or self._shared[0] != key or self._shape_cache is None or self._shape_cache[0] != key:
            raise bad_request("this shape's tensors are not shared; send 'share' first")
        return self._shared

    def compare(self, request: dict[str, Any]) -> dict[str, Any]:
        """Compare the shared output (a native launch wrote it) with the reference."""
        self._require_lane("compare")
        tolerance = request.get("tolerance")
        if not isinstance(tolerance, dict):
            raise bad_request("compare needs a 'tolerance' object {atol, rtol, max_mismatch}")
        atol = _number_field(tolerance, "atol")
        rtol = _number_field(tolerance, "rtol")
        max_mismatch = _number_field(tolerance, "max_mismatch", default=0.0)
        _, out, _, _ = self._shared_for(request)
        assert self._shape_cache is not None  # _shared_for built the shape
        expected = self._shape_cache[2]
        with stage("problem"):
            from tunelab.compare import compare

            self._synchronize()
            result = compare(out, expected, atol=atol, rtol=rtol, max_mismatch=max_mismatch)
        result.pop("mismatch")
        return result

    def digest(self, request: dict[str, Any]) -> dict[str, Any]:
        """The SHA-256 of the shared output's bytes: for tests that compare bits."""
        self._require_lane("digest")
        import hashlib

        _, out, _, _ = self._shared_for(request)
        self._synchronize()
        data = out.contiguous().view(self.torch.uint8).cpu().numpy().tobytes()
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    def native_data(self, request: dict[str, Any]) -> dict[str, Any]:
        """A shape's data as the native worker builds it (`inputs: native`):
        every tensor, how it is filled, and the reference operator
        (tunelab.native_data.layout)."""
        self._require_lane("native_data")
        return self._describe(*_shape_of("native_data", request))[1]

    def _describe(
        self, name: str, shape: dict[str, Any], seed: int, key: tuple[str, str, int]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the problem's description, its layout) of a shape's data, kept for the shape."""
        if self._native_data is not None and self._native_data[0] == key:
            return self._native_data[1:]
        from tunelab import native_data

        with stage("problem"):
            problem = _make_problem(name, shape)
            describe = getattr(problem, "native_data", None)
            if describe is None:
                raise WorkerError(
                    PROBLEM_ERROR,
                    f"problem {name!r} does not describe its data for the native "
                    "worker (it has no native_data()); run it with inputs: python",
                )
            try:
                description = describe()
                layout = native_data.layout(description, seed)
            except ValueError as exc:
                raise WorkerError(
                    PROBLEM_ERROR,
                    f"problem {name!r} cannot have its data built natively at this "
                    f"shape: {exc}; run it with inputs: python",
                ) from exc
        self._native_data = (key, description, layout)
        return description, layout

    def recipe(self, request: dict[str, Any]) -> dict[str, Any]:
        """How to launch a Triton job natively: its cubin, symbol, grid, block,
        shared memory and arguments over the shared tensors (or, in a lane
        without torch, the tensors the native worker built)."""
        self._require_lane("recipe")
        job = Job(request.get("job"))
        cache_dir = request.get("cache_dir")
        if not isinstance(cache_dir, str) or not cache_dir:
            raise bad_request("recipe needs 'cache_dir', where the cubin goes")
        return self._recipe(job, request.get("seed", 0), cache_dir)

    def _recipe(
        self, job: Job, seed: Any, cache_dir: str, compiled: Optional[tuple[Any, Any, Any]] = None
    ) -> dict[str, Any]:
        """`recipe`'s answer; `compiled`: (problem, method, JIT context) where
        this worker has just compiled the job (else compiled, or found, here)."""
        if self.target is None:
            inputs, tensors, out_index = self._shared_inputs(job, seed)
        else:
            inputs, tensors, out_index = self._described_inputs(job, seed)
        if compiled is not None:
            problem, method, ctx = compiled
        else:
            problem, method = self._problem_and_method(job)
            # The same JIT context as a Python check: the config's compile options
            # and an `ir:` method's IR apply to the kernel launched natively too.
            ctx = self._job_context(job)
            self._compile(job, problem, method, ctx)
        with stage("bind"), jit.active(ctx):
            launch = method.bind(problem, inputs, job.config)
        _require_ir_applied(job, ctx)
        native_launch = getattr(launch, "native", None)
        if native_launch is None:
            raise WorkerError(
                PROBLEM_ERROR,
                f"method {job.method!r} does not offer a native launch (its Launch has no 'native'); use launch: python",
            )
        from tunelab import native

        kernel, compiled, grid, values = native_launch
        # The method's own output stands for the shared (built) one: the native launch writes there.
        tensors[launch.out.data_ptr()] = out_index
        try:
            recipe = native.triton_recipe(kernel, compiled, grid, values, tensors, cache_dir)
        except native.NotNative as exc:
            raise WorkerError(PROBLEM_ERROR, f"method {job.method!r} cannot be launched natively: {exc}") from exc
        # What the compiler made of it, as a Python check reports it. Without
        # a GPU here to load it on, the native worker reports what it loads.
        recipe["kernels"] = [jit.resources(compiled, load=True)] if self.target is None else []
        return recipe

    def _shared_inputs(self, job: Job, seed: Any) -> tuple[Any, dict[int, int], int]:
        """(inputs, data address -> tensor index, the output's index) of the shared shape."""
        _, _, shared, _ = self._shared_for({"problem": job.problem, "shape": job.shape, "seed": seed})
        assert self._shape_cache is not None  # _shared_for built the shape
        return self._shape_cache[1], {t["ptr"]: i for i, t in enumerate(shared["tensors"])}, shared["out"]

    def _described_inputs(self, job: Job, seed: Any) -> tuple[Any, dict[int, int], int]:
        """`_shared_inputs` in a lane without torch (`inputs: native`): stand-ins
        of the tensors the native worker built, whose made-up addresses name
        them (tunelab.native_data)."""
        shape = _shape_of("recipe", {"problem": job.problem, "shape": job.shape, "seed": seed})
        if self.role == "compile":
            # Deterministic from the shape and seed: the description the
            # lane's worker gives the native worker, made here again.
            self._describe(*shape)
        elif self._native_data is None or self._native_data[0] != shape[3]:
            raise bad_request("this shape's data is not described; send 'native_data' first")
        from tunelab import native_data

        assert self._native_data is not None  # described above
        _, description, layout = self._native_data
        inputs, addresses = native_data.stand_ins(description)
        return inputs, addresses, layout["out"]

    def recipes(self, request: dict[str, Any]) -> dict[str, Any]:
        """`recipe` for several jobs of the shared shape in one call: one
        answer per job, in order, each a recipe with `"ok": true` or the
        job's own failure (`"ok": false`, `class`, `message`)."""
        self._require_lane("recipes")
        jobs = request.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise bad_request("recipes needs 'jobs', a non-empty list of jobs")
        answers: list[dict[str, Any]] = []
        for job in jobs:
            try:
                answers.append({"ok": True, **self.recipe({**request, "job": job})})
            except WorkerError as err:
                answers.append({"ok": False, "class": err.failure_class, "message": err.message})
            except Exception as exc:  # noqa: BLE001 - one job's bug is that job's answer, as `_handle` does
                print("tunelab worker: internal error in recipes:", file=sys.stderr)
                traceback.print_exception(exc, file=sys.stderr)
                message = "internal worker error: " + summarize(exc)
                answers.append({"ok": False, "class": PROBLEM_ERROR, "message": message})
            if answers[-1].get("class") == LAUNCH_ERROR:
                break  # the CUDA context may be poisoned: nothing after it is trusted
        # Jobs not reached after a fault: unanswered, asked for again at their own checks.
        unreached = {"ok": False, "class": LAUNCH_ERROR, "message": "not prepared: an earlier job of the batch faulted"}
        answers += [unreached] * (len(jobs) - len(answers))
        return {"recipes": answers}
