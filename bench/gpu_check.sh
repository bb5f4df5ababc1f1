#!/usr/bin/env bash
# bench/gpu_check.py from the checkout's root, the checkout first on PYTHONPATH (exogym need not be
# installed: a GPU machine with torch, numpy, tqdm, matplotlib and pytest will do), output
# unbuffered; arguments are passed on (--device cpu --quick, --out DIR, --parts ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"
