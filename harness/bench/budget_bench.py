#!/usr/bin/env python3
"""Decode speed at one fixed device KV budget on this CPU (the paper's Fig. 13, measured): full-KV
decoding at the largest batch whose whole caches fit the budget against VeriCache at the largest
batch its compressed caches allow, verifying in place and over EMULATED links (the copy into
transient pages paced to the bandwidth; the ring of copies counts against the budget).

Runs `vericache bench-budget --json` (see its --help): each request has its own prompt, the next
stretch of `context` tokens of the four built prompt sets (text the model has not memorized),
prefilled once and compressed once; every VeriCache run is checked token for token against full-KV
decoding ("mismatches"). Writes results/budget_cpu_smollm2.md and .json (or --out) with the commit,
whether the tree was clean, the date and the CPU, and per row where VeriCache's time went (draft
forwards, verify forwards, waiting for copies), which says what bounds it.

Usage, from the repository root, after harness/setup.sh, on otherwise idle cores:
  python3 harness/bench/budget_bench.py                        (8K, KVzip c = 0.25, two full-KV requests)
  python3 harness/bench/budget_bench.py --context 2048 --links in-place
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
    ap.add_argument("--context", default="8000")
    ap.add_argument("--compressor", default="kvzip")
    ap.add_argument("--ratio", default="0.25")
    ap.add_argument("--budget-full-requests", default="2")
    ap.add_argument("--links", default="in-place,20,2")
    ap.add_argument("--draft-policy", default="goodput")
    ap.add_argument("--draft-length", default="16")
    ap.add_argument("--decode-tokens", default="64")
    ap.add_argument("--max-batch", default="16")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--params", default='kvzip={"chunk_size": 128}',
                    help="NAME=JSON compressor parameters (KVzip's reconstruction chunk must fit after an 8K prompt)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "budget_cpu_smollm2"))
    args = ap.parse_args()
    check_destination(args.out + ".md")
    prov = provenance(ROOT)  # before the run: what is measured is the tree of now
    cmd = [VERICACHE, "bench-budget", "--json", "--context", args.context, "--compressor", args.compressor,
           "-c", args.ratio, "--budget-full-requests", args.budget_full_requests, "--links", args.links,
           "--draft-policy", args.draft_policy, "--draft-length", args.draft_length,
           "--decode-tokens", args.decode_tokens, "--max-batch", args.max_batch, "--threads", args.threads]
    if args.params:
        cmd += ["--params", args.params]
    print("[budget_bench] " + " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-budget failed (exit {done.returncode})")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if not rows:
        sys.exit("bench-budget printed no row")
    write_atomically(args.out + ".json", json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    write_atomically(args.out + ".md", markdown(rows, prov, "python3 harness/bench/budget_bench.py " + " ".join(sys.argv[1:])))
    print(f"[budget_bench] wrote {args.out}.md and .json", file=sys.stderr)


def markdown(rows, prov, invocation):
    r0 = rows[0]
    out = ["# Decode speed at one device KV budget on the CPU, SmolLM2-135M-Instruct", "",
           command_line(invocation.strip(), prov),
           f"- machine: {prov['cpu']}, {r0['threads']} threads (the emulated link's copy thread shares them)",
           f"- budget: {r0['budget_bytes'] / 1e9:.3f} GB of device KV ({r0['budget_pages']} pages), the whole caches of "
           f"{r0['budget_pages'] // r0['full_kv_pages_per_request']} full-KV requests of {r0['context']} prompt tokens and "
           f"{r0['decode_tokens']} generated",
           f"- VeriCache: {r0['compressor']} at c = {r0['ratio_c']}, draft policy {r0['draft_policy']} (x at most "
           f"{r0['draft_length']}); each request's compressed cache is counted at its worst case (the compressor's "
           "declared bound, the tokens to come and one window, page-rounded per layer); over a link the ring of "
           "transient pages for KV_full copies comes out of the budget first",
           "- requests: each its own stretch of the built prompt sets (long_docs, long_code, code_tasks, "
           "function_calling), EOS ignored; mismatches: tokens that differ from full-KV decoding (must be 0)",
           "- links are EMULATED (a paced copy); 'achieved' is what the copy thread really moved per busy second "
           "(a link asked faster than this machine copies runs at the copy speed)",
           "- where VeriCache's decode time went: draft forwards, verify forwards (windows of none included), "
           "waiting (no forward could run: every request's verify waited for its copy)",
           "- ratio: over the whole run; VeriCache's static batch ends with a tail in which requests that finished "
           "early leave it part empty (full-KV requests all finish together); ratio at full batch (in place only): "
           "tokens committed per second in the steps that carried every request, the rate continuous batching would "
           "keep up, and time at full batch their share of the run (over a link a request waiting for its copy sits "
           "steps out, so no steady state is told apart there)", "",
           "| verification | full-KV batch | full-KV tok/s | VeriCache batch | VeriCache tok/s | ratio | ratio at full "
           "batch | time at full batch | link GB/s achieved | mean acceptance length | drafts per window | windows of "
           "none | draft | verify | waiting | mismatches |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        total = max(r["seconds"], 1e-9)
        link = f"{r['link_gb_s_achieved']:.2f}" if r["link_gb_s"] > 0 else "-"
        capped = " (capped)" if r["capped"] else ""
        steady = (f"{r['full_batch_ratio']:.2f}x | {100 * r['full_batch_time_share']:.0f}%"
                  if r.get("full_batch_tok_s", 0) > 0 else "- | -")
        out.append(f"| {r['verification']} | {r['full_kv_batch']} | {r['full_kv_tok_s']:.1f} | {r['vericache_batch']}{capped} | "
                   f"{r['vericache_tok_s']:.1f} | {r['ratio']:.2f}x | {steady} | {link} | {r['mean_acceptance_length']:.2f} | "
                   f"{r['mean_window']:.2f} | {r['windows_of_none']} | {100 * r['draft_seconds'] / total:.0f}% | "
                   f"{100 * r['verify_seconds'] / total:.0f}% | {100 * r['waiting_seconds'] / total:.0f}% | "
                   f"{r['mismatches']} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
