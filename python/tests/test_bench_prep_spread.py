"""bench/prep_spread.py's --table: the figures docs/ab.md cites, from a run's JSON."""

import gzip
import json

from conftest import load_bench


def test_the_table_measures_each_rounds_batches_against_each_other(tmp_path):
    # Two preparations, three rounds: the first always 100 us; the second
    # 110 in round 0, 90 in round 1, 100 in round 2.
    doc = {
        "rows": [
            {
                "shape": {"M": 2048},
                "method": "fused_moe",
                "layout": "same",
                "spread": 0.0,
                "round_mad": 0.05,
                "rounds_us": [[100.0, 100.0, 100.0], [110.0, 90.0, 100.0]],
            }
        ]
    }
    path = tmp_path / "run.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    lines = load_bench("prep_spread").table(str(path)).splitlines()
    assert len(lines) == 3
    # Within a round: pstdev(100, 110) = 5 and pstdev(100, 90) = 5, 0 in the
    # third: 10/3 over the mean 100. Between the rounds' means (105, 95, 100): 4.08.
    assert lines[2] == "| 2048 | fused_moe | same | 0.00 % | 5.00 % | 3.33 % | 4.08 % |"


def test_a_pairs_run_gets_its_own_table(tmp_path):
    # Four rounds' log ratios whose mean is log(1.03) and whose sample SD is 0.02.
    import math

    mean, sd = math.log(1.03), 0.02
    doc = {
        "rows": [
            {
                "M": 1536,
                "method": "fused_moe_vllm",
                "side_b": "plant 3 %",
                "way": "interleaved",
                "logs": [mean - sd * 0.866, mean + sd * 0.866, mean - sd * 0.866, mean + sd * 0.866],
                "mean": mean,
                "sd": sd,
            }
        ]
    }
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(doc))
    lines = load_bench("prep_spread").table(str(path)).splitlines()
    assert lines[0].startswith("| M | method | B | way | B / A |")
    # The standard error is SD / sqrt(4 rounds): 1.00 %.
    assert lines[2] == "| 1536 | fused_moe_vllm | plant 3 % | interleaved | 1.0300 | 2.00 % | 1.00 % |"
