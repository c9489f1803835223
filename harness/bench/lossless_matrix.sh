#!/usr/bin/env bash
# The whole lossless matrix at one commit (tests/lossless_matrix_test.cpp: 50 prompts x 4 token
# droppers x c in {0.1, 0.25, 0.5} x x in {1, 4, 16, 32} x batches of 1 and 8), recorded in
# results/lossless_matrix_cpu_smollm2.{md,json} with that commit and the wall time.
#
#   harness/bench/lossless_matrix.sh            refuses a tree with uncommitted changes (the record
#                                               names a commit: it must be what ran)
#   harness/bench/lossless_matrix.sh --dirty    runs anyway (the record says "with uncommitted changes")
#   harness/bench/lossless_matrix.sh --draft-policy goodput
#                                               the matrix under an adaptive draft policy (x is each
#                                               window's most), recorded in results/lossless_matrix_goodput_cpu_smollm2.*
#
# The earlier record is replaced: the new one holds only this run's groups, all at one commit. On
# 2 cores it takes hours; run it in the background and keep the machine otherwise idle for clean
# timings (the counts do not depend on timing).
set -euo pipefail
cd "$(dirname "$0")/../.."
dirty=0 policy=fixed
while (($#)); do
  case "$1" in
    --dirty) dirty=1 ;;
    --draft-policy) policy="${2:?--draft-policy needs fixed, confidence, tiers or goodput}"; shift ;;
    *) echo "lossless_matrix.sh: unknown argument '$1' (--dirty, --draft-policy P)" >&2; exit 2 ;;
  esac
  shift
done
if ((!dirty)) && [[ -n "$(git status --porcelain --untracked-files=no -- . ':!results')" ]]; then
  echo "lossless_matrix.sh: the tree has uncommitted changes; commit them, or pass --dirty" >&2
  exit 2
fi
cmake --build build --target lossless_matrix_tests >/dev/null
out=results/lossless_matrix_cpu_smollm2.md
[[ "$policy" != fixed ]] && out="results/lossless_matrix_${policy}_cpu_smollm2.md"
rm -f "${out%.md}.json"
start=$(date +%s)
VERICACHE_MATRIX_DRAFT_POLICY="$policy" VERICACHE_MATRIX_OUT="$out" build/tests/lossless_matrix_tests
echo "lossless_matrix.sh: $(( $(date +%s) - start )) s wall at $(git rev-parse --short HEAD)"
