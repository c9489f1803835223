"""The prompts the acceptance tables share: datasets/prompts/document_2k.txt and the first `long_prompts`
long prompts of datasets/lossless_prompts/prompts.json (written to .cache/ as text files)."""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def acceptance_prompts(long_prompts):
    """[(name, path, chat)] for `vericache run -f path` (`--no-chat-template` when chat is false)."""
    out = [("document_2k", os.path.join(ROOT, "datasets", "prompts", "document_2k.txt"), True)]
    data = json.load(open(os.path.join(ROOT, "datasets", "lossless_prompts", "prompts.json"), encoding="utf-8"))
    os.makedirs(os.path.join(ROOT, ".cache"), exist_ok=True)
    for p in [p for p in data["prompts"] if p["name"].startswith("long_")][:long_prompts]:
        path = os.path.join(ROOT, ".cache", f"acceptance_{p['name']}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(p["text"])
        out.append((p["name"], path, p["chat"]))
    return out
