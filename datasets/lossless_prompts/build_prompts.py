#!/usr/bin/env python3
"""Writes prompts.json: the 50 prompts of the lossless property test (tests/engine_test.cpp).

40 medium prompts of 151-710 tokens and 10 long ones of 1,984-3,383 tokens (SmolLM2's tokenizer,
chat template applied where chat is true; tests/engine_test.cpp asserts these counts), all slices of
datasets/tokenizer_corpus/corpus.txt (licence prose, Python source, C headers, locale data,
mixed Unicode) at seeded offsets, each under one of a few instructions (chat-formatted) or as a raw
continuation. Medium prompts are longer than SnapKV's 64-token observation window so that every
compressor really compresses them. `chat: true` prompts are wrapped in the model's chat template.
Deterministic: the same corpus gives the same file.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tokenizer_corpus", "corpus.txt")

INSTRUCTIONS = [
    "Summarize this text in two sentences:\n\n",
    "What is the main topic of the following passage?\n\n",
    "Continue the following text:\n\n",
    "List three facts stated in this passage:\n\n",
    "Explain the following to a beginner:\n\n",
]


def snap(text, start, length):
    """A slice starting and ending at line boundaries, so prompts begin with whole lines. Text that
    is dense in tokens (non-ASCII such as CJK and emoji, or digit runs: a token or more a
    character) is cut to a quarter of the length, so a prompt's token count stays near its target."""
    begin = text.rfind("\n", 0, start) + 1
    probe = text[begin:begin + length]
    n = max(len(probe), 1)
    if sum(ord(c) > 127 for c in probe) > 0.1 * n or sum(c.isdigit() for c in probe) > 0.3 * n:
        length //= 4
    end = text.find("\n", begin + length)
    return text[begin:end if end > 0 else len(text)]


def main():
    with open(CORPUS, encoding="utf-8") as f:
        corpus = f.read()
    rng = random.Random(20261201)
    prompts = []
    for i in range(40):
        length = rng.randrange(500, 1800)
        body = snap(corpus, rng.randrange(0, len(corpus) - length - 1), length)
        chat = i % 4 != 3
        text = (INSTRUCTIONS[i % len(INSTRUCTIONS)] + body) if chat else body
        prompts.append({"name": f"medium_{i:02d}", "chat": chat, "text": text})
    for i in range(10):
        length = rng.randrange(8000, 10500)
        body = snap(corpus, rng.randrange(0, len(corpus) - length - 1), length)
        chat = i % 2 == 0
        text = (INSTRUCTIONS[i % len(INSTRUCTIONS)] + body) if chat else body
        prompts.append({"name": f"long_{i:02d}", "chat": chat, "text": text})
    with open(os.path.join(HERE, "prompts.json"), "w", encoding="utf-8") as f:
        json.dump({"made_by": "datasets/lossless_prompts/build_prompts.py", "prompts": prompts}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
