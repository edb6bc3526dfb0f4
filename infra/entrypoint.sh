#!/usr/bin/env bash
# Image entrypoint: `docker run IMAGE scheduler` runs `airflow scheduler`; an executable as the first argument
# (bash, python, medreco, airflow ...) runs as given, which is how the official Helm chart calls the image
# (`bash -c "exec airflow scheduler"`).
set -euo pipefail
if [[ $# -eq 0 ]]; then
  exec airflow version
fi
if command -v -- "$1" >/dev/null 2>&1; then
  exec "$@"
fi
exec airflow "$@"
