#!/usr/bin/env python3
"""Regenerates the reference fixtures the C++ tests compare against.

Every fixture comes from an implementation independent of ours, run on the same files:
  gguf       PyPI `gguf` (gguf-py) dequantizer:
               tests/fixtures/gguf/all_types.gguf           one tensor of every type VeriCache decodes,
                                                             random block bytes with finite scales
               tests/fixtures/gguf/all_types_expected.gguf  gguf-py's float32 dequantization of each
               tests/fixtures/gguf/real_models.json         per-tensor fingerprints of gguf-py's
                                                             dequantization of the two real model files
  tokenizer  Hugging Face `tokenizers`, built from the GGUF vocabulary and merges with SmolLM2's
             pre-tokenizer (Digits(individual_digits) + ByteLevel), cross-checked against llama.cpp
             (PyPI `llama-cpp-python`) token for token:
               tests/fixtures/tokenizer/corpus_ids.u16       uint16 little-endian ids of corpus.txt
               tests/fixtures/tokenizer/corpus_ids.json      count, tools, versions
  logits     Hugging Face `transformers` loading the same GGUF (dequantized to float32):
               tests/fixtures/reference/logits.json         20 prompts: ids, next-token logits (top 64
                                                             and every 64th vocabulary entry), 64-token
                                                             greedy continuation
  qwen       the same for Qwen2.5-Coder 0.5B (transformers' own GGUF tokenizer and model):
               tests/fixtures/reference/qwen_corpus_ids.u32 ids of corpus.txt
               tests/fixtures/reference/qwen_logits.json    8 prompts (2 of 8K+ characters), 32-token
                                                             greedy continuations
  qwen_1_5b  the same prompts for Qwen2.5-Coder 1.5B (setup.sh --with-qwen-1.5b):
               tests/fixtures/reference/qwen_1.5b_logits.json
  qwen_long  Qwen2.5-Coder 0.5B and 1.5B on one 8,200+-token prompt (the opening of corpus.txt):
               tests/fixtures/reference/qwen_long_0.5b.json, qwen_long_1.5b.json: logits, 16-token
                                                             greedy continuation
Run from the repository root with the project venv after harness/setup.sh:
  .venv/bin/pip install transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 accelerate==1.15.0 llama-cpp-python==0.3.36
  .venv/bin/python tests/reference/make_fixtures.py [gguf] [tokenizer] [logits] [qwen] [qwen_1_5b] [qwen_long]
"""
import hashlib
import json
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
MODELS = os.path.join(ROOT, ".models")
SMOLLM = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")
QWEN = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
QWEN_1_5B = os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")  # setup.sh --with-qwen-1.5b
CORPUS = os.path.join(ROOT, "datasets", "tokenizer_corpus", "corpus.txt")
PROMPTS = os.path.join(ROOT, "datasets", "reference_prompts", "prompts.json")


def versions(*names):
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for n in names:
        out[n] = md.version(n)
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# gguf

def fingerprint(values):
    """sum_i (bits_i + 1) * K_i mod 2^64 over the float32 bit patterns, K_i odd (see gguf_test.cpp)."""
    bits = values.astype(np.float32, copy=False).view(np.uint32).astype(np.uint64)
    i = np.arange(1, bits.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        k = i * np.uint64(0x9E3779B97F4A7C15)
        k ^= k >> np.uint64(30)
        k *= np.uint64(0xBF58476D1CE4E5B9)
        k ^= k >> np.uint64(27)
        k *= np.uint64(0x94D049BB133111EB)
        k ^= k >> np.uint64(31)
        k |= np.uint64(1)
        return int(np.sum((bits + np.uint64(1)) * k, dtype=np.uint64))


def make_gguf():
    import gguf
    from gguf import GGMLQuantizationType as Q
    rng = np.random.default_rng(20261130)
    out_dir = os.path.join(FIXTURES, "gguf")
    os.makedirs(out_dir, exist_ok=True)

    def f16_bits(n, lo=-3.0, hi=3.0):
        return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint16)

    # (type, f16 scale offsets inside a block)
    quantized = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
                 Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
    rows, cols = 3, 512
    writer = gguf.GGUFWriter(os.path.join(out_dir, "all_types.gguf"), "llama")
    expected = gguf.GGUFWriter(os.path.join(out_dir, "all_types_expected.gguf"), "llama")
    writer.add_string("vericache.fixture", "every tensor type VeriCache dequantizes, random blocks")
    for qtype, scale_offsets in quantized.items():
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = rows * cols // block_size
        raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
        for off in scale_offsets:
            raw[:, off:off + 2] = f16_bits(n_blocks).view(np.uint8).reshape(n_blocks, 2)
        raw = raw.reshape(rows, -1)
        writer.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
        values = gguf.quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
        expected.add_tensor(qtype.name.lower(), values)
    f32 = rng.standard_normal((rows, cols)).astype(np.float32)
    f32[0, :4] = [0.0, -0.0, np.inf, -np.inf]
    f16 = np.concatenate([f16_bits(rows * cols - 6), np.array([0x0001, 0x83ff, 0x0000, 0x8000, 0x7c00, 0xfc00], np.uint16)])
    bf16 = (rng.standard_normal(rows * cols).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    writer.add_tensor("f32", f32)
    writer.add_tensor("f16", f16.reshape(rows, cols).view(np.float16))
    writer.add_tensor("bf16", bf16.reshape(rows, cols).view(np.uint8).reshape(rows, -1), raw_dtype=Q.BF16)
    expected.add_tensor("f32", f32)
    expected.add_tensor("f16", f16.reshape(rows, cols).view(np.float16).astype(np.float32))
    expected.add_tensor("bf16", gguf.quants.dequantize(bf16.reshape(rows, cols).view(np.uint8).reshape(rows, -1), Q.BF16)
                        .reshape(rows, cols).astype(np.float32))
    for w in (writer, expected):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    models = {}
    for path in (SMOLLM, GEMMA):
        reader = gguf.GGUFReader(path)
        tensors = {}
        for t in reader.tensors:
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
            tensors[t.name] = {"type": t.tensor_type.name, "n_elements": int(values.size),
                               "fingerprint": str(fingerprint(values)),
                               "first": [float(v) for v in values[:4]]}
        models[os.path.basename(path)] = {"sha256": sha256(path), "tensors": tensors}
    with open(os.path.join(out_dir, "real_models.json"), "w") as f:
        json.dump({"tool": "gguf-py quants.dequantize", "versions": versions("gguf", "numpy"),
                   "models": models}, f, indent=1)
    print("gguf fixtures written", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# tokenizer

def hf_tokenizer(path):
    """SmolLM2's tokenizer as Hugging Face `tokenizers` defines it, from the GGUF vocabulary."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                              fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tk


def make_tokenizer():
    import llama_cpp
    text = open(CORPUS, encoding="utf-8", newline="").read()
    hf = hf_tokenizer(SMOLLM).encode(text, add_special_tokens=False).ids
    llm = llama_cpp.Llama(model_path=SMOLLM, vocab_only=True, verbose=False)
    lc = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    if hf != lc:
        first = next((i for i in range(min(len(hf), len(lc))) if hf[i] != lc[i]), min(len(hf), len(lc)))
        sys.exit(f"tokenizers and llama.cpp disagree at token {first}; not writing a fixture")
    out_dir = os.path.join(FIXTURES, "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    np.asarray(hf, dtype="<u2").tofile(os.path.join(out_dir, "corpus_ids.u16"))
    with open(os.path.join(out_dir, "corpus_ids.json"), "w") as f:
        json.dump({"corpus": "datasets/tokenizer_corpus/corpus.txt", "corpus_sha256": sha256(CORPUS),
                   "corpus_bytes": len(text.encode("utf-8")), "tokens": len(hf),
                   "reference": "tokenizers BPE + Digits(individual_digits=True) + ByteLevel(add_prefix_space=False)",
                   "cross_check": "llama.cpp (llama-cpp-python) tokenize(special=False): identical ids",
                   "model_sha256": sha256(SMOLLM),
                   "versions": versions("tokenizers", "llama_cpp_python", "gguf")}, f, indent=1)
    print(f"tokenizer fixture: {len(hf)} tokens, llama.cpp agrees", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# logits

def reference_case(model, name, text, ids, eos, pad, max_new_tokens, stride=64):
    """transformers' next-token logits after `ids` (top 64 and every `stride`-th entry) and its greedy
    continuation (KV cache, stopping at `eos`, which is not kept)."""
    import torch
    start = time.time()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=pad, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    cont = out[0, len(ids):].tolist()
    while cont and cont[-1] in eos:
        cont.pop()
    top = torch.topk(logits, 64)
    print(f"{name}: {len(ids)} prompt tokens, {len(cont)} generated, {time.time() - start:.1f}s", file=sys.stderr)
    return {"name": name, "text": text, "ids": ids, "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
            "stride": stride, "strided_logits": logits[::stride].tolist(), "greedy_continuation": cont}


def chatml(user):
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def make_logits():
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    prompts = json.load(open(PROMPTS, encoding="utf-8"))["prompts"]
    tk = hf_tokenizer(SMOLLM)
    model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=os.path.basename(SMOLLM), dtype=torch.float32)
    model.eval()
    eos = [2, 0]  # <|im_end|>, <|endoftext|>
    cases = []
    for p in prompts:
        text = chatml(p["text"]) if p["chat"] else p["text"]
        ids = tk.encode(text, add_special_tokens=False).ids
        cases.append(reference_case(model, p["name"], text, ids, eos, pad=2, max_new_tokens=64))
    out_dir = os.path.join(FIXTURES, "reference")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "logits.json"), "w") as f:
        json.dump({"tool": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., dtype=float32), "
                           "greedy generate with KV cache",
                   "model_sha256": sha256(SMOLLM), "versions": versions("transformers", "torch", "tokenizers", "gguf"),
                   "eos_ids": eos, "cases": cases}, f)
    print("logits fixture written", file=sys.stderr)


QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def qwen_reference(path, out_name):
    """Logits / greedy continuations of one Qwen2.5-Coder file for the first prompts of
    datasets/reference_prompts (Qwen's ChatML with its default system message), written to
    tests/fixtures/reference/`out_name`; returns transformers' tokenizer of the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    name = os.path.basename(path)
    tk = AutoTokenizer.from_pretrained(MODELS, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=name, dtype=torch.float32)
    model.eval()
    eos = [151645, 151643]  # <|im_end|>, <|endoftext|>
    cases = []
    prompts = json.load(open(PROMPTS, encoding="utf-8"))["prompts"]
    chosen = [p for p in prompts if len(p["text"]) < 2000][:6] + [p for p in prompts if len(p["text"]) >= 8000][:2]
    for p in chosen:
        text = (f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\n{p['text']}<|im_end|>\n"
                "<|im_start|>assistant\n") if p["chat"] else p["text"]
        ids = tk(text, add_special_tokens=False)["input_ids"]
        cases.append(reference_case(model, p["name"], text, ids, eos, pad=151643, max_new_tokens=32))
    with open(os.path.join(FIXTURES, "reference", out_name), "w") as f:
        json.dump({"tool": "transformers AutoModelForCausalLM / AutoTokenizer .from_pretrained(gguf_file=..., "
                           "dtype=float32), greedy generate with KV cache",
                   "model": name, "model_sha256": sha256(path),
                   "versions": versions("transformers", "torch", "tokenizers", "gguf"),
                   "eos_ids": eos, "max_new_tokens": 32, "cases": cases}, f)
    return tk


def make_qwen():
    """Qwen2.5-Coder 0.5B: the tokenizer transformers builds from the GGUF on the whole corpus, and
    the reference prompts (qwen_reference)."""
    tk = qwen_reference(QWEN, "qwen_logits.json")
    text = open(CORPUS, encoding="utf-8", newline="").read()
    corpus_ids = tk(text, add_special_tokens=False)["input_ids"]
    np.asarray(corpus_ids, dtype="<u4").tofile(os.path.join(FIXTURES, "reference", "qwen_corpus_ids.u32"))
    path = os.path.join(FIXTURES, "reference", "qwen_logits.json")
    fixture = json.load(open(path, encoding="utf-8"))
    fixture.update({"corpus_tokens": len(corpus_ids),
                    "corpus_ids": "qwen_corpus_ids.u32 (uint32 little-endian, add_special_tokens=False)"})
    with open(path, "w") as f:
        json.dump(fixture, f)
    print("qwen fixtures written", file=sys.stderr)


def make_qwen_1_5b():
    """Qwen2.5-Coder 1.5B (same tokenizer as 0.5B): the reference prompts (qwen_reference)."""
    qwen_reference(QWEN_1_5B, "qwen_1.5b_logits.json")
    print("qwen 1.5b fixtures written", file=sys.stderr)


QWEN_LONG_TOKENS = 8200  # at least this many prompt tokens: past SmolLM2's whole 8K context


def make_qwen_long():
    """Qwen2.5-Coder 0.5B and 1.5B on one prompt of 8K+ tokens: the opening of corpus.txt (raw text,
    no template), cut at a line end once it holds QWEN_LONG_TOKENS tokens. One forward gives the
    logits after the prompt (generate's first-step logits) and a 16-token greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    corpus = open(CORPUS, encoding="utf-8", newline="").read()
    eos = [151645, 151643]
    for size, path in (("0.5b", QWEN), ("1.5b", QWEN_1_5B)):
        name = os.path.basename(path)
        tk = AutoTokenizer.from_pretrained(MODELS, gguf_file=name)
        end = 0
        while True:
            end = corpus.index("\n", end + 4096) + 1
            text = corpus[:end]
            ids = tk(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= QWEN_LONG_TOKENS:
                break
        model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=name, dtype=torch.float32)
        model.eval()
        start = time.time()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=eos,
                                 pad_token_id=151643, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 output_logits=True, return_dict_in_generate=True)
        logits = out.logits[0][0].float()
        cont = out.sequences[0, len(ids):].tolist()
        while cont and cont[-1] in eos:
            cont.pop()
        top = torch.topk(logits, 64)
        print(f"qwen {size} long: {len(ids)} prompt tokens, {len(cont)} generated, {time.time() - start:.1f}s",
              file=sys.stderr)
        case = {"name": f"corpus_{len(ids)}_tokens", "text": text, "ids": ids, "top_ids": top.indices.tolist(),
                "top_logits": top.values.tolist(), "stride": 64, "strided_logits": logits[::64].tolist(),
                "greedy_continuation": cont}
        with open(os.path.join(FIXTURES, "reference", f"qwen_long_{size}.json"), "w") as f:
            json.dump({"tool": "transformers AutoModelForCausalLM / AutoTokenizer .from_pretrained(gguf_file=..., "
                               "dtype=float32), greedy generate with KV cache; logits = generate's first step",
                       "model": name, "model_sha256": sha256(path),
                       "versions": versions("transformers", "torch", "tokenizers", "gguf"),
                       "eos_ids": eos, "max_new_tokens": 16, "cases": [case]}, f)
        del model


def main():
    parts = sys.argv[1:] or ["gguf", "tokenizer", "logits", "qwen", "qwen_1_5b", "qwen_long"]
    for part in parts:
        {"gguf": make_gguf, "tokenizer": make_tokenizer, "logits": make_logits, "qwen": make_qwen,
         "qwen_1_5b": make_qwen_1_5b, "qwen_long": make_qwen_long}[part]()


if __name__ == "__main__":
    main()
