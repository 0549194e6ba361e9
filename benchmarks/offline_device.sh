#!/usr/bin/env bash
# Run an offline bundle (tvm_fusion/offline/bundle.py) on a device machine that has
# python3 and numpy but no TVM: TVM's runtime travels as a tarball of the Python package
# without its compiler library (TVM_USE_RUNTIME_LIB=1) plus a tvm-ffi wheel of the
# device's Python.
#
#   benchmarks/offline_device.sh RUNTIME_DIR BUNDLE.tar.gz OUT_DIR [runner args...]
#
# RUNTIME_DIR holds tvmrt.tar.gz (site-packages/tvm minus lib/libtvm_compiler.so) and
# apache_tvm_ffi-*.whl for the device's Python; BUNDLE.tar.gz is the bundle directory,
# tarred. results.jsonl (written as results come, so a run cut short keeps them) and the
# runner's log land in OUT_DIR.
set -euo pipefail
rt=$1 bundle=$2 out=$3
shift 3
site=/tmp/tvmfusion-site work=/tmp/tvmfusion-bundle
mkdir -p "$site" "$work" "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$rt"/apache_tvm_ffi-*.whl
tar xzf "$rt/tvmrt.tar.gz" -C "$site"
tar xzf "$bundle" -C "$work"
dir=$(dirname "$(find "$work" -name device.json | head -1)")
# the CUDA runtime TVM's libtvm_runtime_cuda.so links against (libcudart.so.13)
cudart=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1 || true)
export LD_LIBRARY_PATH="${cudart:+$(dirname "$cudart"):}/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$site" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1 || true
here=$(cd "$(dirname "$0")/.." && pwd)
status=0
for attempt in 1 2 3; do  # a sticky device error kills the process; the re-run resumes
  python3 "$here/tvm_fusion/offline/runner.py" "$dir" --results "$out/results.jsonl" "$@" \
    2>&1 | tee -a "$out/runner.log" \
    && { status=0; break; } || status=$?
done
exit $status
