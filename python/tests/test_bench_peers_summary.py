"""bench/peers_summary.py on a results directory made here: the columns it derives."""

import csv
import json

from conftest import load_bench

FIELDS = [
    "M",
    "E",
    "topk",
    "K",
    "N",
    "dtype",
    "act_dtype",
    "activation",
    "method",
    "kind",
    "job_id",
    "config",
    "median_us",
    "ci_low_us",
    "ci_high_us",
    "n",
    "finalist",
    "tflops",
    "gbs",
    "roofline_pct",
    "baseline_job_id",
    "baseline_us",
    "speedup_vs_baseline",
    "flags",
]


def row(method, job_id, config, us, baseline_job_id="", baseline_us=""):
    return {
        "M": 1024,
        "E": 128,
        "topk": 4,
        "K": 2880,
        "N": 2880,
        "dtype": "mxfp4",
        "act_dtype": "bf16",
        "activation": "swiglu_oai",
        "method": method,
        "kind": "python",
        "job_id": job_id,
        "config": json.dumps(config),
        "median_us": us,
        "baseline_job_id": baseline_job_id,
        "baseline_us": baseline_us,
    }


def test_the_table_compares_vllms_setting_the_heuristic_and_tunelab(tmp_path, capsys):
    with open(tmp_path / "best.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerow(
            row("triton_kernels", "t1", {"w1_block_m": 64, "w1_num_stages": 3, "w1_split_k": 0}, 1300.0, "base", 1469.0)
        )
        w.writerow(row("triton_kernels_heuristic", "h1", {}, 1480.0))
        w.writerow(row("triton_dot_scaled", "d1", {"BLOCK_SIZE_M": 64}, 2000.0))
        w.writerow(row("triton", "p1", {"BLOCK_SIZE_M": 64}, 2500.0))
    # triton_kernels names its matmul kernels _matmul_ogs_<layouts>_<dtypes>_<BM>x<BN>x<BK>x<SPLIT_K>.
    kernels = [
        {"name": "_matmul_ogs_NNT_bf16xbf16xmxfp4_32x256x128x1", "num_warps": 8, "num_stages": 4},
        {"name": "_combined_routing_compute", "num_warps": 4, "num_stages": 1},
    ]
    with open(tmp_path / "journal.jsonl", "w") as f:
        for job_id in ("base", "h1"):
            f.write(json.dumps({"type": "job", "job_id": job_id, "kernels": kernels}) + "\n")
    assert load_bench("peers_summary").main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:9] == [
        "128",
        "2880",
        "1024",
        "1469.00",
        "1480.00",
        "1300.00",
        "1.130×",
        "1.138×",
        "w1_block_m=64 w1_num_stages=3",
    ]
    assert cells[9:12] == ["triton_dot_scaled", "2000.00", "0.735×"]
    assert cells[12] == "32x256x128x1 w8 s4" == cells[13]
