#!/usr/bin/env python3
"""Draws the figures of a `vericache checklist` trace (layout "vericache-checklist" version 3,
harness/checklist_trace.h) with matplotlib, reading the trace with h5py. Each figure is a PNG with
the data behind it as a CSV of the same name:

  kl_growth            cumulative KL(p_full || p_compressed) against the decode step, per prompt and
                       their mean with its least-squares line (the paper's Fig. 4)
  acceptance           acceptance rate gamma(x, c) and mean accepted length against the draft
                       length x (the paper's Fig. 8)
  acceptance_position  acceptance at each draft position, one line per x
  accepted_lengths     how many drafts each verify accepted, at the run's x
  acceptance_cliff     gamma and mean accepted length at x as the kept fraction c falls
  temperature          gamma and decode tokens/s at (c, x) against the sampling temperature
  context_length       gamma (pooled over the prompts of a length, and each prompt's) and mean accepted
                       length at (c, x) against the prompt's length
  throughput_model     Eq. 3's iteration time against the measured one, per x
  decode_speed         decode tokens/s of full-KV decoding, of the compressed cache alone (lossy) and
                       of VeriCache at (c, x) with the run's draft policy, with how many greedy tokens
                       each gets wrong
  fixed_budget         decode tokens/s at step 4's fixed device KV budget: full KV at its batch,
                       VeriCache at its larger one
(acceptance_cliff, temperature, context_length, throughput_model and fixed_budget are absent when
their sweep, step 3 or the fixed budget did not run)

    .venv/bin/python harness/checklist/figures.py RUN/trace.h5 RUN/figures

`vericache figures RUN` runs this; `vericache checklist` runs it at the end of a run. Exit status 0
and one line per figure; 1 and the problem otherwise.
"""
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_format import DECODE_MODES, attributes, format_problem, group, open_trace  # noqa: E402


def save(fig, out_dir, name, header, rows):
    png = os.path.join(out_dir, name + ".png")
    fig.savefig(png, dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    with open(os.path.join(out_dir, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    print(f"figure: {png}")


def title(attrs, config, what):
    return f"{what}\n{attrs['compressor']}, c = {config['ratio']:g}, {os.path.basename(attrs['model_file'])}"


def kl_growth(f, attrs, config, out_dir):
    g, mean = group(f, "kl_growth"), group(f, "kl_growth_mean")
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in sorted(set(g["prompt"])):
        sel = g["prompt"] == p
        ax.plot(g["step"][sel], g["cumulative_kl"][sel], color="0.75", linewidth=0.8,
                label="each prompt" if p == 0 else None)
    ax.plot(mean["step"], mean["mean_cumulative_kl"], color="C0", label="mean over prompts")
    ax.plot(mean["step"], mean["fit"], color="C3", linestyle="--", label="least-squares line")
    ax.set_xlabel("decode step")
    ax.set_ylabel("cumulative KL (nats)")
    ax.set_title(title(attrs, config, "KL growth on the compressed cache alone"))
    ax.legend()
    rows = [(int(s), m, fit) for s, m, fit in zip(mean["step"], mean["mean_cumulative_kl"], mean["fit"])]
    save(fig, out_dir, "kl_growth", ["step", "mean_cumulative_kl", "fit"], rows)


def gamma_and_accepted(xs, gammas, accepted, xlabel, legend_loc, right_label="tokens per verify (accepted + 1)",
                       right_bottom=1):
    """A figure with gamma on the left axis and a second series (by default the mean accepted
    length) on the right, against the same x values."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, gammas, marker="o", color="C0", label="acceptance rate gamma")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("gamma: accepted / drafted")
    ax.set_ylim(0, 1.05)
    right = ax.twinx()
    right.plot(xs, accepted, marker="s", color="C1",
               label="mean accepted length" if right_bottom == 1 else "decode tokens/s (this machine)")
    right.set_ylabel(right_label)
    right.set_ylim(bottom=right_bottom)
    ax.legend(handles=ax.lines + right.lines, loc=legend_loc)
    return fig, ax


def acceptance(f, attrs, config, out_dir):
    s = group(f, "acceptance_summary")
    fig, ax = gamma_and_accepted(s["x"], s["gamma"], s["mean_accepted"], "draft length x", "lower left")
    ax.set_title(title(attrs, config, "Acceptance against the draft length"))
    rows = [(int(x), g, m) for x, g, m in zip(s["x"], s["gamma"], s["mean_accepted"])]
    save(fig, out_dir, "acceptance", ["x", "gamma", "mean_accepted"], rows)


def acceptance_position(f, attrs, config, out_dir):
    p = group(f, "acceptance_position")
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = []
    for x in sorted(set(p["x"])):
        sel = (p["x"] == x) & (p["drafted"] > 0)
        rate = p["accepted"][sel] / p["drafted"][sel]
        ax.plot(p["position"][sel] + 1, rate, marker=".", label=f"x = {int(x)}")
        rows += [(int(x), int(pos) + 1, r, int(d)) for pos, r, d in zip(p["position"][sel], rate, p["drafted"][sel])]
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted at that position")
    ax.set_ylim(0, 1.05)
    ax.set_title(title(attrs, config, "Acceptance per draft position"))
    ax.legend(fontsize="small", ncol=2)
    save(fig, out_dir, "acceptance_position", ["x", "position", "acceptance", "drafted"], rows)


def accepted_lengths(f, attrs, config, out_dir):
    w = group(f, "acceptance")
    x = config["draft_length"]
    sel = (w["x"] == x) & (w["drafted"] == x)  # full windows: a request's last may draft fewer
    counts = [int(((w["accepted"][sel]) == k).sum()) for k in range(x + 1)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(range(x + 1), counts, color="C0")
    ax.set_xlabel(f"drafts accepted of {x}")
    ax.set_ylabel("verify windows")
    ax.set_title(title(attrs, config, f"Accepted drafts per verify at x = {x}"))
    save(fig, out_dir, "accepted_lengths", ["accepted", "windows"], list(enumerate(counts)))


def chosen_run(f, config):
    """gamma, mean accepted length and decode tokens/s of the main run (c, x, greedy)."""
    s, it = group(f, "acceptance_summary"), group(f, "iterations")
    x = config["draft_length"]
    row = list(s["x"]).index(x)
    seconds = it["seconds"][it["x"] == x].sum()
    return s["gamma"][row], s["mean_accepted"][row], (s["tokens"][row] - config["prompts"]) / seconds


def acceptance_cliff(f, attrs, config, out_dir):
    r = group(f, "ratio_sweep")
    if r is None:
        return
    points = {c: (g, m) for c, g, m in zip(r["ratio"], r["gamma"], r["mean_accepted"])}
    gamma, accepted, _ = chosen_run(f, config)
    points.setdefault(config["ratio"], (gamma, accepted))
    cs = sorted(points, reverse=True)
    fig, ax = gamma_and_accepted(cs, [points[c][0] for c in cs], [points[c][1] for c in cs], "kept fraction c (falling)",
                                 "upper right")
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xticks(cs, [f"{c:g}" for c in cs])
    ax.minorticks_off()
    ax.set_title(f"The acceptance cliff at x = {config['draft_length']}\n{attrs['compressor']}, "
                 f"{os.path.basename(attrs['model_file'])}")
    save(fig, out_dir, "acceptance_cliff", ["ratio", "gamma", "mean_accepted"],
         [(c, points[c][0], points[c][1]) for c in cs])


def context_length(f, attrs, config, out_dir):
    c = group(f, "context_sweep")
    if c is None:
        return
    fig, ax = gamma_and_accepted(c["prompt_tokens"], c["gamma"], c["mean_accepted"], "prompt tokens", "lower left")
    each = group(f, "context_sweep_prompt")
    ax.scatter(each["context"], each["gamma"], color="C0", alpha=0.4, s=14)
    ax.set_xticks(c["prompt_tokens"], [f"{int(n)}" for n in c["prompt_tokens"]])
    ax.minorticks_off()
    ax.set_title(title(attrs, config, f"Acceptance against context length, x = {config['draft_length']} "
                                      f"(dots: each of {config['context_prompts']} prompts)"))
    rows = [(int(n), "all", g, m, int(k)) for n, g, m, k in
            zip(c["prompt_tokens"], c["gamma"], c["mean_accepted"], c["mismatches"])]
    rows += [(int(n), int(p), g, "", int(k)) for n, p, g, k in
             zip(each["context"], each["prompt"], each["gamma"], each["mismatches"])]
    save(fig, out_dir, "context_length", ["prompt_tokens", "prompt", "gamma", "mean_accepted", "mismatches"], rows)


def temperature(f, attrs, config, out_dir):
    t = group(f, "temperature_sweep")
    if t is None:
        return
    gamma, _, tok_s = chosen_run(f, config)
    rows = [(0.0, gamma, tok_s)] + [(T, g, s) for T, g, s in zip(t["temperature"], t["gamma"], t["tok_s"])]
    fig, ax = gamma_and_accepted([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                                 "sampling temperature T (0: greedy)", "lower left", "decode tokens/s", 0)
    ax.set_title(title(attrs, config, f"Acceptance and throughput against temperature, x = {config['draft_length']}"))
    save(fig, out_dir, "temperature", ["temperature", "gamma", "tok_s"], rows)


def throughput_model(f, attrs, config, out_dir):
    t = group(f, "throughput_model")
    if t is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(t["x"], 1e3 * t["measured_iteration_s"], marker="o", label="measured")
    ax.plot(t["x"], 1e3 * t["predicted_iteration_s"], marker="s", linestyle="--",
            label="Eq. 3 (constants from the other x)")
    ax.set_xlabel("draft length x")
    ax.set_ylabel("iteration time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title(attrs, config, "Throughput model: iteration time"))
    ax.legend()
    rows = [(int(x), m, p, e) for x, m, p, e in
            zip(t["x"], t["measured_iteration_s"], t["predicted_iteration_s"], t["error"])]
    save(fig, out_dir, "throughput_model", ["x", "measured_iteration_s", "predicted_iteration_s", "error"], rows)


def decode_speed(f, attrs, config, out_dir):
    d = group(f, "decode_speed")
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(DECODE_MODES, d["tok_s"], color=["0.6", "C3", "C0"])
    for bar, wrong in zip(bars, d["mismatches"]):
        ax.annotate(f"{int(wrong)} tokens unlike full KV", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize="small")
    ax.set_ylabel("decode tokens/s (this machine)")
    policy = config.get("draft_policy", "fixed")
    ax.set_title(title(attrs, config, f"Decode speed, VeriCache {policy} (x <= {config['draft_length']}), "
                                      f"{int(d['requests'][0])} requests in one batch"))
    rows = [(DECODE_MODES[int(m)], t, s, r, int(w), int(b)) for m, t, s, r, w, b in
            zip(d["mode"], d["tokens"], d["seconds"], d["tok_s"], d["mismatches"], d["kv_bytes"])]
    save(fig, out_dir, "decode_speed", ["mode", "tokens", "seconds", "tok_s", "mismatches", "kv_bytes"], rows)


def fixed_budget(f, attrs, config, out_dir):
    b = group(f, "fixed_budget")
    if b is None:
        return  # skipped (--budget-full-requests 0), or a trace from before the fixed-budget run
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"full KV, batch {int(b['batch'][0])}", f"VeriCache, batch {int(b['batch'][1])}"]
    ax.bar(labels, b["tok_s"], color=["0.6", "C0"])
    ax.set_ylabel("decode tokens/s (this machine)")
    ax.set_title(title(attrs, config, f"At a fixed device KV budget of {config['budget_full_requests']:g} full-KV "
                                      f"requests ({int(b['budget_pages'][0])} pages)"))
    rows = [(labels[i], int(b["batch"][i]), int(b["pages_per_request"][i]), b["tokens"][i], b["seconds"][i],
             b["tok_s"][i], int(b["mismatches"][i])) for i in range(2)]
    save(fig, out_dir, "fixed_budget", ["side", "batch", "pages_per_request", "tokens", "seconds", "tok_s", "mismatches"],
         rows)


def draw(trace, out_dir):
    with open_trace(trace) as f:
        attrs = attributes(f)
        if format_problem(attrs):
            return format_problem(attrs)
        config = json.loads(attrs["config"])
        os.makedirs(out_dir, exist_ok=True)
        for figure in (kl_growth, acceptance, acceptance_position, accepted_lengths, acceptance_cliff, temperature,
                       context_length, throughput_model, decode_speed, fixed_budget):
            figure(f, attrs, config, out_dir)
    return None


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    problem = draw(sys.argv[1], sys.argv[2])
    if problem:
        print(f"{sys.argv[1]}: {problem}", file=sys.stderr)
        sys.exit(1)
