"""The lane's parts, from traces of a build with instrumentation.patch applied.

Usage: python3 parts.py native-grid-1.trace.json.gz [...]
Prints, per part, how many there were in each run, the median in us and the
us a job (the run's sum over its 48 jobs), for the spans inside the groups.
A `ser`/`parse` span is named by the call it falls in; a `request` span that
holds a Python call (a batch of recipes, the shape's share) is kept apart.
"""

import gzip
import json
import statistics
import sys
from collections import defaultdict

JOBS = 48


def parts(path):
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    track = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    groups = [e for e in spans if track.get(e["tid"]) == "lane0 jobs" and e["name"] == "group"]
    first, last = groups[0]["ts"], groups[-1]["ts"] + groups[-1]["dur"]
    calls = [e for e in spans if track.get(e["tid"]) in ("lane0", "native0") and first <= e["ts"] <= last]
    out = defaultdict(list)
    for e in spans:
        if track.get(e["tid"]) != "diag" or not first <= e["ts"] <= last:
            continue
        name = e["name"]
        if name in ("ser", "parse"):
            around = [c for c in calls if c["ts"] <= e["ts"] <= c["ts"] + c["dur"]]
            name += " " + (f"{track[around[0]['tid']]}:{around[0]['name']}" if around else "?")
        if name == "request" and any(e["ts"] <= c["ts"] <= e["ts"] + e["dur"] for c in calls):
            name = "request (with a recipes/share call)"
        out[name].append(e["dur"])
    return out


def main(paths):
    runs = [parts(p) for p in paths]
    print("| part | count a run | median µs | µs a job |")
    print("| --- | --- | --- | --- |")
    for name in sorted({n for r in runs for n in r}):
        counts = ", ".join(str(len(r.get(name, []))) for r in runs)
        medians = ", ".join(f"{statistics.median(r[name]):.1f}" if r.get(name) else "-" for r in runs)
        per_job = ", ".join(f"{sum(r.get(name, [])) / JOBS:.1f}" for r in runs)
        print(f"| {name} | {counts} | {medians} | {per_job} |")


if __name__ == "__main__":
    main(sys.argv[1:])
