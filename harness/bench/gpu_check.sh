#!/usr/bin/env bash
# The GPU check, run in one call on the device machine (one H200), from the repository root:
# build against that machine's torch, run the gpu-labelled tests (tests/gpu_test.cpp: paged attention
# and K/V writes against the CPU kernels; the row-count-invariant linear and RMSNorm bitwise across
# launches of 1 to 130 rows; a 26-row bf16 window forward bitwise equal to one-row decoding, on
# SmolLM2 and on the random-weights Llama-3.1-8B shape; float32 and bf16 forwards against the CPU),
# then the bf16 decode benchmark
# (batch 1, 8, 64 at contexts 2048 and 8128: 8128 + 32 decode tokens fit the 8192 context, and 64 x 8128
# prompt tokens fit the corpus the bench cuts prompts from) with its memory roofline, then the Llama-3.1-8B shape with
# random weights (timing only) at the anchor's shapes beside the anchor, then decoding on each
# offline compressor's cache on the GPU. Logs and results go to $OUT.
#
# Inputs that do not travel with the repository (the model is 98 MB, a call carries 64 MiB):
#   the model    .models/SmolLM2-135M-Instruct.Q4_1.gguf, or halves made by harness/bench/split_model.sh:
#                .gpu/model.part1 carried now, .gpu/model.part0 or /root/vericache_model.part0 left by an
#                earlier call on the same (still warm) machine
#   GoogleTest   the system's, or Debian's sources copied to .gpu/googletest (-DVC_GTEST_SOURCE_DIR)
#   a prebuilt   optional: .gpu/prebuilt/ from harness/bench/gpu_pack_prebuilt.sh (saves the device
#                minutes of a build); then nothing is built here, the
#                binaries run against this machine's torch, and gpu_tests runs directly (no ctest)
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
MODEL=.models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [[ ! -f $MODEL ]]; then
  part0=.gpu/model.part0
  [[ -f $part0 ]] || part0=/root/vericache_model.part0
  if [[ ! -f $part0 || ! -f .gpu/model.part1 ]]; then echo "gpu_check: no model (see the header)"; exit 1; fi
  mkdir -p .models && cat "$part0" .gpu/model.part1 > "$MODEL"
fi
[[ "$(sha256sum "$MODEL" | cut -d' ' -f1)" == "$MODEL_SHA256" ]] || { echo "gpu_check: $MODEL has the wrong SHA-256"; exit 1; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; git log -1 --format='commit %H' 2>/dev/null; } | tee "$OUT/machine.txt"
{ echo "build prerequisites on this machine (for building here):"
  for h in /usr/include/boost/dll.hpp /usr/include/hdf5/serial/hdf5.h /usr/include/nlohmann/json.hpp; do
    [[ -e $h ]] && echo "  $h present" || echo "  $h missing"; done; } >> "$OUT/machine.txt"
if [[ -x .gpu/prebuilt/vericache ]]; then
  # Built at /work/main (RUNPATH, plugin and model directories are fixed at build time): give this copy that path.
  if [[ "$(realpath /work/main 2>/dev/null)" != "$(realpath "$PWD")" ]]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
  BUILD="$(cat .gpu/prebuilt/build_dir)"  # where it was built: its binaries look for plugins there
  echo "prebuilt at: $(cat .gpu/prebuilt/commit)" | tee -a "$OUT/machine.txt"
  mkdir -p "$BUILD"/core "$BUILD"/tests "$BUILD"/plugins
  cp .gpu/prebuilt/vericache "$BUILD"/ && cp .gpu/prebuilt/gpu_tests "$BUILD"/tests/ &&
    cp .gpu/prebuilt/libvericache_core.so "$BUILD"/core/ && cp .gpu/prebuilt/plugins/* "$BUILD"/plugins/
  TORCH_LIB="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$TORCH_LIB:$TORCH_LIB/../../nvidia/cu13/lib:/tmp/vc_missing_libs"
  mkdir -p /tmp/vc_missing_libs
  for _ in 1 2 3; do  # libraries this machine lacks, from the carried ones; repeated for their own needs
    for lib in $(ldd "$BUILD"/vericache "$BUILD"/tests/gpu_tests "$BUILD"/plugins/*.so | awk '/not found/ {print $1}' | sort -u); do
      [[ -f .gpu/prebuilt/lib/$lib ]] && ln -sf "$PWD/.gpu/prebuilt/lib/$lib" /tmp/vc_missing_libs/
    done
  done
  echo "prebuilt binaries; libraries taken from the carried ones: $(ls /tmp/vc_missing_libs | tr '\n' ' ')" | tee -a "$OUT/machine.txt"
  ldd "$BUILD"/vericache "$BUILD"/tests/gpu_tests | grep 'not found' && { echo "gpu_check: libraries missing"; exit 1; }
  "$BUILD"/tests/gpu_tests > "$OUT/gpu_tests.log" 2>&1
else
  PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  extra=()
  [[ -d .gpu/googletest ]] && extra+=("-DVC_GTEST_SOURCE_DIR=$PWD/.gpu/googletest")
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" "${extra[@]}" \
    > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -E 'error' "$OUT/build.log" | head -40; exit 1; }
  BUILD=build-gpu
  ctest --test-dir build-gpu -L gpu --output-on-failure > "$OUT/gpu_tests.log" 2>&1
fi
tail -12 "$OUT/gpu_tests.log"
"$BUILD"/vericache bench --device cuda --dtype bfloat16 --contexts 2048,8128 --batches 1,8,64 --decode-tokens 32 \
  --json > "$OUT/gpu_bench.jsonl" 2> "$OUT/gpu_bench.err" || tail -20 "$OUT/gpu_bench.err"
python3 harness/bench/roofline.py --bandwidth-tbs 4.3 "$OUT/gpu_bench.jsonl" | tee "$OUT/gpu_bench.md"

# The Llama-3.1-8B shape with random weights (timing only, named so in every line): the anchor's
# decode shapes and its 26-row verify window at B=32 ctx 8K, K/V random (no prefill), 20 timed forwards each.
for grid in "8192 1,8,32 1" "2048 32 1" "32768 8 1" "8192 32 26"; do
  read -r ctx batches window <<< "$grid"
  "$BUILD"/vericache bench --random-weights llama-3.1-8b --device cuda --dtype bfloat16 --contexts "$ctx" \
    --batches "$batches" --window "$window" --decode-tokens 20 --json >> "$OUT/gpu_bench_8b.jsonl" 2>> "$OUT/gpu_bench_8b.err" ||
    { echo "gpu_check: 8B bench $grid failed"; tail -5 "$OUT/gpu_bench_8b.err"; }
done
python3 harness/bench/roofline.py --bandwidth-tbs 4.3 --peak-tflops 790 "$OUT/gpu_bench_8b.jsonl" | tee "$OUT/gpu_bench_8b.md"

# Compressors on the GPU path (issue 3): every bundled offline plugin compacts a cuda cache and
# decodes on it; the JSON lines record resident vs full slots and timings.
head -c 12000 datasets/tokenizer_corpus/corpus.txt > "$OUT/compress_prompt.txt"
for c in snapkv expected_attention kvzip; do
  "$BUILD"/vericache generate --device cuda --compressor "$c" -c 0.25 -n 16 --ignore-eos --json \
    -f "$OUT/compress_prompt.txt" >> "$OUT/gpu_compressors.jsonl" 2>> "$OUT/gpu_compressors.err" ||
    { echo "gpu_check: $c failed"; tail -5 "$OUT/gpu_compressors.err"; }
done

# At most 8 files come back from the device machine: keep the tables, the machine, the test log and the
# compressor lines, and pack everything else into one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v -x -E 'machine.txt|gpu_tests.log|gpu_bench.md|gpu_bench_8b.md|gpu_compressors.jsonl|check.log'))
ls "$OUT"
