#!/usr/bin/env python3
"""The paper's figures that one checklist run does not draw, from committed measurements and the
simulator, each a PNG with its data as a CSV of the same name, and summary.md with the numbers:

  fig6_lockstep_vs_staggered  Fig. 6: the paper's example (Mistral-24B shape on the RTX PRO 6000
                              profile, B = 10, KV_full 4 GB, c = 0.25, x = 30, PCIe 64 GB/s) simulated
                              under each reload policy with the acceptance the engine measured
                              (--acceptance-trace): device memory and tokens over time; beside it
                              the engine measured on this CPU over an emulated link
                              (--reload-ablation, written by harness/bench/reload_ablation.py)
  fig13_kv_budget             Fig. 13 (left): speedup over full-KV decoding as the KV budget falls,
                              simulated at paper scale (`vericache sweep`): VeriCache at its best
                              batch and x against full KV at its largest fitting batch
  fig13_rho                   Fig. 13 (right): the same against rho = BW_hbm / BW_inter
  fig14_frontier              Fig. 14: quality against throughput, measured on this machine, one
                              point per checklist trace (--traces): decoding on the compressed
                              cache alone (its cumulative KL per request) and VeriCache (its KL)
  fig15_compressors           Fig. 15: per compressor, VeriCache's and the compressed cache's decode
                              speed over full KV's and gamma at the run's x

Fig. 13 runs twice: with our measured acceptance and with the paper's (gamma = 0.85 at x = 25, each
draft accepted with the alpha that gives it), since a 135M model drafts far worse than a 24B one.

    .venv/bin/python harness/checklist/paper_figures.py --acceptance-trace RUN/trace.h5 \\
        --traces RUN1/trace.h5 RUN2/trace.h5 ... --out results/paper_figures

Exit status 0 and one line per figure; 1 and the problem otherwise.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from figures import save  # noqa: E402
from trace_format import attributes, format_problem, group, open_trace  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICIES = ["staggered", "lockstep", "no-overlap"]
PAPER_GAMMA, PAPER_X = 0.85, 25
# The paper's example (Fig. 6): M about 50 GB (weights plus activations), KV_full 4 GB, B = 10, x = 30.
FIG6 = ["--weights-gb", "50", "--kv-full-gb", "4", "-c", "0.25", "-x", "30", "-b", "10", "--link-gb-s", "64",
        "--requests", "10", "--output-tokens", "200"]
FIG6_WINDOW_S = 5
# Fig. 13: the profiles' Mistral-24B shape on the RTX PRO 6000 at 50K context, c = 0.2.
FIG13 = ["--ratios", "0.2", "--draft-lengths", "5,10,25", "--batches", "1,2,3,4,6,8,12,16,24,32,48,64",
         "--policies", "staggered", "--requests", "64", "--output-tokens", "256"]
BUDGETS = "0.2,0.3,0.4,0.5,0.6,0.74,1"
RHOS = "10,20,30,40,50,60"


def run(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}\n{done.stderr.strip()}")
    return done.stdout


def alpha_for_gamma(gamma, x):
    """The per-draft acceptance alpha whose gamma(x) = alpha (1 - alpha^x) / ((1 - alpha) x) is `gamma`."""
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * (1 - mid ** x) / ((1 - mid) * x) < gamma:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def columns(path):
    import h5py
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in f}


def fig6(args, tmp, out, summary):
    timelines = {}
    for policy in POLICIES:
        path = os.path.join(tmp, f"fig6_{policy}.h5")
        result = json.loads(run([args.vericache, "simulate", "--json", "--policy", policy, "--acceptance-trace",
                                 args.acceptance_trace, "--iterations-out", path] + FIG6))
        timelines[policy] = (columns(path), result)
    with open(args.reload_ablation) as f:
        ablation = json.load(f)
    fig, (memory_ax, tokens_ax, cpu_ax) = plt.subplots(1, 3, figsize=(16, 4.2))
    rows = []
    for policy in POLICIES:
        it, result = timelines[policy]
        end = it["start_s"] + it["seconds"]
        memory_ax.step(end, it["memory_gb"], where="pre", label=policy, linewidth=2 if policy == "staggered" else 1,
                       zorder=3 if policy == "staggered" else 2)
        tokens_ax.plot(end, it["tokens"].cumsum(), label=f"{policy}: {result['throughput_tok_s']:.0f} tok/s")
        rows += [(policy, s, d, m, int(v), int(t)) for s, d, m, v, t in
                 zip(it["start_s"], it["seconds"], it["memory_gb"], it["verifies"], it["tokens"])]
        summary.append(f"- Fig. 6, simulated ({policy}): {result['throughput_tok_s']:.1f} tok/s, device memory peak "
                       f"{result['peak_memory_bytes'] / 1e9:.1f} GB, stalled {result['stall_seconds']:.2f} s, "
                       f"{result['mean_drafts_per_verify']:.1f} drafts and {result['mean_acceptance_length']:.2f} "
                       f"tokens per verify")
    memory_ax.axhline(96, color="0.3", linestyle=":", label="device memory (96 GB)")
    memory_ax.set_xlim(0, FIG6_WINDOW_S)
    memory_ax.set_xlabel(f"simulated time (s), the first {FIG6_WINDOW_S} s")
    memory_ax.set_ylabel("device memory in use (GB)")
    memory_ax.set_title("Paper's example, simulated: device memory")
    memory_ax.legend(fontsize="small")
    tokens_ax.set_xlabel("simulated time (s)")
    tokens_ax.set_ylabel("tokens generated (10 requests)")
    tokens_ax.set_title("Paper's example, simulated: tokens")
    tokens_ax.legend(fontsize="small")
    cases = sorted({(r["link_bandwidth_gb_s"], r["batch"]) for r in ablation["rows"]})
    width = 0.8 / len(POLICIES)
    cpu_rows = []
    for k, policy in enumerate(POLICIES):
        measured, simulated = [], []
        for link, batch in cases:
            row = next(r for r in ablation["rows"] if (r["link_bandwidth_gb_s"], r["batch"]) == (link, batch)
                       and r["policy"] == policy)
            measured.append(row["measured_tok_s"])
            simulated.append(row["simulated_tok_s"])
            cpu_rows.append((link, batch, policy, row["measured_tok_s"], row["simulated_tok_s"],
                             row["measured_stall_s"], row["measured_peak_transient_bytes"] / 1e9))
        xs = [i + (k - 1) * width for i in range(len(cases))]
        cpu_ax.bar(xs, measured, width, label=f"{policy} (measured)", color=f"C{k}")
        cpu_ax.plot(xs, simulated, "k_", markersize=14, label="simulated" if k == 0 else None)
    cpu_ax.set_xticks(range(len(cases)), [f"{link:.3g} GB/s\nB = {b}" for link, b in cases])
    cpu_ax.set_ylabel("decode tokens/s (this CPU)")
    cpu_ax.set_title(f"Measured on this CPU, emulated link (commit {ablation['commit']})")
    cpu_ax.legend(fontsize="small")
    save(fig, out, "fig6_lockstep_vs_staggered", ["policy", "start_s", "seconds", "memory_gb", "verifies", "tokens"],
         rows)
    with open(os.path.join(out, "fig6_cpu_measured.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["link_gb_s", "batch", "policy", "measured_tok_s", "simulated_tok_s", "measured_stall_s",
                    "measured_peak_transient_gb"])
        w.writerows(cpu_rows)
    for link, batch in cases:
        by = {r[2]: r[3] for r in cpu_rows if (r[0], r[1]) == (link, batch)}
        summary.append(f"- Fig. 6, measured on this CPU ({link:.3g} GB/s emulated link, B = {batch}): staggered "
                       f"{by['staggered']:.1f} tok/s, lockstep {by['lockstep']:.1f} "
                       f"({by['staggered'] / by['lockstep']:.2f}x), no-overlap {by['no-overlap']:.1f}")


def best_speedups(table, key):
    """Per value of `key`: VeriCache's best simulated tok/s (over batch and x, runs that fit) over
    full-KV decoding's at its largest fitting batch, with the configuration that gave it."""
    out = {}
    for i in range(len(table["tok_s"])):
        if table["ok"][i] != 1 or table["fits_memory"][i] != 1:
            continue
        v = float(table[key][i])
        if v not in out or table["tok_s"][i] > out[v][0]:
            out[v] = (float(table["tok_s"][i]), float(table["full_kv_fit_tok_s"][i]), int(table["batch"][i]),
                      int(table["draft_length"][i]), int(table["full_kv_fit_batch"][i]))
    return out


def fig13(args, tmp, out, summary):
    alpha = alpha_for_gamma(PAPER_GAMMA, PAPER_X)
    acceptances = [("our acceptance (" + args.acceptance_label + ")", ["--acceptance-trace", args.acceptance_trace]),
                   (f"paper's acceptance (gamma {PAPER_GAMMA} at x = {PAPER_X})", ["--alpha", f"{alpha:.6f}"])]
    for name, key, grid, xlabel, paper in (
            ("fig13_kv_budget", "kv_fraction", ["--kv-fractions", BUDGETS],
             "KV budget: share of the memory the weights leave", "1.61x at 0.74 of HBM, 2.71x at 0.2"),
            ("fig13_rho", "rho", ["--rhos", RHOS, "--kv-fractions", "1"], "rho = BW_hbm / BW_inter",
             "1.92x at rho 60 (H100 NVL), 3.01x at 10 (GH200)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        rows = []
        for k, (label, acceptance) in enumerate(acceptances):
            path = os.path.join(tmp, f"{name}_{k}.h5")
            run([args.vericache, "sweep", "-o", path] + FIG13 + grid + acceptance)
            best = best_speedups(columns(path), key)
            xs = sorted(best)
            ax.plot(xs, [best[v][0] / best[v][1] for v in xs], marker="o", label=label)
            rows += [(label, v, best[v][0], best[v][1], best[v][0] / best[v][1], best[v][2], best[v][3], best[v][4])
                     for v in xs]
            ends = f"{best[xs[0]][0] / best[xs[0]][1]:.2f}x at {xs[0]:g}, {best[xs[-1]][0] / best[xs[-1]][1]:.2f}x " \
                   f"at {xs[-1]:g}"
            missing = [v for v in map(float, grid[1].split(",")) if v not in best]
            unfit = f"; VeriCache fits no configuration at {', '.join(f'{v:g}' for v in missing)}" if missing else ""
            summary.append(f"- Fig. 13 ({key}), {label}: {ends}{unfit} (paper: {paper})")
        ax.axhline(1, color="0.5", linestyle=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("speedup over full-KV decoding")
        ax.set_title("Simulated: Mistral-24B shape, RTX PRO 6000, 50K context, c = 0.2\n"
                     "VeriCache at its best batch and x; full KV at its largest fitting batch")
        ax.legend(fontsize="small")
        save(fig, out, name, ["acceptance", key, "vericache_tok_s", "full_kv_tok_s", "speedup", "vericache_batch",
                              "vericache_x", "full_kv_batch"], rows)


def trace_points(paths):
    points = []
    for path in paths:
        with open_trace(path) as f:
            attrs = attributes(f)
            problem = format_problem(attrs)
            if problem:
                sys.exit(f"{path}: {problem}")
            config = json.loads(attrs["config"])
            d, kl, e2e = group(f, "decode_speed"), group(f, "kl_growth"), group(f, "end_to_end_kl")
            summary = group(f, "acceptance_summary")
            x = config["draft_length"]
            row = list(summary["x"]).index(x)
            last = kl["step"] == config["kl_steps"]
            params = json.loads(config["params"])
            if "bits" in params:
                setting = f"{params['bits']}-bit"
            else:
                setting = "default bits" if config["ratio"] == 1 else f"c = {config['ratio']:g}"
            points.append({
                "compressor": attrs["compressor"], "setting": setting, "x": x,
                "full_tok_s": d["tok_s"][0], "lossy_tok_s": d["tok_s"][1], "vericache_tok_s": d["tok_s"][2],
                "lossy_mismatches": int(d["mismatches"][1]), "tokens": int(d["tokens"][0] + d["requests"][0]),
                "kv_fraction": d["kv_bytes"][2] / d["kv_bytes"][0],
                "lossy_kl_per_request": float(kl["cumulative_kl"][last].mean()), "kl_steps": config["kl_steps"],
                "lossy_kl_per_step": float(kl["kl"].mean()),
                "vericache_kl_per_request": float(sum(e2e["kl"]) / config["prompts"]),
                "gamma": float(summary["gamma"][row]), "mean_accepted": float(summary["mean_accepted"][row]),
                "run": os.path.basename(os.path.dirname(os.path.abspath(path)))})
    return points


def fig14_15(args, out, summary):
    points = trace_points(args.traces)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, p in enumerate(points):
        name = f"{p['compressor']} {p['setting']}"
        ax.scatter(p["lossy_tok_s"] / p["full_tok_s"], p["lossy_kl_per_request"], marker="x", color=f"C{k}")
        ax.scatter(p["vericache_tok_s"] / p["full_tok_s"], p["vericache_kl_per_request"], marker="o", color=f"C{k}",
                   label=name)
        ax.annotate("", (p["vericache_tok_s"] / p["full_tok_s"], max(p["vericache_kl_per_request"], 1e-3)),
                    (p["lossy_tok_s"] / p["full_tok_s"], p["lossy_kl_per_request"]),
                    arrowprops={"arrowstyle": "->", "color": f"C{k}", "alpha": 0.4})
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(bottom=0)
    ax.axhline(0.01, color="0.5", linestyle=":", label="0.01 nats (the paper's 'identical')")
    ax.set_xlabel("decode tokens/s over full-KV decoding (this machine)")
    ax.set_ylabel("KL per request (nats)")
    ax.set_title(f"Quality against throughput: x compressed cache alone, o VeriCache\n"
                 f"(lossy KL: cumulative over {points[0]['kl_steps']} steps; VeriCache's: over its output)")
    ax.legend(fontsize="small")
    header = list(points[0].keys())
    save(fig, out, "fig14_frontier", header, [[p[h] for h in header] for p in points])

    fig, (speed_ax, gamma_ax) = plt.subplots(1, 2, figsize=(16, 4.5))
    names = [f"{p['compressor'].replace('_', chr(10))}\n{p['setting']}" for p in points]
    xs = range(len(points))
    speed_ax.bar([i - 0.2 for i in xs], [p["vericache_tok_s"] / p["full_tok_s"] for p in points], 0.4,
                 label="VeriCache (lossless)")
    speed_ax.bar([i + 0.2 for i in xs], [p["lossy_tok_s"] / p["full_tok_s"] for p in points], 0.4, color="C3",
                 label="compressed cache alone (lossy)")
    speed_ax.axhline(1, color="0.5", linestyle=":")
    speed_ax.set_xticks(list(xs), names, fontsize="small")
    speed_ax.set_ylabel("decode tokens/s over full-KV decoding")
    speed_ax.set_title("Decode speed on this machine")
    speed_ax.legend(fontsize="small")
    gamma_ax.bar(list(xs), [p["gamma"] for p in points], color="C0")
    for i, p in enumerate(points):
        gamma_ax.annotate(f"KL {p['lossy_kl_per_step']:.3f}/step\n{p['lossy_mismatches']} of {p['tokens']} wrong",
                          (i, p["gamma"]), ha="center", va="bottom", fontsize=6.5)
    gamma_ax.set_xticks(list(xs), names, fontsize="small")
    gamma_ax.set_ylim(0, 1.15)
    gamma_ax.set_ylabel(f"gamma at x = {points[0]['x']}")
    gamma_ax.set_title("Acceptance; above: the compressed cache's KL and wrong greedy tokens")
    save(fig, out, "fig15_compressors", header, [[p[h] for h in header] for p in points])
    for p in points:
        summary.append(f"- Fig. 14/15, {p['compressor']} {p['setting']} ({p['run']}): VeriCache "
                       f"{p['vericache_tok_s'] / p['full_tok_s']:.2f}x full KV at KL {p['vericache_kl_per_request']:.3g} "
                       f"per request, gamma {p['gamma']:.3f} at x = {p['x']}; the compressed cache alone "
                       f"{p['lossy_tok_s'] / p['full_tok_s']:.2f}x at KL {p['lossy_kl_per_request']:.2f} per request "
                       f"({p['lossy_kl_per_step']:.4f}/step), {p['lossy_mismatches']} of {p['tokens']} greedy tokens "
                       f"wrong; resident KV {p['kv_fraction']:.3f} of full")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vericache", default=os.path.join(ROOT, "build", "vericache"))
    ap.add_argument("--acceptance-trace", required=True, help="checklist trace whose verify windows give acceptance")
    ap.add_argument("--acceptance-label", default="SmolLM2-135M, KVzip c = 0.25")
    ap.add_argument("--reload-ablation", default=os.path.join(ROOT, "results", "reload_ablation_cpu.json"))
    ap.add_argument("--traces", nargs="+", required=True, help="checklist traces for Fig. 14 and 15")
    ap.add_argument("--out", required=True, help="folder for the figures, their CSVs and summary.md")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        fig6(args, tmp, args.out, summary)
        fig13(args, tmp, args.out, summary)
    fig14_15(args, args.out, summary)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("# The paper's figures: numbers\n\nDrawn by `" + " ".join(
            [os.path.relpath(sys.argv[0], ROOT)] + [os.path.relpath(a, ROOT) if os.path.exists(a) else a
                                                    for a in sys.argv[1:]]) + "`.\n\n" + "\n".join(summary) + "\n")
    print(f"summary: {os.path.join(args.out, 'summary.md')}")


if __name__ == "__main__":
    main()
