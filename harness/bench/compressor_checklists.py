#!/usr/bin/env python3
"""The checklist for each of the seven compressors on the default model, the data of the paper's
Fig. 14 (quality against throughput) and Fig. 15 (across compressors), drawn by
harness/checklist/paper_figures.py:

  vericache checklist --compressor NAME [-c C | --params '{"bits": B, ...}'] --draft-lengths 5,10,25 \
      --ratios none --temperatures none --contexts none --out-dir OUT

Token droppers run at c = --ratio (0.25), quantizers at --bits (4); the sweeps are the default run's
business and are skipped here. Each run is a folder under --out-dir with its trace and figures; a run
whose verdict fails (exit status 1, e.g. step 3 on a loaded machine) is kept and said, any other
failure stops the script. KVzap's MLP weights and the calibrations of RotateKV and KVQuant are made
into .cache/ when missing (`vericache train-kvzap`, `vericache calibrate`).

Usage, from the repository root, after harness/setup.sh:
  python3 harness/bench/compressor_checklists.py [--compressors kvzip,snapkv,...] [--out-dir results/runs]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
DROPPERS = ["kvzip", "kvzap", "snapkv", "expected_attention"]
QUANTIZERS = ["kivi", "kvquant", "rotatekv"]


def made_once(path, command):
    """`path`, made by `command` first when it is missing."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"[compressor-checklists] making {path}: {' '.join(command)}", file=sys.stderr)
        subprocess.run(command, check=True)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compressors", default=",".join(DROPPERS + QUANTIZERS))
    ap.add_argument("--ratio", default="0.25", help="the token droppers' kept fraction c")
    ap.add_argument("--bits", type=int, default=4, help="the quantizers' bits")
    ap.add_argument("--draft-lengths", default="5,10,25")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results", "runs"))
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, ".cache"))
    args = ap.parse_args()
    names = args.compressors.split(",")
    unknown = [n for n in names if n not in DROPPERS + QUANTIZERS]
    if unknown:
        sys.exit(f"--compressors: unknown {', '.join(unknown)} (known: {', '.join(DROPPERS + QUANTIZERS)})")
    folders = []
    for name in names:
        if name in QUANTIZERS:
            params = {"bits": args.bits}
            if name != "kivi":
                params["calibration"] = made_once(os.path.join(args.cache_dir, f"{name}_smollm2.json"),
                                                  [VERICACHE, "calibrate", "--compressor", name, "--out",
                                                   os.path.join(args.cache_dir, f"{name}_smollm2.json")])
            setting = ["--params", json.dumps(params)]
        else:
            setting = ["-c", args.ratio]
            if name == "kvzap":
                weights = os.path.join(args.cache_dir, "kvzap.json")
                made_once(weights, [VERICACHE, "train-kvzap", "--out", weights])
                setting += ["--params", json.dumps({"weights": weights})]
        command = [VERICACHE, "checklist", "--compressor", name] + setting + [
            "--draft-lengths", args.draft_lengths, "-x", args.draft_lengths.split(",")[-1], "--ratios", "none",
            "--temperatures", "none", "--contexts", "none", "--out-dir", args.out_dir]
        print(f"[compressor-checklists] {' '.join(command)}", file=sys.stderr)
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode not in (0, 1):
            sys.exit(f"{' '.join(command)} exited {done.returncode}\n{done.stderr.strip()}")
        trace = next((line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("trace: ")), None)
        if trace is None:
            sys.exit(f"{' '.join(command)} wrote no trace\n{done.stdout}{done.stderr}")
        folders.append(os.path.dirname(trace))
        verdicts = [line for line in done.stdout.splitlines() if line[:2] in ("1.", "2.", "3.", "4.")]
        print(f"{name}: {os.path.dirname(trace)} ({time.monotonic() - start:.0f} s)")
        for line in verdicts:
            print("  " + line[:110] + ("..." if len(line) > 110 else ""))
    print("run folders: " + " ".join(folders))


if __name__ == "__main__":
    main()
