#!/usr/bin/env python3
"""Builds datasets/long_code/prompts.json: long code contexts with a coding task, from CPython's
standard library as Debian bookworm ships it (packages libpython3.11-minimal / libpython3.11-stdlib,
/usr/lib/python3.11; PSF License 2.0). Nothing is downloaded and no third-party text is committed:
setup runs this script, and the output is ignored by git.

Deterministic: a fixed list of modules, each cut at a fixed number of characters on a line
boundary, and a task naming the last complete top-level function or class of the cut. The script
records each source file's SHA-256 and refuses to write when a file differs from the one this list
was made with (another Python build: the prompts would silently change), unless --any-source.

Schema (the same as datasets/lossless_prompts/prompts.json, read by `vericache checklist
--prompt-set`): {"source": ..., "prompts": [{"name", "chat", "text"}, ...]}.

    python3 datasets/long_code/build_prompts.py [--out datasets/long_code/prompts.json]
"""
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import prompt_sets  # noqa: E402

ROOT = pathlib.Path("/usr/lib/python3.11")
# module, characters of context (about 4 characters per token), SHA-256 of the file in
# libpython3.11-stdlib 3.11.2-6+deb12u6.
MODULES = [
    ("textwrap.py", 4000,
     "62867e40cdea6669b361f72af4d7daf0359f207c92cbeddfc7c7506397c1f31c"),
    ("heapq.py", 8000,
     "6d43277e5c76fc0f073cd388fcff852d14d068f6bb6d4886c340f8b75a1229a9"),
    ("bisect.py", 3000,
     "e5b2ff166f48a06e70ae831d8c9b47283fcd0c254306eee12d3dae9c55e11526"),
    ("fractions.py", 12000,
     "b11e850e354808b882d13a70a911c29accd1dbdd41757566704e3b7206c74edb"),
    ("statistics.py", 16000,
     "889a066f1b8063e73387ceb84018efc507a89b365b56c6afb9cc15b2ed25c2d9"),
    ("shlex.py", 10000,
     "42ab6060f316e121e374e6621d8c1c98b8db323903c3df289a810c45a8ae46a7"),
    ("csv.py", 14000,
     "6c68a5186e3b85e6e267a7ef96479327a45ae2b40bf5e9f2017e4b2282b3f5b1"),
    ("json/decoder.py", 10000,
     "9f02654649816145bc76f8c210a5fe3ba1de142d4d97a1c93105732e747c285b"),
]
TASK = ("\n\nThe code above is the beginning of the Python module `{module}`. Write a pytest test file "
        "for `{name}` as it is defined above: cover its normal behaviour and its edge cases, one test "
        "function per behaviour, and explain in one sentence what each test checks.")


def last_definition(code):
    names = re.findall(r"^(?:def|class) ([A-Za-z_][A-Za-z0-9_]*)", code, flags=re.M)
    return names[-1] if names else None


def main():
    args = prompt_sets.arguments(__file__, __doc__.split("\n\n")[0], pinned_files=True)
    prompts, sources = [], {}
    for module, limit, pinned in MODULES:
        data, sources[module] = prompt_sets.pinned_file(ROOT / module, pinned, args.any_source,
                                                        "Debian packages libpython3.11-minimal and libpython3.11-stdlib")
        code = prompt_sets.cut(data.decode("utf-8"), limit)
        name = last_definition(code)
        if name is None:
            sys.exit(f"{ROOT / module}: no top-level def or class in the first {limit} characters")
        prompts.append({"name": f"long_code_{module.replace('/', '_').removesuffix('.py')}", "chat": True,
                        "text": code + TASK.format(module=module.removesuffix(".py").replace("/", "."), name=name)})
    prompt_sets.write_prompt_set(args.out, "CPython 3.11 standard library, /usr/lib/python3.11 (Debian "
                                 "libpython3.11-stdlib); PSF License 2.0", sources, prompts)

if __name__ == "__main__":
    main()
