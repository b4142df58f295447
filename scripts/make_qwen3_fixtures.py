#!/usr/bin/env python3
"""Make a tiny Qwen3 (dense) model as a Hugging Face directory and as GGUF files, with the logits
transformers computes for them, as C++ test fixtures.

What it makes
-------------
tests/fixtures/hf/qwen3_f32/: Qwen3ForCausalLM from a config with random weights (fixed seed),
saved by save_pretrained (config.json, generation_config.json, model.safetensors, float32),
with a tokenizer and expected.json:

  tokenizer.json         Qwen3's own tokenizer (../shared/testdata/tokenizers/qwen3.tokenizer.json:
                         NFC, the Qwen regex split, byte-level BPE) cut down to its 256 byte
                         tokens and first MERGES merges (merge i makes token 256 + i, so the cut
                         vocabulary is ids 0 .. 255 + MERGES), then its 26 added tokens renumbered
                         after them: 320 tokens, the model's vocab_size.
  tokenizer_config.json  Qwen3's, with the added tokens' new ids and its chat template.
  expected.json          make_hf_fixtures.py's schema (every position's float32 logits for 3
                         prompts, a greedy continuation) plus
                           "tokenizer": [{"id", "text", "ids", "decoded"}] transformers' encode
                               (no special tokens) and decode of the shared reference texts,
                           "chat": [{"messages", "add_generation_prompt", "extra", "rendered",
                               "ids"}] apply_chat_template's renders (extra: enable_thinking).

Geometry: hidden_size 32, 4 attention heads of head_dim 16 (not 32 / 4 = 8: the config's head_dim
is what counts), 2 KV heads (GQA), intermediate_size 64, 2 layers, tied embeddings, rope_theta
1e6, rms_norm_eps 1e-6, max_position_embeddings 512. The q/k norms get weights 1 + 0.3 N(0, 1) so
that a norm left out, or put after RoPE instead of before, moves the logits far beyond tolerance;
the other matrices std 0.5 (make_hf_fixtures.py's 0.2 makes this model's greedy output repeat one
token). expected.json has 24 greedy tokens.

tests/fixtures/gguf/qwen3/: the same model as GGUF files written with gguf-py, as llama.cpp's
converter lays out a qwen3 model (general.architecture "qwen3", qwen3.* keys including
attention.key_length for the head_dim, blk.N.attn_q_norm / attn_k_norm, q/k rows in Hugging Face
order since Qwen rotates halves, the tokenizer as tokenizer.ggml.* with pre "qwen2" and the
chat template):

  qwen3_f32.gguf    every tensor float32: the HF directory's weights exactly
  qwen3_q8_0.gguf   matrices Q8_0 (gguf-py's quantizer), norms float32
  expected.json     {"gguf_version", "f32_max_abs_diff", "q8_0": {"cases", "greedy_prompt",
                    "greedy_tokens"}, "transformers_gguf_tokenizer_ids_equal": true}

The oracle for the GGUF files is transformers reading them (gguf_file=..., dequantizing with
gguf-py) with the HF directory's config passed in: transformers' GGUF reader does not map
qwen3.attention.key_length to head_dim (it would take Qwen3Config's default, 128). The f32 file
must give the HF directory's logits (checked here: f32_max_abs_diff at most 1e-5; the weights
read back are bit for bit the directory's, and the two loads differ only in float32 rounding), so
the C++ tests hold it to hf/qwen3_f32/expected.json; the Q8_0 file's dequantized logits are
"q8_0". The output is deterministic: rerunning the script rewrites byte-identical files.

How to run
----------
Qwen3 needs transformers >= 4.51 (and a later one for qwen3 GGUF files: 4.51.3's GGUF reader
lacks it, 4.57.1's has it), which needs torch >= 2.1 (Debian 12's python3-torch is 1.13); and
transformers reads GGUF files only with accelerate installed:
  python3 -m venv /root/qwen3env
  /root/qwen3env/bin/pip install "torch==2.5.1" "transformers==4.57.1" "numpy<2" safetensors \\
      "gguf==0.17.1" "accelerate==1.10.1" jinja2
  /root/qwen3env/bin/python scripts/make_qwen3_fixtures.py

Versions used for the committed fixtures: torch 2.5.1, transformers 4.57.1, tokenizers 0.22.2,
safetensors 0.8.0, gguf 0.17.1, accelerate 1.10.1, numpy 1.26.4, jinja2 3.1.6, Python 3.11.2.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import full_logits, greedy, prompts, round6, write_expected  # noqa: E402

import gguf  # noqa: E402  (after make_hf_fixtures: both need numpy)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_OUT = os.path.join(ROOT, "tests", "fixtures", "hf", "qwen3_f32")
GGUF_OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "qwen3")
SHARED_TOK = os.path.join(os.path.dirname(ROOT), "shared", "testdata", "tokenizers")

MERGES = 38  # 256 bytes + 38 merges + 26 added tokens = 320
SEED = 1007
GREEDY_NEW_TOKENS = 24

CHATS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True, {}),
    ([{"role": "user", "content": "What is the capital of France?"}], True,
     {"enable_thinking": False}),
    ([{"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "Name three colours."},
      {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nRed, green, blue."},
      {"role": "user", "content": "And two more?"}], True, {}),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], False, {}),
]


def make_tokenizer(out):
    """Qwen3's tokenizer cut to MERGES merges; returns (vocab size, {special name: id})."""
    with open(os.path.join(SHARED_TOK, "qwen3.tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(SHARED_TOK, "qwen3.tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    model = tok["model"]
    keep = 256 + MERGES
    for i, (a, b) in enumerate(model["merges"][:MERGES]):
        assert model["vocab"][a + b] == 256 + i, (i, a, b)
    model["vocab"] = {s: i for s, i in model["vocab"].items() if i < keep}
    model["merges"] = model["merges"][:MERGES]
    assert sorted(model["vocab"].values()) == list(range(keep))
    renumber = {}
    for j, t in enumerate(sorted(tok["added_tokens"], key=lambda t: t["id"])):
        renumber[str(t["id"])] = keep + j
        t["id"] = keep + j
    config["added_tokens_decoder"] = {
        str(renumber[k]): v for k, v in config["added_tokens_decoder"].items()}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    return keep + len(tok["added_tokens"]), ids


def make_config(vocab_size, special):
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=2,
        attention_bias=False,
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
    )


def randomize_(model, seed, router_std=None):
    """Weights larger than transformers' std-0.02 init (nearly flat logits), deterministic; with
    router_std, a mixture's router (*.gate.weight) gets that std (distinct expert choices)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                v = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("norm.weight"):
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif router_std is not None and name.endswith(".gate.weight"):
                v = router_std * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(p.shape, generator=g)
            else:  # not make_hf_fixtures' 0.2, where this model's greedy output repeats one token
                v = 0.5 * torch.randn(p.shape, generator=g)

            p.copy_(v)


def load(path, config, gguf_file=None):
    kwargs = dict(torch_dtype=torch.float32, attn_implementation="eager")
    if gguf_file is not None:
        kwargs.update(gguf_file=gguf_file, config=config)
    model = Qwen3ForCausalLM.from_pretrained(path, **kwargs)
    return model.eval()


def logits_doc(model, cases, greedy_prompt, new_tokens):
    """make_hf_fixtures' logits and greedy tokens; and the smallest top-1/top-2 logit gap."""
    doc = {"cases": [], "greedy_prompt": greedy_prompt,
           "greedy_tokens": greedy(model, greedy_prompt, new_tokens)}
    min_gap = float("inf")
    for ids in cases:
        logits = full_logits(model, ids)
        top2 = logits.topk(2, dim=-1).values
        min_gap = min(min_gap, (top2[:, 0] - top2[:, 1]).min().item())
        doc["cases"].append(dict(input_ids=ids,
                                 logits=[[round6(v) for v in row] for row in logits.tolist()]))
    # Greedy along the continuation: the top-1/top-2 gap at every step, far above float32 noise.
    ids = list(greedy_prompt)
    for t in doc["greedy_tokens"]:
        row = full_logits(model, ids)[-1]
        top2 = row.topk(2).values
        min_gap = min(min_gap, (top2[0] - top2[1]).item())
        assert int(row.argmax()) == t
        ids.append(t)
    return doc, min_gap


def tokenizer_cases(tok):
    with open(os.path.join(SHARED_TOK, "qwen3.vectors.json"), encoding="utf-8") as f:
        vectors = json.load(f)
    out = []
    for v in vectors:
        ids = tok.encode(v["text"], add_special_tokens=False)
        out.append({"id": v["id"], "text": v["text"], "ids": ids,
                    "decoded": tok.decode(ids, clean_up_tokenization_spaces=False)})
    return out


def chat_cases(tok):
    out = []
    for messages, add_generation_prompt, extra in CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=add_generation_prompt, **extra)
        out.append({"messages": messages, "add_generation_prompt": add_generation_prompt,
                    "extra": extra, "rendered": rendered,
                    "ids": tok.encode(rendered, add_special_tokens=False)})
    return out


# Hugging Face tensor names -> GGUF (llama.cpp's names for qwen3).
def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module>.<name>.weight
    n, rest = parts[2], ".".join(parts[3:])
    table = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{n}.{table[rest]}"


def add_qwen_tokenizer(w, tok, config):
    """The cut-down tokenizer.json `tok` as llama.cpp's converter writes a Qwen one (gpt2 model,
    qwen2 pre-tokenizer), with the config's BOS and EOS ids."""
    added = {t["id"]: t for t in tok["added_tokens"]}
    tokens = [None] * config.vocab_size
    for s, i in tok["model"]["vocab"].items():
        tokens[i] = s
    types = [gguf.TokenType.NORMAL] * config.vocab_size
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    assert all(t is not None for t in tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in tok["model"]["merges"]])
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)


def read_tokenizer_files(tok_dir):
    """(tokenizer.json, tokenizer_config.json or None) of an HF directory, as dicts."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    config_path = os.path.join(tok_dir, "tokenizer_config.json")
    if not os.path.exists(config_path):
        return tok, None
    with open(config_path, encoding="utf-8") as f:
        return tok, json.load(f)


def gguf_writer(path, arch, name, config, head_dim=True):
    """A GGUFWriter for `arch` with the shape metadata llama.cpp's converter writes first: context,
    widths, layers, heads, and (with head_dim) the config's head size as key and value length."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    if head_dim:
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    return w


def close_gguf(w):
    """Writes the header, metadata and tensors added to `w`, and closes the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path, config, state, tok_dir, qtype):
    tok, tok_config = read_tokenizer_files(tok_dir)
    w = gguf_writer(path, "qwen3", "tandem-qwen3-fixture", config)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == gguf.GGMLQuantizationType.F32
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_qwen_tokenizer(w, tok, config)
    w.add_pad_token_id(config.bos_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tok_config["chat_template"])
    for name, t in state.items():
        data = t.detach().to(torch.float32).numpy()
        if qtype != gguf.GGMLQuantizationType.F32 and data.ndim == 2:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), data)
    close_gguf(w)


def main():
    torch.set_num_threads(1)
    for d in (HF_OUT, GGUF_OUT):
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)

    vocab_size, special = make_tokenizer(HF_OUT)
    config = make_config(vocab_size, special)
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).eval()
    randomize_(model, SEED)
    model.save_pretrained(HF_OUT, safe_serialization=True)
    state = {k: v for k, v in model.state_dict().items()
             if not (config.tie_word_embeddings and k == "lm_head.weight")}
    del model
    for f in os.listdir(HF_OUT):
        os.chmod(os.path.join(HF_OUT, f), 0o644)

    tok = AutoTokenizer.from_pretrained(HF_OUT)
    assert len(tok) == vocab_size, (len(tok), vocab_size)
    ref = load(HF_OUT, config)
    cases, greedy_prompt = prompts(vocab_size, SEED)
    doc, min_gap = logits_doc(ref, cases, greedy_prompt, GREEDY_NEW_TOKENS)
    doc.update(name="qwen3_f32", architecture="Qwen3ForCausalLM",
               transformers_version=transformers.__version__, torch_version=torch.__version__,
               dtype="float32", compute_dtype="float32",
               tokenizer=tokenizer_cases(tok), chat=chat_cases(tok))
    write_expected(os.path.join(HF_OUT, "expected.json"), doc)
    print(f"qwen3_f32: greedy {doc['greedy_tokens']}, smallest top-1/top-2 gap {min_gap:.4f}")

    # GGUF files of the same weights, and transformers reading them back.
    f32_path = os.path.join(GGUF_OUT, "qwen3_f32.gguf")
    q8_path = os.path.join(GGUF_OUT, "qwen3_q8_0.gguf")
    write_gguf(f32_path, config, state, HF_OUT, gguf.GGMLQuantizationType.F32)
    write_gguf(q8_path, config, state, HF_OUT, gguf.GGMLQuantizationType.Q8_0)
    from_f32 = load(GGUF_OUT, config, "qwen3_f32.gguf")
    diff = 0.0
    for ids in cases:
        diff = max(diff, (full_logits(from_f32, ids) - full_logits(ref, ids)).abs().max().item())
    assert diff <= 1e-5, diff
    q8_doc, q8_gap = logits_doc(load(GGUF_OUT, config, "qwen3_q8_0.gguf"), cases, greedy_prompt,
                                GREEDY_NEW_TOKENS)
    # transformers' tokenizer built from the GGUF metadata gives the tokenizer.json's ids.
    gguf_tok = AutoTokenizer.from_pretrained(GGUF_OUT, gguf_file="qwen3_f32.gguf")
    same_ids = all(gguf_tok.encode(c["text"], add_special_tokens=False) == c["ids"]
                   for c in doc["tokenizer"])
    gguf_doc = {"gguf_version": _gguf_version(),
                "f32_max_abs_diff": diff, "transformers_gguf_tokenizer_ids_equal": same_ids,
                "q8_0": q8_doc}
    with open(os.path.join(GGUF_OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(gguf_doc, f, separators=(",", ":"))
        f.write("\n")
    for f in os.listdir(GGUF_OUT):
        os.chmod(os.path.join(GGUF_OUT, f), 0o644)
    print(f"gguf: f32 max |diff| {diff:.2e}; q8_0 greedy {q8_doc['greedy_tokens']}, smallest gap "
          f"{q8_gap:.4f}; transformers' GGUF tokenizer same ids: {same_ids}")
    total = 0
    for d in (HF_OUT, GGUF_OUT):
        for f in sorted(os.listdir(d)):
            size = os.path.getsize(os.path.join(d, f))
            total += size
            print(f"  {os.path.relpath(os.path.join(d, f), ROOT)}: {size / 1024:.0f} KiB")
    print(f"total {total / 1024:.0f} KiB")


def _gguf_version():
    from importlib.metadata import version
    return version("gguf")


if __name__ == "__main__":
    sys.exit(main())
