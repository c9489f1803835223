#!/usr/bin/env python3
"""What each quantizer's packed cache is worth on the default model, at each bit width:
  - resident KV bytes at the end of a run against the full-precision cache (`vericache run --json`:
    resident_kv_bytes / full_kv_bytes; packed slots plus the float residual);
  - mean acceptance length and acceptance rate as the engine's drafter at x = --draft-length, over
    the prompts of results/acceptance_cpu_smollm2.md's token-dropping table (document_2k and the
    first --long-prompts long prompts), every run checked against full-KV decoding (mismatches 0);
  - mean per-step KL(p_full || p_quantized) along the full-KV greedy continuation of a --context-token
    cut of the repository's prompt sets with --question, as results/acceptance_by_model_cpu.md measures
    the token droppers (`vericache bench-acceptance --json`).

RotateKV and KVQuant read a calibration file; one is made with `vericache calibrate --compressor NAME`
into --calibration-dir/NAME_smollm2.json when it is missing.

Usage, from the repository root, after harness/setup.sh:
  python3 harness/bench/quantizer_bench.py [--quantizers kivi,rotatekv,kvquant] [--bits 2,4] [--draft-length 25]
"""
import argparse
import json
import os
import subprocess
import sys

from bench_prompts import datasets_text, lossless_prompts
from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
DEFAULT_QUESTION = "Summarize the key points of this text."


def vericache(args):
    cmd = [VERICACHE] + args
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        sys.exit(f"{' '.join(cmd)}\n{done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quantizers", default="kivi,rotatekv,kvquant")
    ap.add_argument("--calibration-dir", default=os.path.join(ROOT, ".cache"))
    ap.add_argument("--bits", default="2,4")
    ap.add_argument("--draft-length", default="25")
    ap.add_argument("--long-prompts", type=int, default=1)
    ap.add_argument("--max-tokens", default="64")
    ap.add_argument("--context", default="2048")
    ap.add_argument("--question", default=DEFAULT_QUESTION)
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "quantizers_cpu_smollm2.md"))
    args = ap.parse_args()
    check_destination(args.out)
    prov = provenance(ROOT)  # before the run: the commit and tree the binaries were built from
    kl_text = datasets_text()
    cases = lossless_prompts(args.long_prompts)
    extra = {}
    for name in ("rotatekv", "kvquant"):
        if name not in args.quantizers.split(","):
            continue
        path = os.path.join(args.calibration_dir, f"{name}_smollm2.json")
        if not os.path.exists(path):
            os.makedirs(args.calibration_dir, exist_ok=True)
            subprocess.run([VERICACHE, "calibrate", "--compressor", name, "--out", path], check=True)
        extra[name] = {"calibration": path}
    rows = []
    for name in args.quantizers.split(","):
        for bits in args.bits.split(","):
            params = json.dumps({"bits": int(bits), **extra.get(name, {})})
            drafts = accepted = drafted = mismatches = tokens = resident = full = 0
            for prompt, path, chat in cases:
                print(f"[quantizers] {name} {bits}-bit: {prompt}", file=sys.stderr)
                r = vericache(["run", "--json", "--threads", "2", "--check", "--compressor", name, "--params", params,
                               "--draft-policy", "fixed", "-x", args.draft_length, "-f", path, "-n", args.max_tokens] +
                              ([] if chat else ["--no-chat-template"]))[0]
                drafts += r["drafts"]
                accepted += r["accepted_tokens"]
                drafted += r["draft_tokens"]
                mismatches += r["mismatches"]
                tokens += r["generated_tokens"]
                resident += r["resident_kv_bytes"]
                full += r["full_kv_bytes"]
            print(f"[quantizers] {name} {bits}-bit: KL at context {args.context}", file=sys.stderr)
            kl = vericache(["bench-acceptance", "--json", "--threads", "2", "--compressors", name, "--params",
                            f"{name}={params}", "--contexts", args.context, "--decode-tokens", args.max_tokens,
                            "--draft-length", args.draft_length, "--question", args.question,
                            "--text-file", kl_text])[0]
            rows.append({"quantizer": name, "bits": int(bits), "resident_fraction": resident / full,
                         "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
                         "acceptance_rate": accepted / drafted if drafted else 0.0, "tokens": tokens,
                         "mismatches": mismatches + kl["mismatches"], "mean_kl": kl["mean_kl"],
                         "top1_agreement": kl["top1_agreement"], "kl_kept_fraction": kl["kept_fraction"],
                         "kl_acceptance_length": kl["mean_acceptance_length"]})
    names = ", ".join(p for p, _, _ in cases)
    out = ["# Quantizers as drafters, SmolLM2-135M-Instruct on the CPU", "",
           command_line(f"python3 harness/bench/quantizer_bench.py {' '.join(sys.argv[1:])}".strip(), prov),
           f"- machine: {prov['cpu']}, 2 threads",
           f"- acceptance: `vericache run --check` over {names}, {args.max_tokens} tokens each, x = {args.draft_length}; "
           "resident: KV bytes held at the end (packed slots and the float residual) over the float32 cache's",
           f"- KL: `vericache bench-acceptance` on a {args.context}-token cut of the repository's prompt sets (long_docs, "
           f"long_code, code_tasks, function_calling joined; text the model has not memorized) with the question "
           f"'{args.question}', {args.max_tokens} steps teacher-forced along the full-KV greedy continuation (the "
           "token droppers' numbers on the tokenizer corpus: results/acceptance_by_model_cpu.md, SmolLM2 2048 answer)",
           "- mismatches: tokens differing from full-KV decoding in every run (must be 0)", "",
           "| quantizer | bits | resident / full bytes | mean acceptance length | acceptance rate | tokens "
           f"| mean KL (nats/step, {args.context}) | top-1 agreement | acceptance length ({args.context}) | mismatches |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['quantizer']} | {r['bits']} | {r['resident_fraction']:.3f} | {r['mean_acceptance_length']:.2f} | "
            f"{r['acceptance_rate']:.3f} | {r['tokens']} | {r['mean_kl']:.4f} | {r['top1_agreement']:.3f} | "
            f"{r['kl_acceptance_length']:.2f} | {r['mismatches']} |" for r in rows]
    write_atomically(args.out, "\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
