#!/usr/bin/env python3
"""A decode step at a long context on the float32 cache and on quantized caches, the attention part
timed apart: the quantizer issue's speed check (reading a fraction of the bytes must show).

Runs `vericache bench-attention --json` (see its --help): one prompt of --context tokens is
prefilled once; each of --batch requests decodes its own copy of that cache, float32 or packed by a
quantizer. A quantizer whose pages are in a standard layout (KIVI) is measured read in place by the
fused dequantize-attention kernel and through unpack(); the command fails if the two give different
tokens. "attention" is the unpack + attention kernels of all layers (ForwardTimes).

The prompt is cut from the repository's prompt sets joined (--text datasets, the default; --text corpus
cuts it from datasets/tokenizer_corpus/corpus.txt); attention's cost does not depend on the text.

Writes results/attention_8k_cpu_smollm2.md and .json (or --out). Usage, from the repository root,
after harness/setup.sh:
  python3 harness/bench/attention_bench.py [--context 8160] [--batch 8] [--steps 6] [--text datasets|corpus]
                                          [--quantizer 'kivi={"bits": 4}' ...]
"""
import argparse
import json
import os
import subprocess
import sys

from bench_prompts import bench_text
from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", default="8160")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--steps", default="6")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--text", choices=["datasets", "corpus"], default="datasets", help="where the prompt is cut from")
    ap.add_argument("--quantizer", action="append", help="NAME=JSON (repeatable; default KIVI at 4 and 2 bits)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "attention_8k_cpu_smollm2"))
    args = ap.parse_args()
    check_destination(args.out + ".md")
    prov = provenance(ROOT)  # before the run: what is measured is the tree of now
    quantizers = args.quantizer or ['kivi={"bits": 4}', 'kivi={"bits": 2}']
    cmd = [VERICACHE, "bench-attention", "--json", "--context", args.context, "--batch", args.batch, "--steps",
           args.steps, "--threads", args.threads, "--text-file", bench_text(args.text)]
    for q in quantizers:
        cmd += ["--quantizer", q]
    print(" ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-attention failed (exit {done.returncode})")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    out = [f"# A decode step at {args.context} tokens, batch {args.batch}: float32 against quantized caches (CPU)", "",
           command_line("python3 harness/bench/attention_bench.py " + " ".join(sys.argv[1:]), prov),
           f"- machine: {prov['cpu']}, {args.threads} threads, kernels {rows[0]['kernels'] if rows else '?'}; "
           f"model {os.path.basename(rows[0]['model']) if rows else '?'}",
           f"- each of the {args.batch} requests decodes its own copy of one prefilled {args.context}-token prompt "
           f"(cut from {'the prompt sets long_docs, long_code, code_tasks, function_calling joined' if args.text == 'datasets' else 'corpus.txt'}); "
           f"times are means over {int(args.steps) - 1} greedy steps after a warm-up step",
           "- attention: unpack() (when used) + the attention kernels of every layer; GB/s read: the resident KV "
           "bytes of all requests over the attention time",
           "- `in place`: the fused kernel reads the packed pages (KIVI's min-max-groups layout) and dequantizes in "
           "registers; `unpack()`: the plugin unpacks every packed page into float pages each layer, each step. "
           "Both give the same tokens (the command checks)", "",
           "| cache | resident KV / request (MiB) | of float32 | step ms | attention ms | attention GB/s read "
           "| attention speedup | step speedup |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['cache']} | {r['resident_kv_bytes_per_request'] / 1048576:.1f} | {r['resident_fraction']:.3f} | "
            f"{r['step_ms']:.1f} | {r['attention_ms']:.1f} | {r['attention_gb_s']:.1f} | "
            f"{r['attention_speedup']:.2f}x | {r['step_speedup']:.2f}x |" for r in rows]
    write_atomically(args.out + ".md", "\n".join(out) + "\n")
    write_atomically(args.out + ".json", json.dumps({"command": cmd, **prov, "rows": rows}, indent=1) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
