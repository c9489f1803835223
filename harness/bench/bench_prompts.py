"""Prompts the benchmark scripts share, all from the repository's prompt sets:
  - datasets_text(): the built sets long_docs, long_code, code_tasks and function_calling joined into
    one text file (.cache/bench_datasets_text.txt) that throughput benchmarks cut prompts from: text
    the model has not memorized, unlike datasets/tokenizer_corpus/corpus.txt, which opens with
    licence texts SmolLM2 and Qwen reproduce nearly word for word (acceptance there is inflated);
  - dataset_prompts(n): the first n prompts taken alternately from long_docs and long_code, for
    acceptance tables (written to .cache/ as text files);
  - lossless_prompts(n): datasets/prompts/document_2k.txt and the first n long prompts of
    datasets/lossless_prompts/prompts.json, the older acceptance prompts (slices of corpus.txt)."""
import json
import os
import sys

from results_file import write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "datasets", "tokenizer_corpus", "corpus.txt")
DATASET_SETS = ("long_docs", "long_code", "code_tasks", "function_calling")
DATASETS_TEXT = os.path.join(ROOT, ".cache", "bench_datasets_text.txt")


def prompt_set(name):
    """The prompts of datasets/<name>/prompts.json; exits with a message when set-up has not built it."""
    path = os.path.join(ROOT, "datasets", name, "prompts.json")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing; harness/setup.sh builds it")
    return json.load(open(path, encoding="utf-8"))["prompts"]


def datasets_text():
    """The path of the dataset prompts joined into one text (written to .cache/)."""
    parts = []
    for name in DATASET_SETS:
        parts += [p["text"] for p in prompt_set(name)]
    os.makedirs(os.path.dirname(DATASETS_TEXT), exist_ok=True)
    write_atomically(DATASETS_TEXT, "\n\n".join(parts))
    return DATASETS_TEXT


def bench_text(which):
    """The file throughput prompts are cut from: "datasets" (datasets_text()) or "corpus" (corpus.txt)."""
    return CORPUS if which == "corpus" else datasets_text()


def _as_files(prompts):
    os.makedirs(os.path.join(ROOT, ".cache"), exist_ok=True)
    out = []
    for p in prompts:
        path = os.path.join(ROOT, ".cache", f"acceptance_{p['name']}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(p["text"])
        out.append((p["name"], path, p["chat"]))
    return out


def dataset_prompts(count):
    """[(name, path, chat)]: the first `count` prompts alternately of long_docs and long_code."""
    docs, code = prompt_set("long_docs"), prompt_set("long_code")
    picked = [(docs if i % 2 == 0 else code)[i // 2] for i in range(count)]
    return _as_files(picked)


def lossless_prompts(long_prompts):
    """[(name, path, chat)] for `vericache run -f path` (`--no-chat-template` when chat is false)."""
    out = [("document_2k", os.path.join(ROOT, "datasets", "prompts", "document_2k.txt"), True)]
    data = json.load(open(os.path.join(ROOT, "datasets", "lossless_prompts", "prompts.json"), encoding="utf-8"))
    return out + _as_files([p for p in data["prompts"] if p["name"].startswith("long_")][:long_prompts])
