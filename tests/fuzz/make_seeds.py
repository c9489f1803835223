#!/usr/bin/env python3
"""Writes the seed inputs of the fuzzers (tests/fuzz/README.md) into tests/fuzz/seeds/, and the
regression inputs (classes that failed before the hardening issue) into tests/fuzz/regressions/.

gguf/: tiny GGUF v3 files a fuzzer can mutate quickly: a Llama model of one layer whose metadata,
tokenizer (byte-level BPE with merges, special tokens, ChatML template) and tensors pass every
check, one file per tensor type family; the same in Qwen2's shape (architecture qwen2, the qwen2
pre-tokenizer, q/k/v biases) in Q8_0, Q4_K and Q6_K; and the all-types fixture of tests/fixtures/gguf.
elf/: the bundled plugin libraries (200 KB) are too large to mutate usefully; the seeds are a
complete 5 KB shared library compiled here with `cc` and its ELF header alone.

Usage: python3 tests/fuzz/make_seeds.py   (standard library and a C compiler)
"""
import os
import shutil
import struct
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "seeds")
REGRESSIONS = os.path.join(HERE, "regressions")

U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K = 0, 1, 8, 12, 14


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(vtype, value):
    if vtype == U32:
        return struct.pack("<I", value)
    if vtype == I32:
        return struct.pack("<i", value)
    if vtype == F32:
        return struct.pack("<f", value)
    if vtype == BOOL:
        return struct.pack("<B", 1 if value else 0)
    if vtype == STRING:
        return gguf_string(value)
    element_type, items = value
    return struct.pack("<IQ", element_type, len(items)) + b"".join(gguf_value(element_type, v) for v in items)


def tensor_bytes(ggml_type, n):
    if ggml_type == GGML_F32:
        return b"".join(struct.pack("<f", (i % 7) * 0.25 - 0.5) for i in range(n))
    if ggml_type == GGML_F16:
        return b"".join(struct.pack("<e", (i % 5) * 0.5 - 1.0) for i in range(n))
    if ggml_type == GGML_Q4_K:
        # Blocks of 256: float16 d and dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit codes.
        return b"".join(struct.pack("<ee", 0.0625, 0.03125) + bytes((i * 7) % 64 for i in range(12)) +
                        bytes((i * 5) % 256 for i in range(128)) for _ in range(n // 256))
    if ggml_type == GGML_Q6_K:
        # Blocks of 256: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, float16 d.
        return b"".join(bytes((i * 11) % 256 for i in range(128)) + bytes((i * 13) % 256 for i in range(64)) +
                        bytes((i * 3) % 64 for i in range(16)) + struct.pack("<e", 0.0625) for _ in range(n // 256))
    # Q8_0: blocks of a float16 scale and 32 int8 values.
    return b"".join(struct.pack("<e", 0.125) + bytes((i * 3) % 256 for i in range(32)) for _ in range(n // 32))


def gguf_file(metadata, tensors, alignment=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, vtype, value in metadata:
        out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)
    data, offsets = b"", []
    for name, dims, ggml_type in tensors:
        n = 1
        for d in dims:
            n *= d
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += tensor_bytes(ggml_type, n)
    for (name, dims, ggml_type), offset in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def byte_symbol(b):
    """GPT-2's byte-to-unicode map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def tiny_llama(ggml_type, **override):
    return tiny_model(ggml_type, "llama", 64, "smollm", **override)


def tiny_qwen2(ggml_type, d=64, **override):
    """Qwen2's shape: architecture qwen2 (its keys), the qwen2 pre-tokenizer, biases on q, k and v."""
    return tiny_model(ggml_type, "qwen2", d, "qwen2", **override)


def tiny_model(ggml_type, arch, d, pre, **override):
    # Heads of 64 (a head dim the CPU kernels support), one KV head: d = 256 is Qwen2's grouped
    # attention, 4 query heads per KV head.
    head_dim, heads = 64, d // 64
    tokens = [byte_symbol(b) for b in range(256)] + ["he", "ll", "hell", "hello", "\u0120w", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    merges = ["h e", "l l", "he ll", "hell o", "\u0120 w"]
    vocab = len(tokens)
    chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
              "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    metadata = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, "fuzz seed"),
        (arch + ".block_count", U32, 1),
        (arch + ".context_length", U32, 64),
        (arch + ".embedding_length", U32, d),
        (arch + ".feed_forward_length", U32, 128),
        (arch + ".attention.head_count", U32, heads),
        (arch + ".attention.head_count_kv", U32, 1),
        (arch + ".rope.freq_base", F32, 10000.0),
        (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-5),
        (arch + ".rope.dimension_count", U32, head_dim),
        (arch + ".vocab_size", U32, vocab),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, vocab - 2),
        ("tokenizer.ggml.eos_token_id", U32, vocab - 1),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING, chatml),
    ]
    metadata = [(k, t, override.get(k, v)) for k, t, v in metadata]
    tensors = [("token_embd.weight", [d, vocab], ggml_type), ("blk.0.attn_q.weight", [d, d], ggml_type)]
    if arch == "qwen2":
        tensors += [("blk.0.attn_q.bias", [d], GGML_F32)] + [("blk.0.attn_%s.bias" % n, [head_dim], GGML_F32) for n in "kv"]
    tensors.append(("output_norm.weight", [d], GGML_F32))
    return gguf_file(metadata, tensors)


def tiny_shared_library(path):
    """A complete x86-64 shared library of about 5 KB: one function, no libc."""
    source = path + ".c"
    with open(source, "w") as f:
        f.write('const char* vc_plugin_descriptor_v1(void) { return "seed"; }\n')
    subprocess.run(["cc", "-shared", "-nostdlib", "-s", "-Wl,-z,max-page-size=4096", "-Wl,-z,noseparate-code",
                    "-Wl,--build-id=none", "-o", path, source], check=True)
    os.remove(source)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def regressions():
    """One input per class of file that crashed, hung or was silently accepted before the hardening
    issue (#8), in the small form a fuzzer runs quickly."""
    gguf = os.path.join(REGRESSIONS, "gguf")
    write(os.path.join(gguf, "huge_context_length.gguf"), tiny_llama(GGML_Q8_0, **{"llama.context_length": 4_000_000_000}))
    write(os.path.join(gguf, "nan_rms_epsilon.gguf"),
          tiny_llama(GGML_Q8_0, **{"llama.attention.layer_norm_rms_epsilon": float("nan")}))
    write(os.path.join(gguf, "more_layers_than_tensors.gguf"), tiny_llama(GGML_Q8_0, **{"llama.block_count": 2}))
    write(os.path.join(gguf, "control_bytes_in_architecture.gguf"),
          tiny_llama(GGML_Q8_0, **{"general.architecture": "ll\x00\x1b[2Ja"}))
    elf = os.path.join(REGRESSIONS, "elf")
    library = open(os.path.join(OUT, "elf", "tiny.so"), "rb").read()
    for cut in (100, 1000, 3000, len(library) - 1):  # truncated copies: SIGBUS in dlopen before
        write(os.path.join(elf, "tiny_cut_at_%d.so" % cut), library[:cut])


def main():
    for folder in (OUT, REGRESSIONS):
        for sub in ("gguf", "elf"):
            shutil.rmtree(os.path.join(folder, sub), ignore_errors=True)
            os.makedirs(os.path.join(folder, sub))
    for name, ggml_type in [("tiny_llama_f32", GGML_F32), ("tiny_llama_f16", GGML_F16), ("tiny_llama_q8_0", GGML_Q8_0)]:
        with open(os.path.join(OUT, "gguf", name + ".gguf"), "wb") as f:
            f.write(tiny_llama(ggml_type))
    # Qwen2's shape (Qwen2.5-Coder): its pre-tokenizer and biases, and the K-quants its Q4_K_M files use.
    for name, ggml_type, d in [("tiny_qwen2_q8_0", GGML_Q8_0, 64), ("tiny_qwen2_q4_k", GGML_Q4_K, 256),
                               ("tiny_qwen2_q6_k", GGML_Q6_K, 256)]:
        with open(os.path.join(OUT, "gguf", name + ".gguf"), "wb") as f:
            f.write(tiny_qwen2(ggml_type, d))
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "gguf", "all_types.gguf"), os.path.join(OUT, "gguf"))
    library = os.path.join(OUT, "elf", "tiny.so")
    tiny_shared_library(library)
    with open(library, "rb") as f, open(os.path.join(OUT, "elf", "tiny_header_only.so"), "wb") as g:
        g.write(f.read()[:64])
    regressions()


if __name__ == "__main__":
    main()
