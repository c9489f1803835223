#!/usr/bin/env python3
"""KVQuant's knobs, one at a time, on the default model: mean per-step KL(p_full || p_kvquant) and
top-1 agreement along the full-KV greedy continuation of a --context-token cut of the tokenizer
corpus (`vericache bench-acceptance --json`, as results/quantizers_cpu_smollm2.md measures the
quantizers), for each variant of the plugin's parameters and of its calibration file:
  - Q-Norm on and off, the first tokens kept exact (0, 5, 64);
  - the outlier cap: the default calibration (1% of the channels per token) against the same file
    with `outlier_fraction` raised to 0.2 (the same key ranges, 39 outliers per token kept).
The calibration is made with `vericache calibrate --compressor kvquant` into --calibration when it is
missing.

Usage, from the repository root, after harness/setup.sh:
  python3 harness/bench/kvquant_ablation.py [--bits 4,8] [--context 2048] [--decode-tokens 64]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

from results_file import check_destination, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
QUESTION = "Summarize the key points of this text."


def kl_of(params, args):
    cmd = [VERICACHE, "bench-acceptance", "--json", "--threads", "2", "--compressors", "kvquant", "--params",
           "kvquant=" + json.dumps(params), "--contexts", args.context, "--decode-tokens", args.decode_tokens,
           "--draft-length", "25", "--question", QUESTION]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--context", default="2048")
    ap.add_argument("--decode-tokens", default="64")
    ap.add_argument("--calibration", default=os.path.join(ROOT, ".cache", "kvquant_smollm2.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "kvquant_ablation_cpu_smollm2.md"))
    args = ap.parse_args()
    check_destination(args.out)
    if not os.path.exists(args.calibration):
        os.makedirs(os.path.dirname(args.calibration), exist_ok=True)
        subprocess.run([VERICACHE, "calibrate", "--compressor", "kvquant", "--out", args.calibration], check=True)
    uncapped = args.calibration.replace(".json", "_cap39.json")
    with open(args.calibration) as f:
        calibration = json.load(f)
    calibration["outlier_fraction"] = 0.2
    with open(uncapped, "w") as f:
        json.dump(calibration, f)

    variants = [("default", {}, args.calibration), ("qnorm on", {"qnorm": True}, args.calibration),
                ("qnorm off", {"qnorm": False}, args.calibration),
                ("first_tokens 0", {"first_tokens": 0}, args.calibration),
                ("first_tokens 64", {"first_tokens": 64}, args.calibration),
                ("39 outliers per token (same key ranges)", {}, uncapped)]
    rows = []
    for bits in args.bits.split(","):
        for name, extra, path in variants:
            print(f"[kvquant-ablation] {bits} bits: {name}", file=sys.stderr)
            r = kl_of({"bits": int(bits), **extra, "calibration": path}, args)
            rows.append(f"| {bits} | {name} | {r['mean_kl']:.4f} | {r['top1_agreement']:.3f} | {r['mismatches']} |")
    os.remove(uncapped)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    out = ["# KVQuant's knobs on SmolLM2-135M-Instruct (CPU)", "",
           f"- command: `python3 harness/bench/kvquant_ablation.py {' '.join(sys.argv[1:])}` at commit `{commit}` ({when})",
           f"- KL: `vericache bench-acceptance` on a {args.context}-token cut of the tokenizer corpus with the question "
           f"'{QUESTION}', {args.decode_tokens} steps teacher-forced along the full-KV greedy continuation",
           "- default: the plugin's defaults (Q-Norm at 2 bits only, first 5 tokens exact) and the default "
           "calibration (1% outliers: 2 of 192 channels per token for keys and for values)",
           "- mismatches: tokens differing from full-KV decoding (must be 0)", "",
           "| bits | variant | mean KL (nats/step) | top-1 agreement | mismatches |", "|---:|---|---:|---:|---:|"]
    write_atomically(args.out, "\n".join(out + rows) + "\n")
    print("\n".join(out + rows))


if __name__ == "__main__":
    main()
