#!/usr/bin/env python3
"""Decode speed of VeriCache against full-KV decoding on this CPU, measured in the same run.

Runs `vericache bench-engine --json` (see its --help): per context each of the B requests of a batch
has its own prompt, the next stretch of `context` tokens of the four built prompt sets (datasets/
long_docs, long_code, code_tasks, function_calling: text the model has not memorized), prefilled once
and compressed once per compressor; they decode greedily with full-KV decoding (the baseline) and
with VeriCache (draft on the compressed cache, verify in place on the full one) for each draft
policy: fixed at each draft length x, the adaptive ones (confidence, tiers, goodput; engine/draft_policy.h)
at each --adaptive-draft-lengths (their longest window). `--same-prompt` copies one prompt to every request instead (and the table says so). Every VeriCache run is checked token for token against the baseline ("mismatches").
Reports tokens/s of both, the speedup, the mean acceptance length (vLLM's: 1 + accepted / drafts),
the acceptance rate, and what one draft step and one verify step cost in full-KV decode steps.

Writes results/engine_cpu_smollm2.md and .json (or --out). Usage, from the repository root, after
harness/setup.sh:
  python3 harness/bench/engine_bench.py [--contexts 2048,8000] [--batches 1,8] [--compressors kvzip,snapkv]
                                       [--draft-lengths 8,16,25] [--decode-tokens 64]
                                       [--draft-policies fixed,confidence,tiers,goodput] [--adaptive-draft-lengths 16]
"""
import argparse
import json
import os
import subprocess
import sys

from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="2048,8000")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--compressors", default="kvzip,snapkv")
    ap.add_argument("--ratio", default="0.25")
    ap.add_argument("--draft-lengths", default="8,16,25")
    ap.add_argument("--draft-policies", default="fixed")
    ap.add_argument("--adaptive-draft-lengths", default="16")
    ap.add_argument("--decode-tokens", default="64")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--compute", default="auto", help="the CPU kernels' arithmetic: auto, float32 or integer")
    ap.add_argument("--kv-cache", default="auto",
                    help="the KV cache pages: auto (bfloat16 with integer compute), float32 or bfloat16")
    ap.add_argument("--same-prompt", action="store_true", help="every request decodes a copy of one prompt")
    ap.add_argument("--params", action="append", default=['kvzip={"chunk_size": 128}'],
                    help="NAME=JSON compressor parameters (KVzip's reconstruction chunk must fit after an 8K prompt)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "engine_cpu_smollm2"))
    args = ap.parse_args()
    check_destination(args.out + ".md")
    prov = provenance(ROOT)  # before the run: what is measured is the tree of now
    cmd = [VERICACHE, "bench-engine", "--json", "--contexts", args.contexts, "--batches", args.batches,
           "--compressors", args.compressors, "--ratio", args.ratio, "--draft-lengths", args.draft_lengths,
           "--draft-policies", args.draft_policies, "--adaptive-draft-lengths", args.adaptive_draft_lengths,
           "--decode-tokens", args.decode_tokens, "--threads", args.threads,
           "--compute", args.compute, "--kv-cache", args.kv_cache] + (["--same-prompt"] if args.same_prompt else [])
    # Parameters only for the compressors this run measures (the default names KVzip).
    args.params = [p for p in args.params if p.split("=", 1)[0] in args.compressors.split(",")]
    for p in args.params:
        cmd += ["--params", p]
    print(" ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-engine failed with exit code {done.returncode}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    invocation = "python3 harness/bench/engine_bench.py " + " ".join(sys.argv[1:])
    write_atomically(args.out + ".json", json.dumps({"command": invocation, **prov, "rows": rows}, indent=1) + "\n")
    lines = [
        "# VeriCache decode speed on the CPU, SmolLM2-135M-Instruct",
        "",
        command_line(invocation, prov),
        f"- machine: {prov['cpu']}, {args.threads} threads; verification reads the full cache in place (no copy)",
        f"- compute: {rows[0].get('compute', args.compute) if rows else args.compute} (`--compute {args.compute}`; "
        f"the engine and its full-KV baseline in the same arithmetic)",
        f"- KV cache: {rows[0].get('kv_cache', args.kv_cache) if rows else args.kv_cache} (`--kv-cache {args.kv_cache}`; "
        f"the engine and its full-KV baseline on the same pages)",
        f"- compressor parameters: {'; '.join(args.params) or 'defaults'}",
        (f"- prompts: one per context, copied to all B requests of a batch (`--same-prompt`)" if args.same_prompt else
         f"- prompts: per context, request i of a batch takes the i-th stretch of `context` tokens of the built prompt "
         f"sets long_docs, long_code, code_tasks and function_calling joined (text the model has not memorized); "
         f"batch 1 runs the first") +
        f"; each prompt prefilled once and compressed once at c = {args.ratio}; {args.decode_tokens} tokens per "
        f"request, EOS ignored",
        "- full-KV tok/s: the baseline in the same run, decoded before the first VeriCache row of a batch size and "
        "again after each row; a row's ratios are against the mean of the baselines just before and just after it "
        "(the machine's speed drifts between runs minutes apart; one token per request per step); full-KV drift: "
        "how much slower (+) or faster (-) the baseline after the row ran than the one before, a gauge of the "
        "noise in that row's ratios; mismatches: tokens that differ from it (must be 0)",
        "- mean acceptance length: 1 + accepted / drafts (vLLM's definition, the correction or bonus token "
        "included); acceptance rate: accepted / drafted",
        "- speedup: VeriCache's tok/s over the whole run against full KV's; a static batch ends with a tail in "
        "which requests that finished early (more tokens per window) leave it part empty, while full-KV requests "
        "all finish together. Speedup at full batch: the steady state, tokens committed per second in the steps "
        "that carried every request of the batch (the rate continuous batching would keep up), against the same "
        "baseline; time at full batch: those steps' share of the decode time",
        "- verify step: the mean step carrying any verify window, in full-KV decode steps (with requests out of "
        "step it also carries other requests' drafts); verify-only step: the mean step carrying verify windows "
        "of all B requests and nothing else, at least one with drafts (under a fixed x, every request verifying x + 1 "
        "rows at once; the tail's steps left out); draft step likewise; "
        "fallback steps: verify steps in which every request decoded one token on the full cache (no drafts), "
        "and their cost in full-KV decode steps (1.00 would be plain full-KV decoding)",
        "- policy: fixed drafts x every window; under an adaptive policy x is the longest window, drafts per window "
        "is what it chose on average (windows of none included) and windows of none are tokens decoded on the full "
        "cache (goodput's fallback, or a confidence stop at the first draft)",
        "",
        "| context | batch | compressor | policy | x | drafts per window | windows of none | full-KV tok/s "
        "| VeriCache tok/s | speedup | speedup at full batch | time at full batch | mean acceptance length "
        "| acceptance rate | draft step (decode steps) | verify step (decode steps) | verify-only step (decode steps) "
        "| fallback steps | fallback step (decode steps) | full-KV step ms | full-KV drift | mismatches |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['context']} | {r['batch']} | {r['compressor']} | {r['draft_policy']} | {r['draft_length']} | "
                     f"{r['mean_window']:.2f} | {r['windows_of_none']} | "
                     f"{r['baseline_tok_s']:.1f} | {r['throughput_tok_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['full_batch_speedup']:.2f}x | {100 * r['full_batch_time_share']:.0f}% | "
                     f"{r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.3f} | "
                     f"{r['draft_cost_decode_steps']:.2f} | {r['verify_cost_decode_steps']:.2f} | "
                     f"{format(r['verify_only_cost_decode_steps'], '.2f') if r['verify_only_steps'] else '-'} | "
                     f"{r['fallback_steps']} | "
                     f"{format(r['fallback_cost_decode_steps'], '.2f') if r['fallback_steps'] else '-'} | "
                     f"{r['full_kv_step_ms']:.1f} | {100 * r['full_kv_drift']:+.0f}% | {r['mismatches']} |")
    write_atomically(args.out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
