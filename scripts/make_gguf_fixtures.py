#!/usr/bin/env python3
"""Make the GGUF test fixtures from transformers' own reading of a GGUF file.

What it makes
-------------
tests/fixtures/gguf/dequantize.json: for every quantized ggml type Tandem reads, 3 blocks of
random bytes (float16 scales set to finite values) and gguf-py's dequantization of them, the
reference for the block layouts of kernels/quant.cc:
  {"gguf_version", "types": {"Q4_K": {"hex": "...", "values": [floats]}, ...}}

tests/fixtures/gguf/smollm2/expected.json, from SmolLM2-135M-Instruct.Q4_1.gguf (the default
chat model, fetched by scripts/fetch_model.sh --smollm2). transformers loads the GGUF, dequantizes
every tensor to float32 with gguf-py, and builds its own model and tokenizer from the metadata;
that is the oracle for Tandem loading the same file with --dtype f32.

expected.json schema:
  {"gguf_sha256", "transformers_version", "torch_version", "gguf_version",
   "tokenizer": [{"id", "text", "ids", "decoded", "transformers_ids"}],
       ids: what a tokenizer that follows the file's metadata produces. The file names the
            "smollm" pre-tokenizer, which (as in llama.cpp and SmolLM2's own tokenizer.json)
            splits digits one by one before the GPT-2 byte-level split. transformers' GGUF
            converter leaves that digit split out; transformers_ids is what it gives, and
            differs from ids exactly on texts with runs of digits.
       decoded: transformers' decode(ids).
   "chat": [{"messages", "add_generation_prompt", "rendered"}]   apply_chat_template output,
   "cases": [{"name", "input_ids", "positions": [{"position", "max_abs", "top": [[id, logit]],
              "slice_start", "slice": [logits]}], "greedy": [16 ints]}],
       the logits of the float32 model at chosen positions (its top 16 entries and a slice of
       64), and a 16-token greedy continuation (argmax, EOS not stopping it).
   "passage": {"input_ids", "nll_mean"}   tests/fixtures/gguf/passage.txt tokenized, and the
       float32 model's mean negative log-likelihood over it (teacher-forced).
  Logits are rounded to 6 significant digits. Batch 1, no padding, attn_implementation eager.

How to run
----------
  python3 -m venv --system-site-packages /root/hfenv      # over Debian's python3-torch
  /root/hfenv/bin/pip install "transformers==4.47.1" "numpy<2" gguf sentencepiece jinja2
  /root/hfenv/bin/python scripts/make_gguf_fixtures.py "$(bash scripts/fetch_model.sh --smollm2)"

Do not install accelerate into that environment (with torch 1.13 on Python 3.11 it breaks the
import of transformers). The greedy loop is written out rather than model.generate() for the
same reason.
"""

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "smollm2", "expected.json")
DEQUANT_OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "dequantize.json")

# Where each block keeps its float16 scales (byte offsets), so that random blocks get finite ones.
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
SHARED_VECTORS = os.path.join(os.path.dirname(ROOT), "shared", "testdata", "tokenizers",
                              "qwen3.vectors.json")

EXTRA_TEXTS = [
    ("digits_plain", "1234567890"),
    ("digits_in_text", "In 1969, 3 astronauts flew 384400 km."),
    ("chatml_markers", "<|im_start|>user\nHi<|im_end|>"),
    ("special_inside", "a<|endoftext|>b"),
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green, blue."},
     {"role": "user", "content": "And two more?"}],
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def round6(x):
    return float(f"{x:.6g}")


def load(gguf_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    d, name = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(d, gguf_file=name)
    config._attn_implementation = "eager"
    state = load_gguf_checkpoint(gguf_path, return_tensors=True)["tensors"]
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float32) for k, v in state.items()}, strict=False)
    model.tie_weights()
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        sys.exit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    return model, tok


def metadata_tokenizer(tok):
    """transformers' GGUF tokenizer with the digit split the file's "smollm" pre-tokenizer names."""
    import copy
    from tokenizers import pre_tokenizers
    backend = copy.deepcopy(tok.backend_tokenizer)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer])
    return backend


def tokenizer_vectors(tok):
    texts = []
    if os.path.exists(SHARED_VECTORS):
        for v in json.load(open(SHARED_VECTORS, encoding="utf-8")):
            texts.append((v["id"], v["text"]))
    texts += EXTRA_TEXTS
    backend = metadata_tokenizer(tok)
    out = []
    for vid, text in texts:
        ids = backend.encode(text, add_special_tokens=False).ids
        out.append({"id": vid, "text": text, "ids": ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False),
                    "transformers_ids": tok.encode(text, add_special_tokens=False)})
    return out


def logits_of(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float64)


def greedy(model, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(logits_of(model, ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


def case(model, name, ids):
    logits = logits_of(model, ids)
    positions = []
    for p in sorted({0, len(ids) // 2, len(ids) - 1}):
        row = logits[p]
        top = row.topk(16)
        start = int(top.indices[0]) // 64 * 64
        positions.append({
            "position": p,
            "max_abs": round6(float(row.abs().max())),
            "top": [[int(i), round6(float(v))] for v, i in zip(top.values, top.indices)],
            "slice_start": start,
            "slice": [round6(float(v)) for v in row[start:start + 64]],
        })
    return {"name": name, "input_ids": list(ids), "positions": positions,
            "greedy": greedy(model, ids, 16)}


def dequantize_vectors():
    import gguf
    import numpy as np
    from gguf import quants
    rng = np.random.default_rng(29)
    out = {"gguf_version": getattr(gguf, "__version__", "unknown"), "types": {}}
    for name, fields in F16_FIELDS.items():
        qtype = getattr(gguf.GGMLQuantizationType, name)
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = bytearray(rng.integers(0, 256, 3 * block_bytes, dtype=np.uint8).tobytes())
        for b in range(3):
            for off in fields:
                scale = np.float16(rng.uniform(0.001, 0.05) * (1 if off == fields[0] else -3))
                raw[b * block_bytes + off:b * block_bytes + off + 2] = scale.tobytes()
        values = quants.dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), qtype)
        assert values.size == 3 * block_elems
        out["types"][name] = {"hex": bytes(raw).hex(),
                              "values": [float(np.float32(v)) for v in values.reshape(-1)]}
    with open(DEQUANT_OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {DEQUANT_OUT}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", nargs="?", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--dequantize-only", action="store_true",
                    help="write only dequantize.json (needs gguf and numpy, no model)")
    args = ap.parse_args()

    dequantize_vectors()
    if args.dequantize_only:
        return
    if not args.gguf:
        ap.error("the GGUF file is required")
    import gguf
    import torch
    import transformers

    model, tok = load(args.gguf)
    chats = []
    for messages in CHATS:
        chats.append({"messages": messages, "add_generation_prompt": True,
                      "rendered": tok.apply_chat_template(messages, tokenize=False,
                                                          add_generation_prompt=True)})
    backend = metadata_tokenizer(tok)
    plain = backend.encode("The capital of France is", add_special_tokens=False).ids
    chat = backend.encode(chats[0]["rendered"], add_special_tokens=False).ids
    passage_text = open(os.path.join(ROOT, "tests", "fixtures", "gguf", "passage.txt"),
                        encoding="utf-8").read()
    passage = backend.encode(passage_text, add_special_tokens=False).ids
    logits = logits_of(model, passage)
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(passage[1:]))

    expected = {
        "gguf_sha256": sha256(args.gguf),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gguf_version": getattr(gguf, "__version__", "unknown"),
        "tokenizer": tokenizer_vectors(tok),
        "chat": chats,
        "cases": [case(model, "plain", plain), case(model, "chat", chat)],
        "passage": {"input_ids": passage, "nll_mean": round6(float(nll))},
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    differ = sum(v["ids"] != v["transformers_ids"] for v in expected["tokenizer"])
    print(f"wrote {OUT}: {len(expected['tokenizer'])} tokenizer vectors ({differ} differ from "
          f"transformers' GGUF tokenizer by the digit split), passage {len(passage)} tokens, "
          f"nll {float(nll):.4f}")
    for c in expected["cases"]:
        print(c["name"], tok.decode(c["greedy"]))


if __name__ == "__main__":
    main()
