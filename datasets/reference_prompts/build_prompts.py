#!/usr/bin/env python3
"""Writes prompts.json: the 20 prompts of the reference-logits check (tests/reference/make_fixtures.py).

14 short prompts (chat-formatted questions and raw text continuations) and 6 long ones of 2K-4K
tokens built from slices of datasets/tokenizer_corpus/corpus.txt (licence prose, Python source,
C headers, mixed Unicode). `chat: true` prompts are wrapped in the model's chat template.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "tokenizer_corpus", "corpus.txt")

SHORT = [
    ("capital", True, "What is the capital of France?"),
    ("photosynthesis", True, "Explain photosynthesis to a ten-year-old in three sentences."),
    ("python_reverse", True, "Write a Python function that reverses a linked list."),
    ("haiku", True, "Write a haiku about the ocean at night."),
    ("math", True, "What is 17 multiplied by 23? Show your steps."),
    ("json", True, "Give me a JSON object describing a book with title, author and year."),
    ("translate", True, "Translate 'Good morning, how are you?' into Spanish and German."),
    ("list", True, "List five tips for staying focused while studying."),
    ("sql", True, "Write an SQL query that returns the ten most recent orders."),
    ("unicode", True, "Què vol dir «bon dia»? Réponds en français, s'il te plaît. 🙂"),
    ("raw_story", False, "Once upon a time, in a village at the edge of a great forest, there lived"),
    ("raw_code", False, "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw_digits", False, "The first twenty digits of pi are 3.1415926535"),
    ("raw_list", False, "Ingredients for pancakes:\n1."),
]

LONG = [
    ("long_license_summary", True, "Summarize the key obligations in this licence:\n\n", 0, 9600),
    ("long_license_continue", False, "", 20000, 9500),
    ("long_code_explain", True, "Explain what this Python code does:\n\n", 140000, 8000),
    ("long_code_continue", False, "", 300000, 9200),
    ("long_header_question", True, "Which functions in this header deal with files?\n\n", 760000, 8000),
    ("long_mixed_continue", False, "", 120000, 10000),
]


def main():
    corpus = open(CORPUS, encoding="utf-8").read()
    prompts = [{"name": n, "chat": chat, "text": text} for n, chat, text in SHORT]
    for name, chat, prefix, start, length in LONG:
        prompts.append({"name": name, "chat": chat, "text": prefix + corpus[start:start + length]})
    with open(os.path.join(HERE, "prompts.json"), "w", encoding="utf-8") as f:
        json.dump({"prompts": prompts}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
