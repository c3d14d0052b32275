#!/usr/bin/env bash
# Installs PyTorch (CPU use only) into a virtual environment for `cargo xtask bench memory`:
#   tests/bench/pytorch/setup_torch.sh            # into ~/.cache/frugal-torch-venv (or $VENV)
# The bench finds it there (or use --python / FRUGAL_TORCH_PYTHON). Without it the bench prints frugal's
# numbers only and says that PyTorch was not measured.
set -euo pipefail
VENV="${VENV:-$HOME/.cache/frugal-torch-venv}"
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
  # seq_ref.py (`bench seq`) also reads safetensors; venvs made before it was listed lack it.
  "$PY" -c 'import safetensors' >/dev/null 2>&1 || "$VENV/bin/pip" install safetensors
  echo "PyTorch already importable from $PY"; exit 0
fi
python3 -m venv "$VENV"
# PyPI's Linux x86_64 torch wheel is the CUDA build; its declared deps would add triton and ~3 GB of CUDA
# libraries. Install torch alone, then the plain-Python deps, then only the CUDA shared libraries that
# libtorch*.so links against (import fails without them; nothing runs on a GPU).
"$VENV/bin/pip" install --no-deps 'torch==2.15.0'
"$VENV/bin/pip" install filelock typing-extensions sympy networkx jinja2 fsspec numpy safetensors 'setuptools>=77.0.3'
mapfile -t CUDA_REQS < <("$PY" - <<'PYEOF'
import importlib.metadata as md
for r in md.requires("torch") or []:
    spec = r.split(";")[0].strip()
    if "extra ==" in r or spec.startswith(("triton", "cuda-bindings")):
        continue
    if spec.startswith(("cuda-toolkit", "nvidia-")):
        print(spec)
PYEOF
)
"$VENV/bin/pip" install "${CUDA_REQS[@]}"
"$PY" -c 'import torch; print("PyTorch", torch.__version__, "ready in", __import__("sys").prefix)'
