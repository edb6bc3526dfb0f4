#!/usr/bin/env bash
# GPU check: train the realistic-size encoder for a few hundred steps on a synthetic snapshot and print
# throughput (images/s) and peak GPU memory. Usage:
#   training/gpu_check.sh [--device cuda|cpu] [--steps N] [--config FILE] [--nproc N]
# --device cpu runs the same path on the CPU with the tiny config (a smoke test of the script).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda; STEPS=300; CONFIG=""; NPROC=1
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2;;
    --steps) STEPS="$2"; shift 2;;
    --config) CONFIG="$2"; shift 2;;
    --nproc) NPROC="$2"; shift 2;;
    *) echo "error: unknown argument $1" >&2; exit 2;;
  esac
done
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
if [ -z "$CONFIG" ]; then
  if [ "$DEVICE" = cuda ]; then CONFIG=config/training/encoder-gpu.yaml; else CONFIG=config/training/encoder-tiny-cpu.yaml; fi
fi
WORK="$(mktemp -d)"
trap 'chmod -R u+w "$WORK"; rm -rf "$WORK"' EXIT
"$PY" training/gpu_check.py --work "$WORK" --device "$DEVICE" --steps "$STEPS" --config "$CONFIG" --nproc "$NPROC"
