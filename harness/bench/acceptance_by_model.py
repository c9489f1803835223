#!/usr/bin/env python3
"""How acceptance scales with model size and context: for each model and context, every compressor at
each kept fraction c gets its mean acceptance length under VeriCache (greedy, draft length x, batch 1)
and its per-step KL(p_full || p_compressed) along the full-KV greedy continuation (teacher forced),
from `vericache bench-acceptance --json` (see its --help). Every VeriCache run is checked token for
token against full-KV decoding of the same prompt (mismatches must be 0).

Each (model, context, prompt style) group is stored in results/acceptance_by_model_cpu.json when it
finishes, with its own command, commit and date, so long groups (the 1.5B model at 8K and beyond) can
be added in later sessions; the Markdown table is rebuilt from every stored group. Prompts come from
the opening of datasets/tokenizer_corpus/corpus.txt in each model's own tokens: by default a chat
message asking --question about it (the model answers), with --question '' the raw text (the model
continues it).

Usage, from the repository root, after harness/setup.sh (--with-qwen-1.5b for the 1.5B model):
  python3 harness/bench/acceptance_by_model.py --model smollm2-135m --contexts 2048,8000
  python3 harness/bench/acceptance_by_model.py --model qwen2.5-coder-0.5b --contexts 2048
  python3 harness/bench/acceptance_by_model.py --model smollm2-135m --contexts 2048 --question ''   (raw text)
  python3 harness/bench/acceptance_by_model.py --table-only     (rewrite the .md from the .json)
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

from results_file import check_destination, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERICACHE = os.path.join(ROOT, "build", "vericache")
DEFAULT_PARAMS = ['kvzip={"chunk_size": 128}']
DEFAULT_QUESTION = "Summarize the key points of this text."
MODEL_ORDER = ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]
MODEL_LABEL = {"SmolLM2-135M-Instruct.Q4_1.gguf": "SmolLM2-135M",
               "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "Qwen2.5-Coder-0.5B",
               "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "Qwen2.5-Coder-1.5B"}


def git(*args):
    return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True).stdout.strip()


def load(path):
    if not os.path.exists(path):
        return {"groups": []}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def model_key(group):
    name = os.path.basename(group["model"])
    return (style(group), MODEL_ORDER.index(name) if name in MODEL_ORDER else len(MODEL_ORDER), name, group["context"])


def style(group):
    return "answer" if group.get("question") else "continue"


def label(group):
    name = MODEL_LABEL.get(os.path.basename(group["model"]), os.path.basename(group["model"]))
    ctx = group["context"]
    return f"{name} {ctx // 1000 if ctx >= 1000 else ctx}{'K' if ctx >= 1000 else ''} {style(group)}"


def table(store):
    groups = sorted(store["groups"], key=model_key)
    if not groups:
        return "# Acceptance by model and context\n\nNo groups measured yet.\n"
    cells = {}  # (compressor, ratio) -> {group index: row}
    for gi, g in enumerate(groups):
        for r in g["rows"]:
            cells.setdefault((r["compressor"], r["ratio"]), {})[gi] = r
    xs = sorted({r["draft_length"] for g in groups for r in g["rows"]})
    lines = [
        "# Acceptance by model and context (CPU)",
        "",
        "What a compressed cache is worth as a drafter, on three real models. Per (model, context C) one prompt,",
        "prefilled once; each compressor keeps its set at c from that prefill. **answer**: a chat-template user",
        "message asking \"" + DEFAULT_QUESTION + "\" about the opening of datasets/tokenizer_corpus/corpus.txt",
        "(the GPL and other licence texts), cut so the prompt holds C tokens; the model writes an answer.",
        "**continue**: the first C tokens of that text, raw; the model continues a licence it has largely",
        "memorized, the easy case for any drafter. **Mean acceptance length**: VeriCache, greedy, batch 1, draft length x = "
        + ", ".join(str(x) for x in xs) + ", 1 + accepted / drafts (vLLM's definition, the bonus or correction",
        "token included; x + 1 is the most a window can give). **KL**: mean over the decoded tokens of",
        "KL(p_full || p_compressed) of the next token in nats, both caches teacher forced along the full-KV",
        "greedy continuation. Every VeriCache run was checked token for token against that continuation",
        f"(mismatches in all {sum(len(g['rows']) for g in groups)} runs: "
        f"{sum(r['mismatches'] for g in groups for r in g['rows'])}).",
        f"One prompt per group and {', '.join(sorted({str(g['decode_tokens']) for g in groups}))} decoded tokens: "
        f"each acceptance length averages {min(r['drafts'] for g in groups for r in g['rows'])}-"
        f"{max(r['drafts'] for g in groups for r in g['rows'])} verify windows, so differences of a token or so",
        "between cells are within what one prompt can tell apart.",
    ]

    def pivot(title, field, digits):
        out = ["", f"## {title}", "", "| compressor | c | " + " | ".join(label(g) for g in groups) + " |",
               "|---|---:|" + "---:|" * len(groups)]
        for (comp, ratio), by_group in sorted(cells.items()):
            out.append(f"| {comp} | {ratio:g} | " + " | ".join(
                f"{by_group[i][field]:.{digits}f}" if i in by_group else "" for i in range(len(groups))) + " |")
        return out

    lines += pivot("Mean acceptance length", "mean_acceptance_length", 2)
    lines += pivot("Mean KL(p_full || p_compressed) per step (nats)", "mean_kl", 4)
    lines += pivot("Top-1 agreement (compressed cache's greedy token = full-KV's, per step)", "top1_agreement", 3)
    lines += ["", "## Provenance", ""]
    for g in groups:
        lines.append(f"- {label(g)}: `{g['command']}` at commit `{g['commit']}`"
                     f"{' (with uncommitted changes)' if g['dirty'] else ''}, {g['date']}, {g['threads']} threads, "
                     f"{g['decode_tokens']} decoded tokens, {g['seconds']:.0f} s")
    return "\n".join(lines) + "\n"


def reproducing_command(args, context):
    """The script's command line that measures this one group again."""
    parts = ["python3 harness/bench/acceptance_by_model.py", "--model", args.model, "--contexts", context,
             "--compressors", args.compressors, "--ratios", args.ratios, "--draft-length", args.draft_length,
             "--decode-tokens", args.decode_tokens, "--threads", args.threads]
    parts += ["--question", f"'{args.question}'"]
    return " ".join(parts + [f"--params '{p}'" for p in args.params if p not in DEFAULT_PARAMS])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a model file or embedded model name")
    ap.add_argument("--contexts", default="2048")
    ap.add_argument("--question", default=DEFAULT_QUESTION,
                    help="asked about the text in a chat message (the 'answer' groups); empty: raw continuation")
    ap.add_argument("--compressors", default="snapkv,expected_attention,kvzip")
    ap.add_argument("--ratios", default="0.1,0.25,0.5")
    ap.add_argument("--draft-length", default="16")
    ap.add_argument("--decode-tokens", default="64")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--params", action="append", default=list(DEFAULT_PARAMS),
                    help="NAME=JSON compressor parameters (KVzip's reconstruction chunk must fit after the prompt)")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "acceptance_by_model_cpu"))
    ap.add_argument("--table-only", action="store_true", help="only rewrite the .md from the stored groups")
    args = ap.parse_args()
    check_destination(args.out + ".md")
    check_destination(args.out + ".json")
    store = load(args.out + ".json")
    if not args.table_only:
        for context in args.contexts.split(","):
            cmd = [VERICACHE, "bench-acceptance", "--json", "--model", args.model, "--contexts", context,
                   "--compressors", args.compressors, "--ratios", args.ratios, "--draft-length", args.draft_length,
                   "--decode-tokens", args.decode_tokens, "--threads", args.threads]
            if args.question:
                cmd += ["--question", args.question]
            for p in args.params:
                cmd += ["--params", p]
            print(" ".join(cmd), file=sys.stderr, flush=True)
            commit = git("rev-parse", "--short", "HEAD")
            dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
            start = datetime.datetime.now(datetime.timezone.utc)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            if done.returncode != 0:
                sys.exit(f"bench-acceptance failed with exit code {done.returncode}")
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
            group = {"model": os.path.basename(rows[0]["model"]), "context": int(context), "question": args.question,
                     "command": reproducing_command(args, context), "commit": commit, "dirty": dirty,
                     "date": start.replace(microsecond=0).isoformat(), "threads": int(args.threads),
                     "decode_tokens": int(args.decode_tokens),
                     "seconds": (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds(),
                     "rows": rows}
            store["groups"] = [g for g in store["groups"] if (g["model"], g["context"], style(g)) !=
                               (group["model"], group["context"], style(group))] + [group]
            write_atomically(args.out + ".json", json.dumps(store, indent=1) + "\n")
    text = table(store)
    write_atomically(args.out + ".md", text)
    print(text)


if __name__ == "__main__":
    main()
