#!/usr/bin/env bash
# Every run of zoo/fashion-mnist-lt-long.md: run.sh at 25 epochs (950 optimiser steps, 5x the
# recipes' 190), validating the online classifier once at the end, for the rows that test the
# papers' claims and PBSD's ablations, in this order:
#   seeds 0-2 of the untrained floor, solo-learn's SupCon, SCL, DSCL, PBSD and GPaCo;
#   seeds 0-2 of PBSD's ablations (run.sh's pbsd-w0, pbsd-16px, pbsd-whole, pbsd-viewstats);
#   seeds 3 and 4 of SCL, DSCL and PBSD.
# Each (seed, row) is one job; LANES jobs run at once (2 by default), each on one thread
# (OMP_NUM_THREADS=1: on 2 cores two single-threaded runs make about 1.2x the steps of one
# two-threaded run). A rerun skips what is done. Takes run.sh's FM, OUT and PHASES.
#
#   SOLO_LEARN_DIR=~/solo-learn zoo/fashion-mnist-lt/long.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export EPOCHS=25 SOLO_LEARN_SCRIPTS="" OMP_NUM_THREADS=1
export OUT="${OUT:-$PWD/zoo-runs/fashion-mnist-lt-long}"
LANES="${LANES:-2}"
jobs() {  # "seed row" lines, in order
  for seed in 0 1 2; do
    for row in untrained supcon scl dscl pbsd gpaco; do echo "$seed $row"; done
  done
  for seed in 0 1 2; do
    for row in pbsd-w0 pbsd-16px pbsd-whole pbsd-viewstats; do echo "$seed $row"; done
  done
  for seed in 3 4; do
    for row in scl dscl pbsd; do echo "$seed $row"; done
  done
}
jobs | xargs -P "$LANES" -L 1 bash -c 'SEEDS=$0 ROWS=$1 "'"$here"'/run.sh"'
