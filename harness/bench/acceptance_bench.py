#!/usr/bin/env python3
"""How many drafted tokens each compressor's cache gets accepted, on this model, and the two
engine choices the draft-verify issue asks to compare. Every run is `vericache run --check --json`,
so each number comes with a lossless check against full-KV decoding in the same process.

Tables (results/acceptance_cpu_smollm2.md, or --out):
  1. every bundled plugin at c = 0.25 (--ratio) and x in --draft-lengths, greedy, over the prompts
     (the first --prompts prompts alternately of datasets/long_docs and datasets/long_code, text the
     model has not memorized): mean acceptance length (1 + accepted / drafts, vLLM),
     acceptance rate, mismatches (must be 0);
  2. KV_comp keeping the drafted K/V vs the verified K/V of accepted tokens (greedy, x = 16);
  3. argmax vs sampled drafts at T = 0.7 (the output distribution is exact either way; only the
     acceptance differs).
Usage, from the repository root, after harness/setup.sh (KVzap weights are trained into .cache/
when missing, about 2 minutes):
  python3 harness/bench/acceptance_bench.py [--draft-lengths 8,16,25] [--prompts 2] [--max-tokens 64]
"""
import argparse
import json
import os
import subprocess
import sys

from bench_prompts import dataset_prompts
from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")


def run(args):
    # Acceptance at each x: every window drafts x (run's default policy would adapt it).
    cmd = [VERICACHE, "run", "--json", "--threads", "2", "--draft-policy", "fixed"] + args
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.exit(f"{' '.join(cmd)}\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ratio", default="0.25")
    ap.add_argument("--draft-lengths", default="8,16,25")
    ap.add_argument("--prompts", type=int, default=2, help="how many dataset prompts (long_docs, long_code in turn)")
    ap.add_argument("--max-tokens", default="64")
    ap.add_argument("--kvzap-weights", default=os.path.join(ROOT, ".cache", "kvzap.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "acceptance_cpu_smollm2.md"))
    args = ap.parse_args()
    check_destination(args.out)
    prov = provenance(ROOT)  # before the run: what is measured is the tree of now
    if not os.path.exists(args.kvzap_weights):
        os.makedirs(os.path.dirname(args.kvzap_weights), exist_ok=True)
        subprocess.run([VERICACHE, "train-kvzap", "--out", args.kvzap_weights], check=True)
    prompts = dataset_prompts(args.prompts)
    plugins = {"snapkv": "{}", "expected_attention": "{}", "kvzip": "{}",
               "kvzap": json.dumps({"weights": args.kvzap_weights})}

    def over_prompts(extra):
        """Totals of one configuration over every prompt."""
        drafts = accepted = drafted = mismatches = tokens = 0
        for _, path, chat in prompts:
            r = run(extra + ["-f", path, "-n", args.max_tokens] + ([] if chat else ["--no-chat-template"]))
            drafts += r["drafts"]
            accepted += r["accepted_tokens"]
            drafted += r["draft_tokens"]
            mismatches += r.get("mismatches", 0)
            tokens += r["generated_tokens"]
        return {"mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
                "acceptance_rate": accepted / drafted if drafted else 0.0, "mismatches": mismatches, "tokens": tokens}

    table1 = []
    for name, params in plugins.items():
        for x in args.draft_lengths.split(","):
            print(f"[acceptance] {name} x = {x}", file=sys.stderr)
            r = over_prompts(["--check", "--compressor", name, "--params", params, "-c", args.ratio, "-x", x])
            table1.append((name, x, r))
    table2 = []
    for name in ["snapkv", "kvzip"]:
        for mode in ["verified", "drafted"]:
            print(f"[acceptance] {name} draft-kv {mode}", file=sys.stderr)
            table2.append((name, mode, over_prompts(["--check", "--compressor", name, "-c", args.ratio, "-x", "16",
                                                      "--draft-kv", mode])))
    table3 = []
    for name in ["snapkv", "kvzip"]:
        for mode in ["sampled", "argmax"]:
            print(f"[acceptance] {name} T = 0.7 {mode} drafts", file=sys.stderr)
            table3.append((name, mode, over_prompts(["--compressor", name, "-c", args.ratio, "-x", "16", "-t", "0.7",
                                                      "--seed", "1", "--draft-sampling", mode])))
    names = ", ".join(n for n, _, _ in prompts)
    out = ["# Draft acceptance per compressor, SmolLM2-135M-Instruct on the CPU", "",
           command_line("python3 harness/bench/acceptance_bench.py " + " ".join(sys.argv[1:]), prov),
           f"- machine: {prov['cpu']}, 2 threads (acceptance does not depend on the machine: the forward is deterministic)",
           f"- prompts: {names}; {args.max_tokens} tokens each; c = {args.ratio}; every greedy run checked against "
           "full-KV decoding in the same process (mismatches must be 0)",
           "- mean acceptance length: 1 + accepted / drafts (vLLM's definition, correction or bonus included); "
           "acceptance rate: accepted / drafted", "",
           "## Every plugin, greedy", "",
           "| compressor | x | mean acceptance length | acceptance rate | tokens | mismatches |", "|---|---:|---:|---:|---:|---:|"]
    out += [f"| {n} | {x} | {r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.3f} | {r['tokens']} | {r['mismatches']} |"
            for n, x, r in table1]
    out += ["", "## Which K/V the accepted tokens keep in KV_comp (greedy, x = 16)", "",
            "| compressor | K/V kept | mean acceptance length | acceptance rate | mismatches |", "|---|---|---:|---:|---:|"]
    out += [f"| {n} | {m} | {r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.3f} | {r['mismatches']} |"
            for n, m, r in table2]
    out += ["", "## Argmax vs sampled drafts at T = 0.7 (x = 16, seed 1)", "",
            "| compressor | drafts | mean acceptance length | acceptance rate |", "|---|---|---:|---:|"]
    out += [f"| {n} | {m} | {r['mean_acceptance_length']:.2f} | {r['acceptance_rate']:.3f} |" for n, m, r in table3]
    write_atomically(args.out, "\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
