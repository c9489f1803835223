#!/usr/bin/env python3
"""CPU throughput of VeriCache next to llama.cpp on the same model file, in the same run.

For each model file (the packaged Q4_1 GGUF and an F32 GGUF made from it: equal precision with our
float32 engine), each context C and batch B, the two engines run back to back with the same
thread count on the same prompts (B different C-token slices of one text, tokenized identically by
both; --text datasets, the default, joins the prompts of the repository's long_docs, long_code,
code_tasks and function_calling sets; --text corpus takes datasets/tokenizer_corpus/corpus.txt, whose
licence texts the model has memorized; throughput does not depend on which, acceptance would):
  prefill  B*C prompt tokens (both engines chunk prompts: ours 512 tokens per request per forward,
           llama.cpp n_batch 2048 / n_ubatch 512), tokens/s = B*C / seconds
  decode   D-1 steps of one token per request after the first generated token, tokens/s =
           B*(D-1) / seconds, and milliseconds per step
llama.cpp is the PyPI `llama-cpp-python` build (its version and system info are recorded), run with
its KV cache in F32 for the F32 file (equal precision) and in its default F16 for the Q4_1 file.
On the Intel Xeon VMs the CPU reports AMX but executing it raises SIGILL, so llama.cpp is built without it:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" pip install llama-cpp-python==0.3.36
The AMD EPYC VMs have AVX-512 VNNI but not the 256-bit AVX-VNNI, so there -DGGML_AVX_VNNI=OFF (a wheel
built on Intel dies with SIGILL on AMD: add --no-cache-dir --force-reinstall when switching machines).

Writes results/bench_cpu_smollm2.md and .json (or --out PREFIX). Usage, from the repository root:
  .venv/bin/pip install gguf==0.19.0 (and llama-cpp-python as above; it builds llama.cpp, ~11 min)
  .venv/bin/python harness/bench/cpu_bench.py [--contexts 512,2048,8160] [--batches 1,8] [--decode-tokens 32]
      [--compute auto|float32|integer] [--kv-cache auto|float32|bfloat16] [--files packaged,f32]
"""
import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from bench_prompts import DATASET_SETS, bench_text
from results_file import check_destination, command_line, provenance, write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGED = os.path.join(ROOT, ".models", "SmolLM2-135M-Instruct.Q4_1.gguf")
F32_COPY = os.path.join(ROOT, ".cache", "SmolLM2-135M-Instruct.F32.gguf")
# Other embedded models, packaged file only (an F32 copy of the 1.5B model would be 6 GB).
MODELS = {"qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
          "qwen2.5-coder-1.5b": ("Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")}
VERICACHE = os.path.join(ROOT, "build", "vericache")


def log(msg):
    print(f"[cpu_bench] {msg}", file=sys.stderr, flush=True)


def make_f32_copy(src, dst):
    """Every tensor of `src` dequantized to F32 (gguf-py), metadata copied, general.file_type = ALL_F32."""
    import gguf
    if os.path.exists(dst):
        return
    log(f"writing {dst}")
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst + ".tmp", arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_uint32(name, int(gguf.LlamaFileType.ALL_F32))
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
        else:
            writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(dst + ".tmp", dst)


def run_vericache(model, context, batch, decode_tokens, threads, text_file, compute, kv_cache):
    cmd = [VERICACHE, "bench", "--model", model, "--contexts", str(context), "--batches", str(batch),
           "--decode-tokens", str(decode_tokens), "--threads", str(threads), "--text-file", text_file,
           "--compute", compute, "--kv-cache", kv_cache, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class LlamaCpp:
    def __init__(self, model_path, threads):
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.threads = threads

    def tokenize(self, text):
        data = text.encode("utf-8")
        buf = (self.L.llama_token * (len(data) + 16))()
        n = self.L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        return list(buf[:n])

    def bench(self, prompts, decode_tokens, kv_type):
        L = self.L
        batch, context = len(prompts), len(prompts[0])
        cp = L.llama_context_default_params()
        cp.n_ctx = batch * (context + decode_tokens)
        cp.n_batch = 2048
        cp.n_ubatch = 512
        cp.n_seq_max = batch
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.type_k = cp.type_v = kv_type
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        lb = L.llama_batch_init(max(2048, batch), 0, 1)

        def submit(entries):  # entries: (token, pos, seq, want_logits)
            lb.n_tokens = len(entries)
            for i, (tok, pos, seq, want) in enumerate(entries):
                lb.token[i] = tok
                lb.pos[i] = pos
                lb.n_seq_id[i] = 1
                lb.seq_id[i][0] = seq
                lb.logits[i] = want
            if L.llama_decode(ctx, lb) != 0:
                raise RuntimeError("llama_decode failed")

        def argmax(i):
            ptr = L.llama_get_logits_ith(ctx, i)
            return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

        start = time.perf_counter()
        next_tok = []
        for s, prompt in enumerate(prompts):
            for c in range(0, context, 2048):
                chunk = prompt[c:c + 2048]
                submit([(t, c + i, s, c + i == context - 1) for i, t in enumerate(chunk)])
            next_tok.append(argmax(len(chunk) - 1))
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        steps = decode_tokens - 1
        for step in range(steps):
            submit([(next_tok[s], context + step, s, True) for s in range(batch)])
            next_tok = [argmax(s) for s in range(batch)]
        decode = time.perf_counter() - start
        fa = L.llama_flash_attn_type_name(cp.flash_attn_type).decode() if hasattr(L, "llama_flash_attn_type_name") else "?"
        L.llama_batch_free(lb)
        L.llama_free(ctx)
        return {"system": "llama.cpp", "context": context, "batch": batch, "prefill_seconds": prefill,
                "prefill_tok_s": batch * context / prefill, "decode_steps": steps, "decode_seconds": decode,
                "decode_tok_s": batch * steps / decode, "ms_per_step": 1000 * decode / steps,
                "threads": self.threads, "kv_dtype": {0: "f32", 1: "f16"}[kv_type], "flash_attn": fa}


# What each side computes, by VeriCache's compute mode (`vericache bench --compute`).
COMPUTE_NOTES = {
    "float32": [
        "- VeriCache (compute float32) computes in float32 (with the K/V column's cache); quantized weights stay in their",
        "  blocks and are dequantized on the fly into exactly the floats of a load-time dequantization (matching",
        "  transformers bit for bit; a Q, K, V stack whose parts differ in type is held in float32).",
    ],
    "integer": [
        "- VeriCache (compute integer) quantizes each activation row to 8-bit blocks of 32 and multiplies them by",
        "  the weights' own codes with integer dot products (AVX-512 VNNI where present); attention over the K/V",
        "  column's cache: float32 pages in float32, bfloat16 pages in bfloat16 products accumulated in float32",
        "  (vdpbf16ps where present); a file with no quantized matrices (the F32 copy) computes in float32.",
    ],
}
LLAMA_CPP_NOTE = [
    "- llama.cpp computes on the file's own types: quantized weights times quantized activations with its",
    "  default F16 KV cache; the F32 file with an F32 KV cache.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="512,2048,8160", help="prompt lengths; 8160 + 32 decode steps fills the 8K context")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m"] + sorted(MODELS),
                    help="smollm2-135m: its packaged Q4_1 file and an F32 copy; a Qwen model: its packaged Q4_K_M file")
    ap.add_argument("--text", choices=["datasets", "corpus"], default="datasets",
                    help="what the prompts are cut from: the repository's prompt sets joined (default), or "
                         "the tokenizer corpus (licence texts the model has memorized)")
    ap.add_argument("--compute", choices=["auto", "float32", "integer"], default="auto",
                    help="VeriCache's arithmetic (vericache bench --compute); auto: integer for quantized files")
    ap.add_argument("--kv-cache", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="VeriCache's KV cache pages (vericache bench --kv-cache); auto: bfloat16 with integer compute")
    ap.add_argument("--files", default="packaged,f32",
                    help="smollm2-135m only: which of its files to run, comma-separated (packaged: the Q4_1 file; "
                         "f32: an F32 copy made from it, equal precision with compute float32)")
    ap.add_argument("--out", help="output prefix (default results/bench_cpu_<model>)")
    args = ap.parse_args()
    if args.out is None:
        suffix = "smollm2" if args.model == "smollm2-135m" else args.model.replace("qwen2.5-coder-", "qwen_coder_")
        args.out = os.path.join(ROOT, "results", f"bench_cpu_{suffix}")
    check_destination(args.out + ".md")
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]

    import importlib.metadata as md
    import llama_cpp
    if args.model == "smollm2-135m":
        title = "SmolLM2-135M-Instruct"
        chosen = args.files.split(",")
        if not chosen or any(f not in ("packaged", "f32") for f in chosen):
            sys.exit(f"cpu_bench.py: --files {args.files}: give packaged, f32 or both, comma-separated")
        files = tuple(f for key, f in (("packaged", ("Q4_1 (packaged)", PACKAGED, 1)),
                                       ("f32", ("F32 (equal precision)", F32_COPY, 0))) if key in chosen)
        if "f32" in chosen:
            make_f32_copy(PACKAGED, F32_COPY)
    else:
        title, name = MODELS[args.model]
        files = (("Q4_K_M (packaged)", os.path.join(ROOT, ".models", name), 1),)
    text_file = bench_text(args.text)
    text = open(text_file, encoding="utf-8", newline="").read()
    prov = provenance(ROOT)  # read before the run: the binary and sources measured are those of now
    rows = []
    for label, path, kv_type in files:
        peer = LlamaCpp(path, args.threads)
        corpus = peer.tokenize(text)
        if len(corpus) < max(contexts) * max(batches):
            sys.exit(f"cpu_bench.py: {text_file} has {len(corpus)} tokens, fewer than {max(contexts) * max(batches)}")
        for context in contexts:
            for batch in batches:
                prompts = [corpus[i * context:(i + 1) * context] for i in range(batch)]
                log(f"{label}: context {context}, batch {batch}: vericache")
                ours = run_vericache(path, context, batch, args.decode_tokens, args.threads, text_file, args.compute,
                                     args.kv_cache)
                log(f"{label}: context {context}, batch {batch}: llama.cpp")
                theirs = peer.bench(prompts, args.decode_tokens, kv_type)
                rows.append({"file": label, "context": context, "batch": batch, "vericache": ours, "llama_cpp": theirs})
                log(f"  prefill {ours['prefill_tok_s']:.1f} vs {theirs['prefill_tok_s']:.1f} tok/s, "
                    f"decode {ours['decode_tok_s']:.1f} vs {theirs['decode_tok_s']:.1f} tok/s")

    cpu = prov["cpu"]
    meta = {**prov, "command": "python3 harness/bench/cpu_bench.py " + " ".join(sys.argv[1:]),
            "cores": os.cpu_count(), "threads": args.threads, "text": args.text, "llama_cpp_python": md.version("llama_cpp_python"),
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "python": platform.python_version()}
    write_atomically(args.out + ".json", json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"# CPU throughput: VeriCache vs llama.cpp, {title}",
        "",
        command_line(meta["command"], prov),
        "- prompts: " + ("distinct slices of the repository's prompt sets joined (" + ", ".join(DATASET_SETS) + ")"
                         if args.text == "datasets" else "distinct slices of datasets/tokenizer_corpus/corpus.txt "
                         "(licence texts the model has memorized)") + "; throughput does not depend on the text",
        f"- machine: {cpu}, {meta['cores']} cores, {args.threads} threads for both engines",
        f"- llama.cpp: llama-cpp-python {meta['llama_cpp_python']} ({meta['llama_cpp_system_info']})",
    ] + [n for c in sorted({r["vericache"]["compute"] for r in rows}) for n in COMPUTE_NOTES[c]] + LLAMA_CPP_NOTE + [
        f"- prefill: B requests of C prompt tokens; decode: {args.decode_tokens - 1} steps of one token per request.",
        "",
        "| weights | compute | K/V | context | batch | prefill tok/s ours | llama.cpp | ratio | decode tok/s ours | llama.cpp | ratio | ms/step ours | llama.cpp |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        o, t = r["vericache"], r["llama_cpp"]
        lines.append(f"| {r['file']} | {o['compute']} | {o.get('kv_cache', 'float32')} | {r['context']} | {r['batch']} | {o['prefill_tok_s']:.1f} | {t['prefill_tok_s']:.1f} | "
                     f"{o['prefill_tok_s'] / t['prefill_tok_s']:.2f}x | {o['decode_tok_s']:.1f} | {t['decode_tok_s']:.1f} | "
                     f"{o['decode_tok_s'] / t['decode_tok_s']:.2f}x | {o['ms_per_step']:.1f} | {t['ms_per_step']:.1f} |")
    write_atomically(args.out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
