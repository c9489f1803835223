#!/usr/bin/env python3
"""Decode time per step against the memory roofline, from `vericache bench --json` lines.

A decode step must read every weight once (weight_bytes) and each request's K/V
(kv_bytes_per_step, the mean over the measured steps); at the device's copy bandwidth that takes
roofline_ms = (weight_bytes + kv_bytes_per_step) / bandwidth. The table gives measured ms/step, the
roofline and their ratio. Usage: roofline.py --bandwidth-tbs 4.3 bench.jsonl
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--bandwidth-tbs", type=float, required=True, help="bytes per second / 1e12 (read+write copy rate)")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.jsonl) if line.strip().startswith("{")]
    print(f"| context | batch | prefill tok/s | decode tok/s | ms/step | bytes/step (MB) | roofline ms @ {args.bandwidth_tbs} TB/s | roofline / measured |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        total = r["weight_bytes"] + r["kv_bytes_per_step"]
        roof_ms = 1000.0 * total / (args.bandwidth_tbs * 1e12)
        print(f"| {r['context']} | {r['batch']} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.0f} | {r['ms_per_step']:.3f} | "
              f"{total / 1e6:.0f} | {roof_ms:.3f} | {roof_ms / r['ms_per_step']:.1%} |")


if __name__ == "__main__":
    main()
