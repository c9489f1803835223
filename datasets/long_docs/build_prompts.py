#!/usr/bin/env python3
"""Builds datasets/long_docs/prompts.json: long documentation with a question, from the CMake
reference manual as Debian bookworm ships it (package cmake-data 3.25.1-1,
/usr/share/cmake-3.25/Help/command/*.rst; BSD-3-Clause, /usr/share/doc/cmake-data/copyright).
Nothing is downloaded and no third-party text is committed: setup runs this script, and the output
is ignored by git.

Deterministic: a fixed list of command pages, each cut at a fixed number of characters on a line
boundary, followed by one question about that page. Each source file's SHA-256 is pinned; another
file is refused unless --any-source.

    python3 datasets/long_docs/build_prompts.py [--out datasets/long_docs/prompts.json]
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import prompt_sets  # noqa: E402

ROOT = pathlib.Path("/usr/share/cmake-3.25/Help/command")
# page, characters of context (about 3.5 characters per token: the longest prompt stays near 5K
# tokens, so KVzip's reconstruction pass, context + a 2,048-token chunk, fits SmolLM2's 8,192
# positions), SHA-256 in cmake-data 3.25.1-1.
PAGES = [
    ("file", 18000, "b182759ee468326b92016aa2701f57c7caa759aec696238d4997e948e1909817"),
    ("install", 18000, "3cb4c99a8c62b5b328b702e3fcf3309b5f57beaa1d38b76de65f8572ab155581"),
    ("find_package", 16000, "0a080b7dc98520166527bc31f4267d07059ec25e4486cd4dccd4d91320d41385"),
    ("cmake_path", 14000, "1389a4f76187626b11ea1ef298fcde64e972c10a1146543715b344ad801fd077"),
    ("string", 12000, "5c959dbc2a17058f04960bebfad8ebb596aa3a8a97b53b21d43401973d7e5512"),
    ("add_custom_command", 12000, "5abefb0c208359f854a327c2fdf5c0ef4ae8b3d67230d136156e5af8ae12659b"),
    ("target_link_libraries", 8000, "49c845368481bd2042d328ffcdb4a3c778ea2d6e7df33ebcea08cc83cdfadccf"),
    ("if", 8000, "2986ad045676cfe9c96951ac006c65e96895fbe67c598782c43149b8e80adc94"),
]
QUESTION = ("\n\nThe text above is the beginning of CMake's reference page for the `{page}` command. Using "
            "only that text, list the forms of `{page}` it documents, each with its signature and one "
            "sentence on what it does, then write a short example that uses one of them.")


def main():
    args = prompt_sets.arguments(__file__, __doc__.split("\n\n")[0], pinned_files=True)
    prompts, sources = [], {}
    for page, limit, pinned in PAGES:
        data, sources[f"{page}.rst"] = prompt_sets.pinned_file(ROOT / f"{page}.rst", pinned, args.any_source,
                                                               "Debian package cmake-data 3.25")
        prompts.append({"name": f"long_docs_{page}", "chat": True,
                        "text": prompt_sets.cut(data.decode("utf-8"), limit) + QUESTION.format(page=page)})
    prompt_sets.write_prompt_set(args.out, "CMake 3.25 reference manual, /usr/share/cmake-3.25/Help/command "
                                 "(Debian cmake-data 3.25.1-1); BSD-3-Clause", sources, prompts)


if __name__ == "__main__":
    main()
