#!/usr/bin/env python3
"""The reload-policy ablation on this machine: lockstep vs staggered vs no-overlap reloads of KV_full,
measured with the engine (verification from copies over an EMULATED link, the transfer engine paced to
the given bandwidth) and predicted by the simulator on a CPU profile calibrated in the same run, for
each configuration below; from `vericache bench-reload --json` (see its --help). Every run is checked
token for token against full-KV decoding (mismatches must be 0).

Request i's prompt is the i-th stretch of `--context` tokens of the built prompt sets long_docs,
long_code, code_tasks and function_calling joined (text the model has not memorized; `--text corpus`
takes datasets/tokenizer_corpus/corpus.txt instead, whose licence texts the model reproduces).

Writes results/reload_ablation_cpu.md (the table, with the commands, the commit and the CPU) and
results/reload_ablation_cpu.json (every row as bench-reload printed it).

Usage, from the repository root, after harness/setup.sh, on otherwise idle cores:
  python3 harness/bench/reload_ablation.py
  python3 harness/bench/reload_ablation.py --configs "--link-gb-s 2 -b 4" --decode-tokens 32   (a quick look)
(one bench-reload per configuration: its prompts prefilled once, calibrated before and after every
policy over every link it lists)
  python3 harness/bench/reload_ablation.py --table-only    (rewrite the .md from the .json)
"""
import argparse
import json
import os
import subprocess
import sys

from bench_prompts import bench_text
from results_file import check_destination, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
DEFAULT_CONFIGS = ["--link-gb-s 2,20 -b 4", "--link-gb-s 2 -b 8"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", action="append", help="bench-reload options of one configuration (repeatable)")
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--draft-length", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="threads for the forwards (the other core copies)")
    ap.add_argument("--text", choices=("datasets", "corpus"), default="datasets",
                    help="what the prompts are cut from: the built prompt sets (default) or corpus.txt")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "reload_ablation_cpu.md"))
    ap.add_argument("--table-only", action="store_true", help="rewrite the .md from the .json beside it")
    args = ap.parse_args()
    configs = args.configs or DEFAULT_CONFIGS
    json_out = os.path.splitext(args.out)[0] + ".json"
    check_destination(args.out)
    check_destination(json_out)
    prov = None if args.table_only else provenance(ROOT)  # before the run: what is measured is the tree of now

    rows, commands = [], []
    if args.table_only:
        with open(json_out, encoding="utf-8") as f:
            stored = json.load(f)
        rows, prov = stored["rows"], stored.get("provenance") or {
            "commit": stored["commit"], "dirty": bool(stored.get("dirty")), "date": "date not recorded", "cpu": "not recorded"}
        args.text = stored.get("text", "corpus")
        commands = stored.get("commands") or list(dict.fromkeys(r["command"] for r in rows))
        configs = []
        args.configs = stored.get("configs")
    for config in configs:
        cmd = [VERICACHE, "bench-reload", "--context", str(args.context), "-x", str(args.draft_length),
               "--decode-tokens", str(args.decode_tokens), "--threads", str(args.threads),
               "--text-file", bench_text(args.text)] + config.split() + ["--json"]
        shown = "build/vericache " + " ".join(cmd[1:]).replace(ROOT + "/", "")
        print(f"[reload_ablation] {shown}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"bench-reload failed (exit {done.returncode}): {shown}")
        commands.append(shown)
        for line in done.stdout.splitlines():
            row = json.loads(line)
            row["command"] = shown
            rows.append(row)

    lines = ["# Reload policies on this CPU: measured next to the simulator", "",
             f"Commit `{prov['commit']}` ({'with uncommitted changes' if prov['dirty'] else 'clean tree'}, "
             f"{prov['date']}), CPU: {prov['cpu']}; `python3 harness/bench/reload_ablation.py"
             f"{'' if args.text == 'datasets' else ' --text ' + args.text}"
             f"{''.join(' --configs ' + repr(c) for c in args.configs or [])}`, which ran:", ""]
    lines += [f"- `{c}`" for c in commands]
    lines += ["",
              f"SmolLM2-135M (Q4_1); B requests, request i's prompt tokens [i x {args.context}, "
              f"(i + 1) x {args.context}) of "
              + ("the built prompt sets long_docs, long_code, code_tasks and function_calling joined (text the model "
                 "has not memorized)" if args.text == "datasets" else
                 "datasets/tokenizer_corpus/corpus.txt (licence texts the model has memorized: acceptance is inflated)")
              + f", each prefilled once and compressed once (SnapKV, c = 0.1); each request "
              f"decodes {args.decode_tokens} greedy tokens (EOS ignored), x = "
              f"{args.draft_length}, W = 48, {args.threads} thread(s) for the forwards and the other core for the "
              "copy thread. Each verify reads KV_full from a copy in transient pages that crossed an **emulated "
              "link** (the transfer engine's worker copies page by page and sleeps so the bytes pass at the given "
              "bandwidth; a CPU has no PCIe between host and device memory; the pools are touched before the run, "
              "as device memory is resident). Device memory for those copies: B full caches (the memory ring's "
              "capacity too). A link asked faster than this machine copies runs at the copy speed (the second table's "
              "'run' column), and the simulator is told so. Measured = the engine; simulated = `vericache simulate`'s simulator on the CPU "
              "profile and acceptance the same run calibrated before and after its policy runs, pooled (full-KV decoding and fixed windows verifying "
              "in place: forward = requests x per-request cost + further verify rows x per-row cost + bytes / "
              "bandwidth, fitted by non-negative least squares in relative error over every calibration forward; "
              "the same windows again beside a copy that never rests give how much slower a forward runs while "
              "the other core copies, which the simulator applies to the part of each forward a copy overlaps; "
              "request i's drafts accepted with "
              "probability alpha_i until the first rejection, alpha_i matching request i's mean accepted drafts in the "
              "calibration; the drafts per verify as the engine's: at most W - 2 and one fewer than the tokens left), "
              "the mean of 100 acceptance seeds. Error = simulated / "
              "measured - 1.",
              "",
              "| link GB/s | B | policy | measured tok/s | simulated tok/s | error | stall s (meas. / sim.) | "
              "link busy (meas. / sim.) | peak transient GB (meas. / sim.) | tokens per verify (meas. / sim.) | "
              "drafts per verify (meas. / sim.) | mismatches |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        link = r["link"].replace("emulated link at ", "").replace(" GB/s", "")
        lines.append(
            f"| {link} | {r['batch']} | {r['policy']} | {r['measured_tok_s']:.1f} | {r['simulated_tok_s']:.1f} | "
            f"{100 * r['error']:+.1f}% | {r['measured_stall_s']:.2f} / {r['simulated_stall_s']:.2f} | "
            f"{100 * r['measured_link_busy']:.0f}% / {100 * r['simulated_link_busy']:.0f}% | "
            f"{r['measured_peak_transient_bytes'] / 1e9:.2f} / {r['simulated_peak_streamed_bytes'] / 1e9:.2f} | "
            f"{r['measured_tokens_per_verify']:.2f} / {r['simulated_tokens_per_verify']:.2f} | "
            f"{r['measured_drafts_per_verify']:.1f} / {r['simulated_drafts_per_verify']:.1f} | {r['mismatches']} |")
    lines += ["", "Per configuration, the same run's peers and calibration:", "",
              "| link GB/s (asked / run) | B | full-KV decoding tok/s | fixed windows, verify in place, tok/s | CPU bandwidth GB/s | "
              "ms per request | ms per further verify row | copy GB/s | forwards slower beside a copy | alpha per request |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    seen = set()
    for r in rows:
        if (r["command"], r["link"]) in seen:
            continue
        seen.add((r["command"], r["link"]))
        link = r["link"].replace("emulated link at ", "").replace(" GB/s", "")
        lines.append(f"| {link} / {r['link_bandwidth_gb_s']:.2f} | {r['batch']} | {r['full_kv_tok_s']:.1f} | {r['fixed_window_tok_s']:.1f} | "
                     f"{r['cpu_bandwidth_gb_s']:.1f} | {r['cpu_request_ms']:.2f} | {r['cpu_verify_row_ms']:.2f} | "
                     f"{r['copy_bandwidth_gb_s']:.1f} | {100 * r['copy_slowdown']:.0f}% | {' '.join(f'{a:.3f}' for a in r['request_alphas'])} |")
    if not args.table_only:
        write_atomically(json_out, json.dumps({"commit": prov["commit"], "dirty": prov["dirty"], "provenance": prov,
                                               "text": args.text, "commands": commands, "configs": args.configs,
                                               "rows": rows}, indent=1) + "\n")
    write_atomically(args.out, "\n".join(lines) + "\n")
    print(f"[reload_ablation] wrote {args.out} and {json_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
