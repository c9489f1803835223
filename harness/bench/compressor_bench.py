#!/usr/bin/env python3
"""What each compressor costs and saves on the CPU, next to a compressor that does no work.

For each bundled compressor and each prompt length, `vericache compress --json` runs the prefill
(every layer reported to the compressor through update()) and the compressor at kept fraction c,
then compacts the cache. Per run it reports prefill seconds (including update() work), compress()
seconds, and full vs resident KV bytes. The peer in the same run is the StreamingLLM example (no
update() work, a trivial compress()): its prefill is the baseline the overhead is measured against.
Each cell is the median of --repeats runs (this VM's timings vary by 20-30% from run to run).
Prompts are the opening of the repository's prompt sets joined (bench_prompts.datasets_text()), cut
at about --lengths tokens; compressor cost does not depend on the text.

Writes results/compressors_cpu_smollm2.md (or --out). Usage, from the repository root, after
harness/setup.sh (KVzap needs weights: `build/vericache train-kvzap --out .cache/kvzap.json`):
  python3 harness/bench/compressor_bench.py [--lengths 700,2000] [--ratio 0.25] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_prompts import datasets_text
from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
BASELINE = os.path.join(ROOT, "build", "tests", "fixture_plugins", "vc_plugin_streaming_llm.so")


def run(compressor, params, ratio, prompt_file, threads):
    cmd = [VERICACHE, "compress", "--compressor", compressor, "--params", params, "-c", str(ratio),
           "--no-chat-template", "-f", prompt_file, "--threads", str(threads), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="700,2000", help="approximate prompt lengths in tokens")
    ap.add_argument("--ratio", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kvzap-weights", default=os.path.join(ROOT, ".cache", "kvzap.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "compressors_cpu_smollm2.md"))
    args = ap.parse_args()
    check_destination(args.out)
    prov = provenance(ROOT, ("vericache", "vc_bundled_plugins", "vc_plugin_streaming_llm"))  # before the run
    if not os.path.exists(args.kvzap_weights):
        sys.exit(f"{args.kvzap_weights}: missing; make it with build/vericache train-kvzap --out {args.kvzap_weights}")
    text = open(datasets_text(), encoding="utf-8").read()
    compressors = [("streaming_llm (baseline)", BASELINE, "{}"), ("snapkv", "snapkv", "{}"),
                   ("expected_attention", "expected_attention", "{}"), ("kvzip", "kvzip", "{}"),
                   ("kvzap", "kvzap", json.dumps({"weights": args.kvzap_weights}))]
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        prompt_file = os.path.join(ROOT, ".cache", f"compressor_bench_{length}.txt")
        os.makedirs(os.path.dirname(prompt_file), exist_ok=True)
        with open(prompt_file, "w", encoding="utf-8") as f:
            f.write(text[:length * 4])  # about 4 characters per token in English prose and code
        base_prefill = None
        for label, compressor, params in compressors:
            runs = [run(compressor, params, args.ratio, prompt_file, args.threads) for _ in range(args.repeats)]
            prefill = statistics.median(r["prefill_seconds"] for r in runs)
            compress = statistics.median(r["compress_seconds"] for r in runs)
            if base_prefill is None:
                base_prefill = prefill
            r = runs[0]
            rows.append((r["prompt_tokens"], label, prefill, prefill / base_prefill, compress, compress / base_prefill,
                         r["full_kv_bytes"] / 2**20, r["resident_kv_bytes"] / 2**20))
            print(f"{r['prompt_tokens']} {label}: prefill {prefill:.3f}s compress {compress:.3f}s", file=sys.stderr)
    text = "# Compressor cost and savings, CPU, SmolLM2-135M-Instruct (Q4_1)\n\n"
    text += command_line("python3 harness/bench/compressor_bench.py " + " ".join(sys.argv[1:]), prov) + "\n"
    text += (f"- machine: {prov['cpu']}, {args.threads} threads; median of {args.repeats} runs; prompts: the opening of "
             "the prompt sets long_docs, long_code, code_tasks, function_calling joined\n\n")
    text += ("Prefill includes the compressor's update() work; `x base` is relative to the baseline's prefill "
             "(StreamingLLM: no update() work) in the same run. Resident = KV bytes held after compaction.\n\n")
    text += "| tokens | compressor | prefill s | x base | compress s | x base prefill | full KV MiB | resident MiB |\n"
    text += "|---|---|---|---|---|---|---|---|\n"
    for n, label, p, pr, c, cr, full, res in rows:
        text += f"| {n} | {label} | {p:.3f} | {pr:.2f} | {c:.3f} | {cr:.2f} | {full:.1f} | {res:.1f} |\n"
    write_atomically(args.out, text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
