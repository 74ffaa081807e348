#!/usr/bin/env bash
# Submit a tunelab experiment to Slurm as N shards (one GPU each) and a merge
# that runs when they have all ended.
#
#   scripts/slurm/submit.sh MANIFEST N [extra tunelab run args...]
#   scripts/slurm/submit.sh experiments/gptoss.yaml 8
#   scripts/slurm/submit.sh experiments/gptoss.yaml 4 --only E=32
#
# Extra sbatch options (partition, account, time) go in SBATCH_* variables,
# which sbatch reads: SBATCH_PARTITION=gpu SBATCH_ACCOUNT=me scripts/slurm/submit.sh ...
# Run it again with the same MANIFEST, N and arguments to resume: every shard
# resumes in its directory and the merge adds only what is new.
set -euo pipefail
cd "$(dirname "$0")/../.."

MANIFEST="${1:?usage: scripts/slurm/submit.sh MANIFEST N [tunelab run args...]}"
N="${2:?usage: scripts/slurm/submit.sh MANIFEST N [tunelab run args...]}"
shift 2
export TUNELAB_MANIFEST="$MANIFEST" TUNELAB_SHARDS="$N" TUNELAB_ARGS="$*"
export TUNELAB_BIN="${TUNELAB_BIN:-$PWD/target/release/tunelab}"
export TUNELAB_RESULTS="${TUNELAB_RESULTS:-$PWD/results}"
[ -x "$TUNELAB_BIN" ] || { echo "no tunelab binary at $TUNELAB_BIN: cargo build --release" >&2; exit 1; }

array=$(sbatch --parsable --export=ALL --array="1-$N" scripts/slurm/shard.sbatch)
merge=$(sbatch --parsable --export=ALL --dependency="afterany:$array" scripts/slurm/merge.sbatch)
echo "shards: job $array (array 1-$N); merge: job $merge, after all of them"
echo "results: $TUNELAB_RESULTS (each shard in $TUNELAB_RESULTS/.shards/$N/K)"
