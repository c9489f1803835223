#!/usr/bin/env python3
"""Reference KV-cache importance scores from NVIDIA's `kvpress` 0.5.5 on SmolLM2-135M-Instruct.

For each press in {snapkv, expected_attention, kvzip} and each prompt in {doc (~600 tokens), long
(~1500 tokens)} this runs the real kvpress press on Hugging Face `transformers` loading the same GGUF
(.models/SmolLM2-135M-Instruct.Q4_1.gguf, dequantized to float32, CPU) and writes the press's scores
BEFORE its top-k selection:

  tests/fixtures/reference/kvpress/<press>_<prompt>.f32   float32 little-endian, C order,
                                                           shape [n_layers=30, n_kv_heads=3, n_tokens]
  tests/fixtures/reference/kvpress/index.json              one entry per file: press, prompt, token ids,
                                                           n_tokens, exact press parameters, forced
                                                           positions, KVzip replay ids, versions, model sha256

plus one extra entry, kvzip_long_chunk512, the same KVzip run with chunk_size=512 so the multi-chunk
replay path ("Repeat the part of the previous context exactly, starting with" + last 8 ids of the
previous chunk) is covered too (the default chunk_size=2048 gives one chunk for both prompts).

How the scores are captured (no kvpress code is modified):
  snapkv, expected_attention  ScorerPress subclasses: the press instance's `score` method is wrapped;
                              the wrapper records the (1, H_kv, n) tensor it returns for each layer
                              (kvpress then takes topk of exactly that tensor).  Prefill runs the way
                              KVPressTextGenerationPipeline._forward does:
                              `with press(model): model.model(input_ids=context_ids, past_key_values=DynamicCache())`.
  kvzip                       KVzipPress.__call__ runs its replay passes after the prefill; the press
                              instance's `compress_post` is wrapped and `score_val` ([L, 1, H_kv, n]) is
                              copied before and after compress_post sets the sinks to max+1; the fixture
                              holds the "after" tensor (exactly what kvpress ranks globally).
                              `prepare` is wrapped to record the replay ids.

Prompts: the model input is what kvpress's pipeline preprocess() prefills for context=<text>: the chat
template applied to [{"role": "user", "content": text + separator}] with add_generation_prompt=True,
cut at the separator, i.e. chatml(text) of make_fixtures.py WITHOUT its "<|im_end|>\n<|im_start|>assistant\n"
tail (kvpress puts that tail in front of the question, which is never prefilled with the press).
Texts are English prose from datasets/tokenizer_corpus/corpus.txt, each paragraph reflowed to one line
(" ".join(paragraph.split())), paragraphs joined by "\n\n":
  doc   GPL-3 Preamble paragraphs, until the text reaches >= 600 tokens
  long  Apache-2.0 from "1. Definitions." on, until the text reaches >= 1500 tokens
Tokenization always uses make_fixtures.hf_tokenizer (transformers' own GGUF tokenizer conversion drops
SmolLM2's digit splitting); KVzipPress calls AutoTokenizer.from_pretrained(model.config.name_or_path),
which is redirected to a PreTrainedTokenizerFast wrapping that same tokenizer with the GGUF chat template.

Setup (separate venv: kvpress 0.5.5 needs transformers>=4.56,<5.3; the project venv has 5.24):
  python3 -m venv /work/kvpress-venv
  /work/kvpress-venv/bin/pip install --upgrade pip
  /work/kvpress-venv/bin/pip install torch==2.11.0
  /work/kvpress-venv/bin/pip install kvpress==0.5.5 transformers==5.2.0 gguf==0.19.0 tokenizers numpy
Run from the repository root (CPU, about 2 minutes on 2 cores; output is bit-reproducible):
  /work/kvpress-venv/bin/python tests/reference/kvpress_fixtures.py
"""
import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import platform
import sys
import time

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import CORPUS, MODELS, ROOT, SMOLLM, hf_tokenizer, sha256  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "reference", "kvpress")
COMPRESSION_RATIO = 0.75
KEPT_FRACTION = 0.25


# ---------------------------------------------------------------------------------------------
# prompts

def paragraphs(lines):
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line)
        elif cur:
            paras.append(" ".join(" ".join(cur).split()))
            cur = []
    if cur:
        paras.append(" ".join(" ".join(cur).split()))
    return paras


def take_tokens(tk, paras, target):
    out = []
    for p in paras:
        out.append(p)
        text = "\n\n".join(out)
        if len(tk.encode(text, add_special_tokens=False).ids) >= target:
            return text
    raise SystemExit(f"not enough text for {target} tokens")


def prompt_texts(tk):
    lines = open(CORPUS, encoding="utf-8", newline="").read().split("\n")
    gpl = lines.index(next(l for l in lines if l.strip() == "Preamble"))
    gpl_end = lines.index(next(l for l in lines[gpl:] if l.strip() == "TERMS AND CONDITIONS"), gpl)
    apache = lines.index(next(l for l in lines if l.strip() == "Apache License"))
    defs = lines.index(next(l for l in lines[apache:] if l.strip() == "1. Definitions."), apache)
    return {"doc": take_tokens(tk, paragraphs(lines[gpl + 1:gpl_end]), 600),
            "long": take_tokens(tk, paragraphs(lines[defs:]), 1500)}


# ---------------------------------------------------------------------------------------------
# tokenizer shim for kvpress

def chat_template():
    import gguf
    return gguf.GGUFReader(SMOLLM).fields["tokenizer.chat_template"].contents()


def hf_fast_tokenizer():
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(SMOLLM), bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", unk_token="<|endoftext|>", pad_token="<|im_end|>")
    tok.chat_template = chat_template()
    return tok


def pipeline_context(tok, text):
    """kvpress.pipeline.KVPressTextGenerationPipeline.preprocess, context part (question unused)."""
    separator = "#" * (len(text) + 10)
    templ = tok.apply_chat_template([{"role": "user", "content": text + separator}], add_generation_prompt=True,
                                    tokenize=False, enable_thinking=False)
    context, question_suffix = templ.split(separator)
    return context, question_suffix


# ---------------------------------------------------------------------------------------------
# runs

def run_scorer(model, press, ids):
    import torch
    from transformers import DynamicCache
    captured = {}
    orig = press.score

    def score(module, *args, **kwargs):
        s = orig(module, *args, **kwargs)
        captured[int(module.layer_idx)] = s.detach().to(torch.float32).cpu().clone()
        return s

    press.score = score
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    del press.score
    n_layers = model.config.num_hidden_layers
    assert sorted(captured) == list(range(n_layers)), sorted(captured)
    scores = torch.stack([captured[i][0] for i in range(n_layers)]).numpy()
    kept = [int(cache.layers[i].keys.shape[2]) for i in range(n_layers)]
    return scores, {"cache_len_after_compression_per_layer": kept}


def run_kvzip(model, press, ids):
    import torch
    from transformers import DynamicCache
    rec = {}
    orig_post, orig_prepare = press.compress_post, press.prepare

    def prepare(model_, tokenizer_, *a, **k):
        pairs = orig_prepare(model_, tokenizer_, *a, **k)
        rec["prefix_length"] = int(press.prefix_length)
        rec["context_length"] = int(press.context_length)
        rec["suffix_ids"] = press._suffix_ids[0].tolist()
        chunks, start = [], press.prefix_length
        for chunk_ids, repeat_ids in pairs:
            chunk_ids, repeat_ids = chunk_ids[0].tolist(), repeat_ids[0].tolist()
            q = repeat_ids[:len(repeat_ids) - len(chunk_ids) - len(rec["suffix_ids"])]
            assert repeat_ids == q + rec["suffix_ids"] + chunk_ids
            chunks.append({"start_idx": start, "end_idx": start + len(chunk_ids),
                           "repeat_prompt_ids": q, "replay_input_ids": repeat_ids,
                           "replay_positions": [press.context_length, press.context_length + len(repeat_ids)]})
            start += len(chunk_ids)
        rec["chunks"] = chunks
        return pairs

    def compress_post(model_):
        rec["raw"] = press.score_val.detach().to(torch.float32).cpu().clone()
        out = orig_post(model_)
        rec["final"] = press.score_val.detach().to(torch.float32).cpu().clone()
        return out

    orig_hook = press.forward_hook
    seen_positions = []

    def forward_hook(module, input_, kwargs, output):
        if int(module.layer_idx) == 0:
            cp = kwargs["cache_position"]
            seen_positions.append([int(cp[0]), int(cp[-1]) + 1])
        return orig_hook(module, input_, kwargs, output)

    press.prepare, press.compress_post, press.forward_hook = prepare, compress_post, forward_hook
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
    del press.prepare, press.compress_post, press.forward_hook
    assert seen_positions == [c["replay_positions"] for c in rec["chunks"]], seen_positions
    n_layers = model.config.num_hidden_layers
    pruned = []
    for layer in model.model.layers:
        mki = getattr(layer.self_attn, "masked_key_indices", None)
        pruned.append(int(mki[0].numel()) if mki is not None else 0)
        layer.self_attn.masked_key_indices = None  # don't leak into the next run
    raw, final = rec.pop("raw")[:, 0].numpy(), rec.pop("final")[:, 0].numpy()
    forced = np.nonzero((raw != final).any(axis=(0, 1)))[0].tolist()
    rec["positions_changed_by_compress_post"] = forced
    rec["raw_scores_at_changed_positions_all_zero"] = bool((raw[..., forced] == 0).all()) if forced else None
    never = [p for p in range(raw.shape[-1]) if (raw[..., p] == 0).all()]
    rec["positions_never_scored_raw_zero"] = never
    rec["pruned_per_layer_total_over_heads"] = pruned
    rec["n_pruned_total"] = int(sum(pruned))
    assert final.shape == (n_layers, model.config.num_key_value_heads, len(ids))
    return final, rec


def sanity(name, scores, forced):
    n_layers, n_heads, n = scores.shape
    assert np.isfinite(scores).all(), f"{name}: non-finite scores"
    k = int(n * KEPT_FRACTION)
    free = np.ones(n, bool)
    free[forced] = False
    print(f"== {name}: shape {scores.shape}, forced positions {len(forced)}, k={k} per head", file=sys.stderr)
    for l in range(n_layers):
        s = scores[l]
        sf = s[:, free]
        assert np.ptp(sf) > 0, f"{name} layer {l}: all non-forced scores equal"
        top = np.argsort(-s, axis=-1, kind="stable")[:, :k]
        tail = [(top[h] >= n - n // 4).mean() for h in range(n_heads)]
        frc = [np.isin(top[h], forced).mean() for h in range(n_heads)]
        sets = [set(top[h].tolist()) for h in range(n_heads)]
        jac = np.mean([len(sets[a] & sets[b]) / len(sets[a] | sets[b])
                       for a in range(n_heads) for b in range(a + 1, n_heads)])
        print(f"  L{l:02d} top25%: in-last-quarter {' '.join(f'{x:.2f}' for x in tail)}  forced "
              f"{' '.join(f'{x:.2f}' for x in frc)}  head-jaccard {jac:.2f} | free min {sf.min():.3e} "
              f"max {sf.max():.3e} mean {sf.mean():.3e} std {sf.std():.3e} distinct {len(np.unique(sf))}",
              file=sys.stderr)


def main():
    import torch
    import kvpress
    import kvpress.presses.kvzip_press as kvzip_mod
    from kvpress import ExpectedAttentionPress, KVzipPress, SnapKVPress
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    tk = hf_tokenizer(SMOLLM)
    tok = hf_fast_tokenizer()

    class _AutoTokenizerShim:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return tok

    kvzip_mod.AutoTokenizer = _AutoTokenizerShim

    texts = prompt_texts(tk)
    prompts = {}
    for name, text in texts.items():
        context, question_suffix = pipeline_context(tok, text)
        from make_fixtures import chatml
        assert chatml(text) == context + question_suffix, "GGUF chat template != chatml()"
        ids = tk.encode(context, add_special_tokens=False).ids
        assert tok.encode(context, add_special_tokens=False) == ids
        prompts[name] = {"text": text, "context": context, "ids": ids,
                         "text_tokens": len(tk.encode(text, add_special_tokens=False).ids)}
        print(f"prompt {name}: {len(ids)} tokens ({prompts[name]['text_tokens']} text)", file=sys.stderr)

    model = AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=os.path.basename(SMOLLM), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, model.model.layers[0].self_attn.head_dim) \
        == (30, 9, 3, 64)

    runs = [("snapkv", lambda: SnapKVPress(compression_ratio=COMPRESSION_RATIO), ["doc", "long"]),
            ("expected_attention", lambda: ExpectedAttentionPress(compression_ratio=COMPRESSION_RATIO), ["doc", "long"]),
            ("kvzip", lambda: KVzipPress(compression_ratio=COMPRESSION_RATIO), ["doc", "long"]),
            ("kvzip_chunk512", lambda: KVzipPress(compression_ratio=COMPRESSION_RATIO, chunk_size=512), ["long"])]

    os.makedirs(OUT, exist_ok=True)
    entries = []
    for press_name, make, names in runs:
        for pname in names:
            ids = prompts[pname]["ids"]
            n = len(ids)
            press = make()
            params = {k: getattr(press, k) for k in press.__dataclass_fields__}
            t0 = time.time()
            entry = {"press": press_name, "kvpress_class": type(press).__name__, "prompt": pname,
                     "n_tokens": n, "token_ids": ids, "params": params,
                     "attn_implementation": model.config._attn_implementation}
            if press_name in ("snapkv", "expected_attention"):
                scores, extra = run_scorer(model, press, ids)
                if press_name == "snapkv":
                    forced = list(range(n - press.window_size, n))
                    entry["forced_positions"] = {"positions": [n - press.window_size, n],
                                                 "rule": "last window_size positions: score = max over ALL (layer's) "
                                                         "pooled+group-averaged scores (all kv heads) + 1"}
                else:
                    forced = list(range(press.n_sink))
                    entry["forced_positions"] = {"positions": [0, press.n_sink],
                                                 "rule": "first n_sink positions: score = max over ALL (layer's) "
                                                         "vnorm-scaled scores (all kv heads) + 1"}
                entry.update(extra)
                entry["n_kept_per_head"] = max(1, int(n * (1 - COMPRESSION_RATIO)))
                fv = scores[:, :, forced]
                assert np.allclose(fv, fv[:, :, :1]), "forced positions not constant per layer"
                entry["forced_value_per_layer"] = [float(v) for v in fv[:, 0, 0]]
            else:
                scores, extra = run_kvzip(model, press, ids)
                forced = extra["positions_changed_by_compress_post"]
                entry["kvzip"] = extra
                entry["forced_positions"] = {"positions": [0, press.n_sink],
                                             "rule": "compress_post: score_val[..., :n_sink] = score_val.amax() + 1 "
                                                     "(global max over all layers/heads/positions); positions in "
                                                     "[n_sink, prefix_length) keep score 0 (never scored)"}
                assert forced == list(range(press.n_sink)), forced
            sanity(f"{press_name}/{pname}", scores, forced)
            fname = f"{press_name}_{pname}.f32"
            scores.astype("<f4").tofile(os.path.join(OUT, fname))
            entry["file"] = fname
            entry["shape"] = list(scores.shape)
            entries.append(entry)
            print(f"{press_name}/{pname}: {time.time() - t0:.1f}s", file=sys.stderr)

    index = {
        "tool": "kvpress presses run on transformers AutoModelForCausalLM.from_pretrained(gguf_file=..., "
                "dtype=float32, attn_implementation='sdpa'), CPU; scores captured before top-k",
        "layout": "float32 little-endian, C order [n_layers, n_kv_heads, n_tokens]",
        "model": os.path.relpath(SMOLLM, ROOT), "model_sha256": sha256(SMOLLM),
        "versions": {"python": platform.python_version(),
                     **{p: md.version(p) for p in ("kvpress", "transformers", "torch", "gguf", "tokenizers", "numpy")}},
        "compression_ratio": COMPRESSION_RATIO,
        "prompt_texts": {k: {"text": v["text"], "model_input": v["context"], "text_tokens": v["text_tokens"]}
                         for k, v in prompts.items()},
        "prompt_construction": "model input = chat template up to the end of the user text (kvpress pipeline "
                               "preprocess context part): chatml(text) minus '<|im_end|>\\n<|im_start|>assistant\\n'",
        "entries": entries,
    }
    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    total = sum(os.path.getsize(os.path.join(OUT, e["file"])) for e in entries)
    print(f"kvpress fixtures written to {OUT} ({total / 1e6:.2f} MB of scores)", file=sys.stderr)


if __name__ == "__main__":
    main()
