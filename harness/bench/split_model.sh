#!/usr/bin/env bash
# Splits the default model into two halves under .gpu/ (ignored by git) so that two device calls,
# each under the 64 MiB carry limit, can bring it to the GPU machine (see gpu_check.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu
split -n 2 -d -a 1 .models/SmolLM2-135M-Instruct.Q4_1.gguf .gpu/model.part
ls -l .gpu/model.part0 .gpu/model.part1
