"""Run one tunelab experiment over a Ray cluster: one shard per GPU, merged.

    python -m tunelab.ray experiments/gptoss.yaml [--address ADDR] [--shards N]
        [--tunelab PATH] [--results-dir DIR] [--interpret] [-- extra tunelab run args]

Starts N Ray tasks (N = the cluster's GPUs unless --shards says), each asking
for one GPU (``num_gpus=1``; Ray sets ``CUDA_VISIBLE_DEVICES`` for it), each
running ``tunelab run M.yaml --shard k/N`` into a results directory of its
own, ``DIR/.shards/N/k`` (resumable: run the same command again and every
shard resumes there). As jobs finish, each task reports its count and the
launcher prints the progress. At the end each task sends its journals back;
the launcher writes them under ``DIR/.shards/N/k`` on this machine and runs
``tunelab merge`` into ``DIR/<experiment>/<device>`` for every experiment
directory the shards wrote (the manifest's companions too), which
regenerates every output.

Where things must be, on every node:

- the ``tunelab`` binary: ``--tunelab PATH`` (a path valid on every node),
  else ``tunelab`` on the node's PATH, else ``target/release/tunelab`` under
  the working directory;
- the working directory (this process's, by default; ``--workdir``) with
  the manifest and what it includes: the same checkout at the same path on
  every node, or a shared filesystem;
- the workers' Python (torch, Triton): pass ``-- --python PATH``, or set
  ``TUNELAB_PYTHON`` here: every ``TUNELAB_*`` variable of this process is
  passed on to the tasks.

``--interpret`` runs Triton's interpreter in CPU tasks (``num_cpus=1``, no
GPU): how CI tests this launcher on a local CPU-only cluster. Without
``--address`` a local Ray instance is started. Exit status: the worst of the
shards' and the merge's (0 all done, 3 some jobs failed, ...).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Any
from pathlib import Path

JOURNAL = "journal.jsonl"


def _parse(argv):
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    else:
        extra = []
    p = argparse.ArgumentParser(
        prog="python -m tunelab.ray",
        description="Run a tunelab experiment over a Ray cluster, one shard per GPU, and merge the shards.",
    )
    p.add_argument("manifest", help="the experiment's manifest, e.g. experiments/gptoss.yaml")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument("--shards", type=int, help="number of shards (default: the cluster's GPUs)")
    p.add_argument("--tunelab", help="the tunelab binary on every node (default: tunelab on PATH)")
    p.add_argument("--results-dir", default="results", help="where the merged results go (default: results)")
    p.add_argument("--workdir", help="working directory of every task (default: this one)")
    p.add_argument("--interpret", action="store_true", help="Triton's interpreter in CPU tasks (no GPU)")
    p.add_argument("--num-cpus", type=int, help="CPUs of a local Ray instance (default: Ray's)")
    args = p.parse_args(argv)
    args.extra = extra
    return args


def find_tunelab(explicit, workdir):
    """The tunelab binary, as a task sees it: see the module documentation."""
    if explicit:
        return explicit
    on_path = shutil.which("tunelab")
    if on_path:
        return on_path
    built = Path(workdir) / "target" / "release" / "tunelab"
    if built.is_file():
        return str(built)
    raise FileNotFoundError(
        "no tunelab binary: pass --tunelab PATH (a path valid on every node), put tunelab on PATH, "
        f"or build it (cargo build --release) in {workdir}"
    )


def _journal_dirs(root: Path):
    """Results directories (holding a live journal) under root, relative to it."""
    rels = (p.parent.relative_to(root) for p in root.rglob(JOURNAL))
    return sorted(r for r in rels if ".shards" not in r.parts)


def _count_jobs(root: Path) -> int:
    n = 0
    for rel in _journal_dirs(root):
        try:
            with open(root / rel / JOURNAL, "rb") as f:
                n += sum(1 for line in f if line.startswith(b'{"type":"job"'))
        except OSError:
            pass
    return n


def run_shard(spec):
    """A Ray generator task body: run one shard, yield progress, then its journals."""
    stage = Path(spec["stage"])
    stage.mkdir(parents=True, exist_ok=True)
    binary = find_tunelab(spec["tunelab"], spec["workdir"])
    cmd = [binary, "run", spec["manifest"], "--shard", spec["shard"], "--results-dir", str(stage), "--quiet"]
    cmd += spec["extra"]
    log_path = stage / "tunelab.log"
    env = dict(os.environ)
    env.update(spec["env"])
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=spec["workdir"], stdout=log, stderr=subprocess.STDOUT, env=env)
        seen = -1
        while True:
            code = proc.poll()
            n = _count_jobs(stage)
            if n != seen:
                seen = n
                yield {"kind": "progress", "shard": spec["shard"], "jobs": n}
            if code is not None:
                break
            time.sleep(0.5)
    journals = {}
    for rel in _journal_dirs(stage):
        journals[str(rel)] = (stage / rel / JOURNAL).read_bytes()
    tail = log_path.read_text(errors="replace").splitlines()[-20:]
    yield {
        "kind": "done",
        "shard": spec["shard"],
        "code": code,
        "journals": journals,
        "log": tail,
        "host": os.uname().nodename,
    }


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        import ray
    except ImportError:
        print("tunelab.ray: Ray is not installed here: pip install ray", file=sys.stderr)
        return 4
    workdir = os.path.abspath(args.workdir or os.getcwd())
    manifest = os.path.abspath(os.path.join(workdir, args.manifest))
    results = Path(args.results_dir).resolve()
    init = {"address": args.address} if args.address else {}
    if args.num_cpus and not args.address:
        init["num_cpus"] = args.num_cpus
    # Quiet start-up; the tasks' own output goes to their logs.
    ray.init(log_to_driver=False, **init)
    try:
        resources = ray.cluster_resources()
        shards = args.shards or int(resources.get("GPU", 0))
        if shards < 1:
            print(
                "tunelab.ray: the cluster has no GPU; pass --shards N (with --interpret to run Triton's interpreter on CPUs)",
                file=sys.stderr,
            )
            return 2
        extra = list(args.extra) + (["--interpret"] if args.interpret and "--interpret" not in args.extra else [])
        env = {k: v for k, v in os.environ.items() if k.startswith("TUNELAB_")}
        resources = {"num_cpus": 1, "num_gpus": 0} if args.interpret else {"num_cpus": 1, "num_gpus": 1}
        task = ray.remote(run_shard).options(**resources, max_retries=1)
        stages = results / ".shards" / str(shards)
        gens = {}
        for k in range(1, shards + 1):
            spec = {
                "shard": f"{k}/{shards}",
                "stage": str(stages / str(k)),
                "tunelab": args.tunelab,
                "workdir": workdir,
                "manifest": manifest,
                "extra": extra,
                "env": env,
            }
            gens[task.remote(spec)] = spec["shard"]
        print(f"tunelab.ray: {shards} shards of {args.manifest} on {resources_text(ray)}", flush=True)
        progress = {shard: 0 for shard in gens.values()}
        done = {}
        started = time.monotonic()
        pending = list(gens)
        while pending:
            # Streaming generators' refs: Ray's stubs type them as plain ObjectRefs.
            waited: Any = ray.wait(pending, num_returns=1, timeout=5.0)
            ready, pending = waited
            for gen in ready:
                try:
                    event: dict = ray.get(next(gen))
                except StopIteration:
                    continue
                pending.append(gen)
                shard = event["shard"]
                if event["kind"] == "progress":
                    progress[shard] = event["jobs"]
                    print(
                        f"[{time.monotonic() - started:7.1f} s] shard {shard}: {event['jobs']} jobs; "
                        f"{sum(progress.values())} jobs finished over all shards",
                        flush=True,
                    )
                else:
                    done[shard] = event
                    print(f"shard {shard} on {event['host']}: exit {event['code']}", flush=True)
                    if event["code"] not in (0, 3):
                        print("\n".join("  " + line for line in event["log"]), flush=True)
        missing = sorted(set(gens.values()) - set(done))
        if missing:
            print(
                f"tunelab.ray: no result from shard(s) {', '.join(missing)}: run the same command to resume",
                file=sys.stderr,
            )
        code = gather_and_merge(done, stages, results, args, workdir)
        return max(code, 1) if missing else code
    finally:
        ray.shutdown()


def resources_text(ray) -> str:
    r = ray.cluster_resources()
    nodes = len([n for n in ray.nodes() if n.get("Alive")])
    return f"{nodes} node(s), {int(r.get('GPU', 0))} GPU(s), {int(r.get('CPU', 0))} CPU(s)"


def gather_and_merge(done, stages: Path, results: Path, args, workdir) -> int:
    """Writes each shard's journals here, then merges each experiment directory."""
    worst = 0
    by_dir: dict = {}
    for shard, event in sorted(done.items()):
        worst = max(worst, event["code"] if event["code"] is not None else 1)
        k = shard.split("/")[0]
        for rel, data in event["journals"].items():
            local = stages / k / rel
            local.mkdir(parents=True, exist_ok=True)
            # The shard's whole journal: it replaces a copy from an earlier gather.
            tmp = local / (JOURNAL + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(local / JOURNAL)
            by_dir.setdefault(rel, []).append(local)
    binary = find_tunelab(args.tunelab, workdir)
    for rel, dirs in sorted(by_dir.items()):
        into = results / rel
        cmd = [binary, "merge", *map(str, dirs), "--into", str(into)]
        merged = subprocess.run(cmd, cwd=workdir)
        worst = max(worst, merged.returncode)
        print(f"merged {len(dirs)} shard(s) into {into}", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
