#!/usr/bin/env bash
# The slow suite: the tests CI leaves out for time (`ctest -L slow`; tests/CMakeLists.txt says which),
# run at one commit and recorded in results/slow_suite_cpu.md with that commit, the CPU, each test's
# result and time, and the tests' own printed numbers (grep-able: every test's output is kept).
#
#   harness/bench/slow_suite.sh           refuses a tree with uncommitted changes
#   harness/bench/slow_suite.sh --dirty   runs anyway (the record says so)
#
# Exit status: ctest's (0 when every slow test passed).
set -uo pipefail
cd "$(dirname "$0")/../.."
dirty=""
if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
  if [[ "${1:-}" != "--dirty" ]]; then
    echo "slow_suite.sh: the tree has uncommitted changes; commit them, or pass --dirty" >&2
    exit 2
  fi
  dirty=" (with uncommitted changes)"
fi
cmake --build build >/dev/null || { echo "slow_suite.sh: the build failed" >&2; exit 1; }
commit=$(git rev-parse --short HEAD)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
log=$(mktemp)
start=$(date +%s)
ctest --test-dir build -L slow --output-on-failure -V >"$log" 2>&1
status=$?
seconds=$(( $(date +%s) - start ))
out=results/slow_suite_cpu.md
{
  echo "# The slow suite (\`ctest -L slow\`), $(nproc) cores"
  echo
  echo "- command: \`harness/bench/slow_suite.sh\` at commit \`$commit\`$dirty, $(date -u +%Y-%m-%d), $cpu"
  echo "- wall time: $seconds s; ctest exit status $status ($( [[ $status -eq 0 ]] && echo 'every test passed' || echo 'a test FAILED'))"
  echo
  echo "## Results"
  echo
  echo '```'
  grep -E "^ *[0-9]+/[0-9]+ Test +#|tests passed|Total Test time" "$log"
  echo '```'
  echo
  echo "## What the tests printed"
  echo
  echo '```'
  grep -E "^[0-9]+: " "$log" | sed -E 's/^[0-9]+: //' | grep -vE "^\[ *(RUN|OK|==========|----------|PASSED) *\]|^Note: Google Test filter|^Test command:|^Test timeout|^Environment variables|^ *$"
  echo '```'
} >"$out.tmp" && mv "$out.tmp" "$out"
rm -f "$log"
echo "slow_suite.sh: $out written ($seconds s, exit status $status)"
exit $status
