#!/usr/bin/env bash
# Runs one libFuzzer binary for ctest (tests/fuzz/README.md).
#   run_fuzzer.sh BINARY SECONDS MAX_LEN INPUTS WORK
# SECONDS > 0: fuzz for that long, starting from the files in INPUTS (a copy grows in WORK/corpus).
# SECONDS = 0: run every file in INPUTS once (the regression cases).
# Exit status: 0 when no input crashed, timed out (10 s) or used more than 2 GB; a crashing input
# is saved under WORK/ and its path printed. The last line says how many inputs ran.
set -euo pipefail
binary=$1 seconds=$2 max_len=$3 inputs=$4 work=$5
rm -rf "$work" && mkdir -p "$work/corpus"
common=(-timeout=10 -rss_limit_mb=2048 -max_len="$max_len" -artifact_prefix="$work/" -print_final_stats=1)
if [[ $seconds -eq 0 ]]; then
  mapfile -t files < <(find "$inputs" -type f | sort)
  "$binary" "${common[@]}" "${files[@]}" 2>"$work/log" || { tail -40 "$work/log"; exit 1; }
  echo "ran ${#files[@]} regression inputs from $inputs: no crash, hang or leak"
else
  "$binary" "${common[@]}" -max_total_time="$seconds" "$work/corpus" "$inputs" 2>"$work/log" \
    || { tail -40 "$work/log"; exit 1; }
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$work/log" || true
  echo "fuzzed $seconds s from $(ls "$inputs" | wc -l) seeds: corpus grew to $(ls "$work/corpus" | wc -l) inputs, no crash, hang or leak"
fi
