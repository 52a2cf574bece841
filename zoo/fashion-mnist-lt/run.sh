#!/usr/bin/env bash
# Every run of a Fashion-MNIST-LT zoo page, in the order they were made: for each seed, each row's
# pretraining (its final kNN included), then its classifier stages and its kNN at k 20 and 10;
# then the two methods through solo-learn's own main_pretrain.py and main_linear.py. Run from
# anywhere, with solo-ext installed in an environment where solo-learn is importable (its own
# methods are rows of the table) and SOLO_LEARN_DIR naming its checkout. A run that finished is skipped, so the script
# picks up where it stopped.
#
#   SOLO_LEARN_DIR=~/solo-learn zoo/fashion-mnist-lt/run.sh   # zoo/fashion-mnist-lt.md
#   SEEDS="0" ROWS="dscl untrained" zoo/fashion-mnist-lt/run.sh   # a part of it
#   zoo/fashion-mnist-lt/long.sh   # zoo/fashion-mnist-lt-long.md: this script at 25 epochs
#
# FM: the folder of the four IDX files (Debian's dataset-fashion-mnist by default); OUT: where
# the runs go, one folder per row and seed (trained_models/<method>/<run id>/ below it), with
# each command's log in $OUT/logs and each command's wall time in $OUT/times.tsv. EPOCHS: the
# pretraining budget (the recipes' 5 by default; the untrained floor is always one epoch);
# VAL_EVERY: validate the online classifier every so many epochs (EPOCHS by default: once, at
# the end, where the final kNN is taken; each validation reads the 10,000 test images, as long
# as an epoch of training); PHASES: "pretrain linear", or one of them;
# SOLO_LEARN_SCRIPTS: the methods run through solo-learn's own scripts too ("" for none).
#
# Rows beyond the recipes: PBSD's ablations, each the pbsd recipe with one key changed:
#   pbsd-w0         ++method_kwargs.pbsd_weight=0 (the patch forwards without their loss)
#   pbsd-16px       ++method_kwargs.box_crop_size=16 (patches resized to 16 px, not 8)
#   pbsd-whole      ++method_kwargs.box_scale=[1,1] (every box the whole query crop)
#   pbsd-viewstats  ++method_kwargs.patch_running_stats=false (BatchNorm's running statistics
#                   of the full views only)
set -euo pipefail
zoo="$(cd "$(dirname "$0")" && pwd)"
FM="${FM:-/usr/share/datasets/fashion-mnist}"
OUT="${OUT:-$PWD/zoo-runs/fashion-mnist-lt}"
SOLO_LEARN_DIR="${SOLO_LEARN_DIR:?set SOLO_LEARN_DIR to the checkout of solo-learn}"
SEEDS="${SEEDS:-0 1 2}"
ROWS="${ROWS:-untrained scl dscl pbsd kcl tsc paco gpaco bcl densecl all4one_ct mocov2plus supcon simclr byol}"
SOLO_LEARN_SCRIPTS="${SOLO_LEARN_SCRIPTS-dscl pbsd}"
EPOCHS="${EPOCHS:-5}"
VAL_EVERY="${VAL_EVERY:-$EPOCHS}"
PHASES="${PHASES:-pretrain linear}"
# the classifier stages (the linear recipe's budgets: scripts/linear/fashion-mnist-lt/dscl.yaml)
STAGES=("++classifier_stage=[balanced_linear,crt,logit_adjust]")
mkdir -p "$OUT/logs"

timed() {  # label, command...: runs it with its log, appends "label seconds status" to times.tsv
  local label=$1 start status
  shift
  start=$(date +%s)
  status=0
  "$@" >"$OUT/logs/$label.log" 2>&1 || status=$?
  printf '%s\t%s\t%s\n' "$label" "$(($(date +%s) - start))" "$status" >>"$OUT/times.tsv"
  return "$status"
}

run_dir() {  # the one run directory under a row's folder
  dirname "$(find "$1" -name args.json -path '*trained_models*' | head -n 1)"
}

checkpoint() {  # the run's last checkpoint
  ls -t "$1"/*.ckpt | head -n 1
}

budget() {  # the pretraining budget's overrides
  echo "max_epochs=$EPOCHS ++check_val_every_n_epoch=$VAL_EVERY"
}

pretrain_args() {  # row -> the config (and overrides) of its pretraining
  case $1 in
    untrained)  # the floor: random weights, BatchNorm statistics of one epoch of training crops
      echo "--config-name fashion-mnist-lt/scl name=untrained-fashion-mnist-lt max_epochs=1" \
        "optimizer.lr=1e-8 optimizer.classifier_lr=1e-8 scheduler.warmup_start_lr=1e-8" ;;
    mocov2plus | supcon | simclr | byol)  # solo-learn's own methods
      echo "--config-path $zoo/configs --config-name $1 $(budget)" ;;
    pbsd-w0) echo "--config-name fashion-mnist-lt/pbsd name=$1 ++method_kwargs.pbsd_weight=0 $(budget)" ;;
    pbsd-16px) echo "--config-name fashion-mnist-lt/pbsd name=$1 ++method_kwargs.box_crop_size=16 $(budget)" ;;
    pbsd-whole) echo "--config-name fashion-mnist-lt/pbsd name=$1 ++method_kwargs.box_scale=[1,1] $(budget)" ;;
    pbsd-viewstats)
      echo "--config-name fashion-mnist-lt/pbsd name=$1 ++method_kwargs.patch_running_stats=false $(budget)" ;;
    *) echo "--config-name fashion-mnist-lt/$1 $(budget)" ;;
  esac
}

has() {  # phase: whether PHASES holds it
  [[ " $PHASES " == *" $1 "* ]]
}

for seed in $SEEDS; do
  for row in $ROWS; do
    where="$OUT/$row/seed$seed"
    if has pretrain && [ ! -f "$where/pretrained" ]; then
      rm -rf "$where"
      # shellcheck disable=SC2046
      timed "$row-seed$seed-pretrain" solo-ext-pretrain $(pretrain_args "$row") seed="$seed" \
        data.train_path="$FM" checkpoint.dir="$where/trained_models"
      touch "$where/pretrained"
    fi
    if has linear && [ -f "$where/pretrained" ] && [ ! -f "$where/done" ]; then
      dir=$(run_dir "$where")
      timed "$row-seed$seed-linear" solo-ext-linear --config-name fashion-mnist-lt/dscl \
        "pretrained_feature_extractor='$(checkpoint "$dir")'" "${STAGES[@]}" seed="$seed" \
        data.train_path="$FM"
      # the kNN again at the recipes' k 20 and at k 10, below the few classes' 10 and 16 images
      timed "$row-seed$seed-knn" solo-ext-knn pretrained_checkpoint_dir="$dir" "k=[20,10]"
      touch "$where/done"
    fi
  done
  for method in $SOLO_LEARN_SCRIPTS; do  # solo-learn's own scripts, unmodified
    has pretrain && has linear || continue
    where="$OUT/solo-learn-scripts-$method/seed$seed"
    if [ ! -f "$where/done" ]; then
      rm -rf "$where"
      timed "solo-learn-$method-seed$seed-pretrain" python "$SOLO_LEARN_DIR/main_pretrain.py" \
        --config-name "fashion-mnist-lt/$method" $(budget) seed="$seed" data.train_path="$FM" \
        checkpoint.dir="$where/trained_models"
      dir=$(run_dir "$where")
      timed "solo-learn-$method-seed$seed-knn" solo-ext-knn pretrained_checkpoint_dir="$dir" "k=[20,10]"
      # (in the run's folder: main_linear.py writes its CSV log where it runs)
      timed "solo-learn-$method-seed$seed-linear" bash -c 'cd "$0" && exec "$@"' "$where" \
        python "$SOLO_LEARN_DIR/main_linear.py" --config-name fashion-mnist-lt/dscl \
        "pretrained_feature_extractor='$(checkpoint "$dir")'" seed="$seed" data.train_path="$FM" \
        checkpoint.dir="$where/linear"
      touch "$where/done"
    fi
  done
done
