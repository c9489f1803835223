#!/usr/bin/env python3
"""Forward time per step against the H200's roofline, from `vericache bench --json` lines.

A step must read every weight once (weight_bytes) and each request's K/V (kv_bytes_per_step); at
the device's copy bandwidth that takes bytes / bandwidth. Lines from `--random-weights` also carry
flops_per_step, and their roofline is max(bytes / bandwidth, FLOPs / peak). The table gives
measured ms/step, the roofline and roofline / measured. For the Llama-3.1-8B shape, the issue's
CUDA-graph PyTorch anchor (measured on the same H200) is printed beside ours where the shape matches.

Usage: roofline.py --bandwidth-tbs 4.3 [--peak-tflops 790] bench.jsonl
"""
import argparse
import json

# (batch, context, window) -> ms per forward of the CUDA-graph PyTorch anchor, Llama-3.1-8B shape,
# bf16, H200 (issue 14).
ANCHOR_8B_MS = {
    (1, 8192, 1): 5.35,
    (8, 8192, 1): 7.18,
    (32, 2048, 1): 7.20,
    (32, 8192, 1): 12.85,
    (8, 32768, 1): 12.83,
    (32, 8192, 26): 52.2,
}


def anchor_ms(row):
    if not row["model"].startswith("random-weights:llama-3.1-8b"):
        return None
    return ANCHOR_8B_MS.get((row["batch"], row["context"], row.get("window", 1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("jsonl")
    ap.add_argument("--bandwidth-tbs", type=float, required=True, help="bytes per second / 1e12 (read+write copy rate)")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 FLOP/s / 1e12 (H200: ~790)")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.jsonl) if line.strip().startswith("{")]
    print(f"| model | context | batch | window | ms/step | bytes/step (MB) | GFLOP/step | roofline ms | "
          f"roofline / measured | anchor ms | anchor / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        total = r["weight_bytes"] + r["kv_bytes_per_step"]
        flops = r.get("flops_per_step", 0.0)
        roof_ms = 1000.0 * max(total / (args.bandwidth_tbs * 1e12), flops / (args.peak_tflops * 1e12))
        anchor = anchor_ms(r)
        anchor_cols = f"{anchor:.2f} | {anchor / r['ms_per_step']:.2f}x" if anchor else "- | -"
        print(f"| {r['model']} | {r['context']} | {r['batch']} | {r.get('window', 1)} | {r['ms_per_step']:.3f} | "
              f"{total / 1e6:.0f} | {flops / 1e9:.1f} | {roof_ms:.3f} | {roof_ms / r['ms_per_step']:.1%} | {anchor_cols} |")


if __name__ == "__main__":
    main()
