#!/usr/bin/env bash
# GPU check: train the encoder (ViT-B/16, 224 px) and the VLM (Qwen2-0.5B-shaped LM) for a fixed number of steps
# under bf16 on a synthetic release; asserts finite falling loss and a CUDA resume, prints images/s, peak GPU
# memory and loader wait share (training/gpu_check.py). Usage:
#   training/gpu_check.sh [--size real|tiny] [--device cuda|cpu] [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
exec "$PY" training/gpu_check.py "$@"
