#!/usr/bin/env python3
"""Builds corpus.txt, the >= 1 MiB text the tokenizer agreement test encodes.

Sections (separated by a blank line), drawn from files on a Debian bookworm machine with CPython
3.11 and from deterministic generators (seeded):
  prose     licence texts from /usr/share/common-licenses
  code      CPython standard library modules and C headers from /usr/include
  cjk       CPython's test/cjkencodings/*-utf8.txt (Chinese, Japanese, Korean)
  locales   month and day names, currency and yes/no words from /usr/share/i18n/locales, decoded
            from their <Uxxxx> escapes (Greek, Cyrillic, Arabic, Hebrew, Devanagari, Thai, ...)
  emoji     emoji with skin tones, ZWJ sequences, flags and variation selectors mixed into text
  spacing   long runs of spaces, tabs and newlines, CRLF, indentation
  digits    long digit runs, decimals, dates, hex, phone numbers, version strings
  misc      contractions, quotes, URLs, JSON, Markdown tables, mixed scripts
The corpus is committed; this script documents how it was made and can remake it on a machine
with the same sources:  python3 datasets/tokenizer_corpus/build_corpus.py
"""
import glob
import os
import random
import re
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
PYLIB = os.path.dirname(os.__file__)
TARGET_BYTES = 1_150_000


def read(path):
    with open(path, encoding="utf-8", errors="strict") as f:
        return f.read()


def prose():
    names = ["GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic", "LGPL-2.1", "CC0-1.0"]
    return "\n\n".join(read(f"/usr/share/common-licenses/{n}") for n in names)


def code():
    modules = ["textwrap.py", "difflib.py", "json/encoder.py", "json/decoder.py", "argparse.py", "csv.py",
               "fractions.py", "heapq.py", "shlex.py", "string.py", "tokenize.py", "dataclasses.py",
               "statistics.py", "base64.py", "calendar.py"]
    parts = [read(os.path.join(PYLIB, m)) for m in modules]
    for h in ["stdio.h", "stdlib.h", "string.h", "math.h", "pthread.h", "fcntl.h"]:
        path = os.path.join("/usr/include", h)
        if os.path.exists(path):
            parts.append(read(path))
    return "\n\n".join(parts)


def cjk():
    files = sorted(glob.glob(os.path.join(PYLIB, "test", "cjkencodings", "*-utf8.txt")))
    return "\n\n".join(read(f) for f in files)


def locales():
    out = []
    escape = re.compile(r"<U([0-9A-Fa-f]{4,6})>")
    keys = ("mon", "day", "abday", "abmon", "yesexpr", "noexpr", "currency_symbol", "int_curr_symbol",
            "d_t_fmt", "alt_mon", "yesstr", "nostr")
    for path in sorted(glob.glob("/usr/share/i18n/locales/*_*")):
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        words = []
        for line in text.splitlines():
            stripped = line.strip()
            if not stripped.startswith(keys):
                continue
            for quoted in re.findall(r'"([^"]*)"', stripped):
                decoded = escape.sub(lambda m: chr(int(m.group(1), 16)), quoted)
                if any(ord(c) > 127 for c in decoded):
                    words.append(decoded)
        if words:
            out.append(os.path.basename(path) + ": " + ", ".join(words))
    return "\n".join(out)


def emoji(rng):
    faces = [chr(c) for c in range(0x1F600, 0x1F64F)]
    objects = [chr(c) for c in range(0x1F300, 0x1F5FF) if unicodedata.category(chr(c)) == "So"]
    people = [chr(c) for c in (0x1F466, 0x1F467, 0x1F468, 0x1F469, 0x1F9D1, 0x1F44D, 0x1F44B, 0x270B)]
    tones = [chr(c) for c in range(0x1F3FB, 0x1F400)]
    zwj = ["\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466", "\U0001F469\u200D\U0001F4BB",
           "\U0001F3F3\uFE0F\u200D\U0001F308", "\u2764\uFE0F\u200D\U0001F525", "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1"]
    flags = ["".join(chr(0x1F1E6 + ord(c) - 65) for c in cc) for cc in ("US", "FR", "JP", "DE", "BR", "IN", "KE", "NZ")]
    words = "the quick brown fox jumps over lazy dogs while we celebrate launch day".split()
    lines = []
    for _ in range(1800):
        parts = []
        for _ in range(rng.randint(3, 12)):
            kind = rng.random()
            if kind < 0.35:
                parts.append(rng.choice(words))
            elif kind < 0.55:
                parts.append(rng.choice(faces) * rng.randint(1, 3))
            elif kind < 0.7:
                parts.append(rng.choice(objects))
            elif kind < 0.8:
                parts.append(rng.choice(people) + rng.choice(tones))
            elif kind < 0.9:
                parts.append(rng.choice(zwj))
            else:
                parts.append(rng.choice(flags) + "\u2705\uFE0F")
        sep = rng.choice([" ", "", "  ", " - ", "! "])
        lines.append(sep.join(parts))
    return "\n".join(lines)


def spacing(rng):
    lines = []
    for i in range(3000):
        indent = rng.choice([" " * rng.randint(1, 80), "\t" * rng.randint(1, 8), " \t" * rng.randint(1, 5), ""])
        body = rng.choice(["return x", "if (a && b) {", "}", "- item", "# heading", "value = 42", "end"])
        trail = rng.choice(["", " ", "   ", "\t"])
        nl = rng.choice(["\n", "\n\n", "\r\n", "\n" * rng.randint(3, 12), "\n \n"])
        lines.append(indent + body + trail + nl)
    lines.append(" " * 700 + "x" + "\n" * 50 + "\t" * 40 + "y" + " " * 33)
    return "".join(lines)


def digits(rng):
    lines = []
    for i in range(5000):
        kind = i % 8
        if kind == 0:
            lines.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 120))))
        elif kind == 1:
            lines.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}")
        elif kind == 2:
            lines.append(f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
                         f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
        elif kind == 3:
            lines.append("0x" + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(1, 40))))
        elif kind == 4:
            lines.append(f"+{rng.randint(1, 99)} ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}")
        elif kind == 5:
            lines.append(f"v{rng.randint(0, 30)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}")
        elif kind == 6:
            lines.append(f"{rng.randint(1, 10**9):,} items at ${rng.randint(0, 99999)}.{rng.randint(0, 99):02d} each")
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 18))) for _ in range(rng.randint(2, 10))))
    # Numbers from other scripts (\p{N} beyond ASCII).
    lines.append("Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३४५६७८९, full-width ０１２３, Roman Ⅻ, fractions ½ ¾ ⅞, circled ①②③")
    return "\n".join(lines)


def misc(rng):
    samples = [
        "I'm sure you'll see they've done it; we'd've known. DON'T SHOUT, it's 'quoted' and \"double\".",
        "She said: ‘It’s fine’ — “really” … «ça va» „gut“ 「はい」",
        "https://example.com/path/to/page?query=1&other=two#fragment mailto:someone@example.org",
        '{"name": "VeriCache", "version": [0, 1, 0], "lossless": true, "ratio": 0.25, "nested": {"a": null}}',
        "| model | tok/s | ratio |\n|---|---:|:---:|\n| smol | 123.4 | 0.5x |",
        "Ωμέγα and Αλφα; Привет, мир! שלום עולם مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก Xin chào thế giới",
        "Mixed: Café naïve coöperate façade — Zürich, São Paulo, Kraków, Ærøskøbing, İstanbul, ǅemal",
        "Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ ∫₀¹ f(x)dx ≈ ∑ᵢ wᵢf(xᵢ); α≠β, ∞−1=∞ ±0.5",
        "Symbols: ©®™ § ¶ † ‡ • ‰ € £ ¥ ₹ ₿ ← → ↑ ↓ ⌘ ⌥ ⇧ ␣ ☃ ☂ ♠ ♣ ♥ ♦",
        "Control-ish: tab\tvertical\x0bformfeed\x0cnbsp\u00a0thin\u2009ideographic\u3000zero\u200bwidth",
    ]
    out = []
    for i in range(600):
        out.append(rng.choice(samples))
        if i % 7 == 0:
            out.append("".join(rng.choice(samples)[::-1]))
    return "\n".join(out)


def main():
    rng = random.Random(20261130)
    sections = [("prose", prose()), ("code", code()), ("cjk", cjk()), ("locales", locales()),
                ("emoji", emoji(rng)), ("spacing", spacing(rng)), ("digits", digits(rng)), ("misc", misc(rng))]
    text = "\n\n".join(body for _, body in sections)
    # Top up with more code until the target size is reached.
    extra = ["ast.py", "inspect.py", "pathlib.py", "typing.py", "subprocess.py", "zipfile.py"]
    while len(text.encode("utf-8")) < TARGET_BYTES and extra:
        text += "\n\n" + read(os.path.join(PYLIB, extra.pop(0)))
    out_path = os.path.join(HERE, "corpus.txt")
    with open(out_path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    for name, body in sections:
        print(f"{name:8s} {len(body.encode('utf-8')):9d} bytes", file=sys.stderr)
    print(f"total    {len(text.encode('utf-8')):9d} bytes -> {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
