#!/usr/bin/env python3
"""Checks a `vericache checklist` trace (layout "vericache-checklist" version 3, documented in
harness/checklist_trace.h) with h5py: attributes, groups, column names, lengths against the run's
configuration, and the four verdicts. Exit status 0 and one summary line when it conforms;
1 and the first problem otherwise.

    .venv/bin/python harness/checklist/check_trace.py results/runs/checklist-.../trace.h5
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_format import ATTRIBUTES, GROUPS, attributes, format_problem, open_trace  # noqa: E402


def check(path):
    with open_trace(path) as f:
        attrs = attributes(f)
        missing = [a for a in ATTRIBUTES if a not in attrs]
        if missing:
            return f"missing attributes: {', '.join(missing)}"
        if format_problem(attrs):
            return format_problem(attrs)
        config = json.loads(attrs["config"])
        verdicts = json.loads(attrs["verdicts"])
        lengths = {}
        for group, columns in GROUPS.items():
            if group == "throughput_model" and verdicts[2]["holds"] is None and group not in f:
                continue  # step 3 not measured
            if (group.removesuffix("_prompt"), config.get(group.split("_")[0] + "s")) in (
                    ("ratio_sweep", []), ("temperature_sweep", []), ("context_sweep", [])):
                continue  # a sweep skipped with "none"
            if group == "fixed_budget" and not config.get("budget_full_requests"):
                continue  # step 4's fixed budget skipped (0), or a trace from before it
            if group not in f:
                return f"no group {group}"
            for c in columns:
                if c not in f[group] or f[group][c].ndim != 1:
                    return f"{group}/{c}: missing or not 1-D"
            sizes = {f[group][c].shape[0] for c in columns}
            if len(sizes) != 1:
                return f"{group}: columns of different lengths {sorted(sizes)}"
            lengths[group] = sizes.pop()
        prompts, steps = config["prompts"], config["kl_steps"]
        if lengths["kl_growth"] != prompts * steps or lengths["kl_growth_mean"] != steps:
            return f"kl_growth has {lengths['kl_growth']} rows, kl_growth_mean {lengths['kl_growth_mean']}; " \
                   f"expected {prompts} x {steps} and {steps}"
        if list(f["acceptance_summary"]["x"][:]) != config["draft_lengths"]:
            return f"acceptance_summary/x {list(f['acceptance_summary']['x'][:])} != {config['draft_lengths']}"
        for group, key in (("ratio_sweep", "ratios"), ("temperature_sweep", "temperatures"), ("context_sweep", "contexts")):
            if group in lengths and lengths[group] != len(config[key]):
                return f"{group} has {lengths[group]} rows for {len(config[key])} {key}"
        if "context_sweep" in lengths and lengths["context_sweep_prompt"] != len(config["contexts"]) * config["context_prompts"]:
            return f"context_sweep_prompt has {lengths['context_sweep_prompt']} rows for {len(config['contexts'])} " \
                   f"contexts x {config['context_prompts']} prompts"
        if list(f["decode_speed"]["mode"][:]) != [0, 1, 2]:
            return f"decode_speed/mode {list(f['decode_speed']['mode'][:])} != [0, 1, 2]"
        if "fixed_budget" in lengths and list(f["fixed_budget"]["side"][:]) != [0, 1]:
            return f"fixed_budget/side {list(f['fixed_budget']['side'][:])} != [0, 1]"
        if lengths["end_to_end"] != prompts:
            return f"end_to_end has {lengths['end_to_end']} rows for {prompts} prompts"
        if "throughput_model" in lengths and list(f["throughput_model"]["x"][:]) != config["draft_lengths"]:
            return f"throughput_model/x {list(f['throughput_model']['x'][:])} != {config['draft_lengths']}"
        if [v["step"] for v in verdicts] != [1, 2, 3, 4]:
            return f"verdicts for steps {[v['step'] for v in verdicts]}"
        held = ", ".join(f"{v['step']}: {'n/a' if v['holds'] is None else 'holds' if v['holds'] else 'FAILS'}" for v in verdicts)
        print(f"trace OK: {path} ({attrs['compressor']}, {prompts} prompts, {steps} KL steps; verdicts {held})")
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    problem = check(sys.argv[1])
    if problem:
        print(f"{sys.argv[1]}: {problem}", file=sys.stderr)
        sys.exit(1)
