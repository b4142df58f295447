#!/usr/bin/env python3
"""Make tiny mixture-of-experts models (Qwen3-MoE and Mixtral) as Hugging Face directories and
GGUF files, with the logits transformers computes for them, as C++ test fixtures.

No small real checkpoint of these families can be fetched here, so the oracle is transformers
itself on models it builds from a config with random weights (fixed seeds).

What it makes
-------------
tests/fixtures/hf/qwen3_moe_f32/: Qwen3MoeForCausalLM saved by save_pretrained (config.json,
generation_config.json, model.safetensors in float32, each expert's three matrices on their own
as transformers 4 stores them), the cut-down Qwen3 tokenizer of make_qwen3_fixtures.py, and
expected.json in make_hf_fixtures.py's schema (every position's float32 logits for 3 prompts,
24 greedy tokens) plus "min_router_gap", the smallest distance between the k-th and the
(k+1)-th router logit over every token of every case and of the greedy continuation (how far
the routing is from a tie). Geometry: hidden 32, 4 heads of head_dim 16, 2 KV heads, 2
layers, 4 experts of moe_intermediate_size 32, 2 per token, norm_topk_prob true (as every
released Qwen3-MoE), tied embeddings.

tests/fixtures/hf/qwen3_moe_mixed_f32/: the same family with the other branches of
Qwen3MoeConfig: norm_topk_prob false, 3 layers of which mlp_only_layers = [1] is a dense MLP
(intermediate_size 48), 6 experts of moe_intermediate_size 16, 3 per token. HF only
(llama.cpp's qwen3moe has neither).

tests/fixtures/hf/mixtral_f32/: MixtralForCausalLM (block_sparse_moe.gate and experts.E.w1/w2/w3,
weights renormalised), hidden 32, 4 heads, 2 KV heads, 2 layers, 4 experts of intermediate_size
32, 2 per token, untied classifier; the same tokenizer (any tokenizer serves a random model).

tests/fixtures/gguf/qwen3_moe/ and gguf/mixtral/: the first and third models as GGUF files laid
out as llama.cpp's converter writes them (qwen3moe.* keys with expert_count, expert_used_count
and expert_feed_forward_length; Mixtral as a "llama" file with llama.expert_count and its q/k
rows permuted for interleaved RoPE; blk.N.ffn_gate_inp.weight the router, kept float32 as
llama.cpp's quantizer keeps it, and each layer's experts stacked into ffn_{gate,up,down}_exps
tensors [n_experts, rows, cols]):

  *_f32.gguf    every tensor float32: the HF directory's weights exactly
  *_q8_0.gguf   matrices Q8_0 (gguf-py's quantizer), the router and norms float32
  expected.json {"gguf_version", "q8_0": {"cases", "greedy_prompt", "greedy_tokens",
                "min_router_gap"}}: the Q8_0 file's tensors dequantized by gguf-py (q/k rows
                permuted back for Mixtral) and loaded into the transformers model

The f32 files hold the HF weights bit for bit, so the C++ tests hold them to the HF directory's
expected.json. The output is deterministic: rerunning the script rewrites identical files.

How to run
----------
In make_qwen3_fixtures.py's environment (torch 2.5.1, transformers 4.57.1, gguf 0.17.1):
  /root/qwen3env/bin/python scripts/make_moe_fixtures.py
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import full_logits, greedy, prompts, round6, write_expected  # noqa: E402
from make_qwen3_fixtures import (add_qwen_tokenizer, close_gguf, gguf_writer,  # noqa: E402
                                 make_tokenizer, randomize_, read_tokenizer_files)

import gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(ROOT, "tests", "fixtures", "hf")
GGUF = os.path.join(ROOT, "tests", "fixtures", "gguf")
GREEDY_NEW_TOKENS = 24


def qwen3_moe_config(vocab_size, special, **over):
    kw = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
              tie_word_embeddings=True, use_sliding_window=False, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
              decoder_sparse_step=1, mlp_only_layers=[],
              bos_token_id=special["<|endoftext|>"], eos_token_id=special["<|im_end|>"])
    kw.update(over)
    return Qwen3MoeConfig(**kw)


def mixtral_config(vocab_size, special):
    return MixtralConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1000000.0,
                         tie_word_embeddings=False, sliding_window=None, num_local_experts=4,
                         num_experts_per_tok=2, bos_token_id=special["<|endoftext|>"],
                         eos_token_id=special["<|im_end|>"])


def router_gap(model, ids_list):
    """The smallest distance between the k-th and (k+1)-th router logit of any token: how far the
    choice of experts is from a tie (float32 noise is ~1e-6)."""
    gaps = []
    k = model.config.num_experts_per_tok

    def hook(_module, _inputs, output):
        top = output.float().sort(dim=-1, descending=True).values
        gaps.append((top[:, k - 1] - top[:, k]).min().item())

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if n.endswith(".gate") and isinstance(m, torch.nn.Linear)]
    for ids in ids_list:
        full_logits(model, ids)
    for h in handles:
        h.remove()
    return min(gaps)


def logits_doc(model, cases, greedy_prompt):
    doc = {"cases": [], "greedy_prompt": greedy_prompt,
           "greedy_tokens": greedy(model, greedy_prompt, GREEDY_NEW_TOKENS)}
    for ids in cases:
        doc["cases"].append(dict(input_ids=ids, logits=[[round6(v) for v in row] for row in
                                                        full_logits(model, ids).tolist()]))
    doc["min_router_gap"] = router_gap(
        model, cases + [greedy_prompt + doc["greedy_tokens"][:-1]])
    return doc


def load(cls, path):
    return cls.from_pretrained(path, torch_dtype=torch.float32,
                               attn_implementation="eager").eval()


def make_hf(name, cls, config, seed, tok_dir):
    out = os.path.join(HF, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomize_(model, seed, router_std=1.0)
    model.save_pretrained(out, safe_serialization=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()
             if not (config.tie_word_embeddings and k == "lm_head.weight")}
    ref = load(cls, out)
    cases, greedy_prompt = prompts(config.vocab_size, seed)
    doc = logits_doc(ref, cases, greedy_prompt)
    doc.update(name=name, architecture=cls.__name__,
               transformers_version=transformers.__version__, torch_version=torch.__version__,
               dtype="float32", compute_dtype="float32")
    write_expected(os.path.join(out, "expected.json"), doc)
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    print(f"{name}: greedy {doc['greedy_tokens']}, min router gap {doc['min_router_gap']:.2e}")
    return state, cases, greedy_prompt


def permute(w, n_head):
    """llama.cpp's reordering of q/k rows for interleaved RoPE (convert_hf_to_gguf's permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head):
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_tensors(state, config, mixtral):
    """{GGUF name: float32 array} in llama.cpp's layout, experts stacked."""
    out = {}
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    moe = "block_sparse_moe" if mixtral else "mlp"
    names = {"w1": "gate", "w3": "up", "w2": "down"} if mixtral else \
        {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    n_experts = config.num_local_experts if mixtral else config.num_experts
    for name, t in state.items():
        a = t.to(torch.float32).numpy()
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
        elif name == "model.norm.weight":
            out["output_norm.weight"] = a
        elif name == "lm_head.weight":
            out["output.weight"] = a
    for l in range(config.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        get = lambda n: state[p + n].to(torch.float32).numpy()  # noqa: E731
        out[b + "attn_norm.weight"] = get("input_layernorm.weight")
        out[b + "ffn_norm.weight"] = get("post_attention_layernorm.weight")
        q, k = get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight")
        out[b + "attn_q.weight"] = permute(q, heads) if mixtral else q
        out[b + "attn_k.weight"] = permute(k, kv_heads) if mixtral else k
        out[b + "attn_v.weight"] = get("self_attn.v_proj.weight")
        out[b + "attn_output.weight"] = get("self_attn.o_proj.weight")
        if not mixtral:
            out[b + "attn_q_norm.weight"] = get("self_attn.q_norm.weight")
            out[b + "attn_k_norm.weight"] = get("self_attn.k_norm.weight")
        out[b + "ffn_gate_inp.weight"] = get(f"{moe}.gate.weight")
        for hf, g in names.items():
            out[b + f"ffn_{g}_exps.weight"] = np.stack(
                [get(f"{moe}.experts.{e}.{hf}.weight") for e in range(n_experts)])
    return out


def write_gguf(path, config, tensors, tok_dir, mixtral, qtype):
    tok, tok_config = read_tokenizer_files(tok_dir)
    w = gguf_writer(path, "llama" if mixtral else "qwen3moe",
                    "tandem-mixtral-fixture" if mixtral else "tandem-qwen3moe-fixture", config,
                    head_dim=not mixtral)
    if not mixtral:
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_expert_count(config.num_local_experts if mixtral else config.num_experts)
    w.add_expert_used_count(config.num_experts_per_tok)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == gguf.GGMLQuantizationType.F32
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_qwen_tokenizer(w, tok, config)
    w.add_add_bos_token(False)
    w.add_chat_template(tok_config["chat_template"])
    for name, a in tensors.items():
        if (qtype != gguf.GGMLQuantizationType.F32 and a.ndim >= 2
                and not name.endswith("ffn_gate_inp.weight")):
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    close_gguf(w)


def dequantized_state(path, config, mixtral):
    """The GGUF file's tensors dequantized by gguf-py, as the HF model's state dict."""
    reader = gguf.GGUFReader(path)
    t = {}
    for r in reader.tensors:
        shape = tuple(int(d) for d in reversed(r.shape.tolist()))
        t[r.name] = gguf.quants.dequantize(r.data, r.tensor_type).reshape(shape).astype(np.float32)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    moe = "block_sparse_moe" if mixtral else "mlp"
    names = {"w1": "gate", "w3": "up", "w2": "down"} if mixtral else \
        {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    s = {"model.embed_tokens.weight": t["token_embd.weight"],
         "model.norm.weight": t["output_norm.weight"]}
    s["lm_head.weight"] = t.get("output.weight", t["token_embd.weight"])
    for l in range(config.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        s[p + "input_layernorm.weight"] = t[b + "attn_norm.weight"]
        s[p + "post_attention_layernorm.weight"] = t[b + "ffn_norm.weight"]
        q, k = t[b + "attn_q.weight"], t[b + "attn_k.weight"]
        s[p + "self_attn.q_proj.weight"] = unpermute(q, heads) if mixtral else q
        s[p + "self_attn.k_proj.weight"] = unpermute(k, kv_heads) if mixtral else k
        s[p + "self_attn.v_proj.weight"] = t[b + "attn_v.weight"]
        s[p + "self_attn.o_proj.weight"] = t[b + "attn_output.weight"]
        if not mixtral:
            s[p + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"]
            s[p + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"]
        s[p + f"{moe}.gate.weight"] = t[b + "ffn_gate_inp.weight"]
        for hf, g in names.items():
            stack = t[b + f"ffn_{g}_exps.weight"]
            for e in range(stack.shape[0]):
                s[p + f"{moe}.experts.{e}.{hf}.weight"] = stack[e]
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in s.items()}


def make_gguf(name, cls, config, state, hf_name, cases, greedy_prompt):
    mixtral = cls is MixtralForCausalLM
    out = os.path.join(GGUF, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    tok_dir = os.path.join(HF, hf_name)
    tensors = gguf_tensors(state, config, mixtral)
    f32 = os.path.join(out, f"{name}_f32.gguf")
    q8 = os.path.join(out, f"{name}_q8_0.gguf")
    write_gguf(f32, config, tensors, tok_dir, mixtral, gguf.GGMLQuantizationType.F32)
    write_gguf(q8, config, tensors, tok_dir, mixtral, gguf.GGMLQuantizationType.Q8_0)
    # The f32 file reads back as the HF weights exactly.
    back = dequantized_state(f32, config, mixtral)
    for k, v in state.items():
        assert torch.equal(back[k], v.to(torch.float32)), k
    model = cls(config).eval()
    model.load_state_dict(dequantized_state(q8, config, mixtral), strict=True)
    doc = {"gguf_version": _gguf_version(), "q8_0": logits_doc(model, cases, greedy_prompt)}
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    print(f"{name} q8_0: greedy {doc['q8_0']['greedy_tokens']}, min router gap "
          f"{doc['q8_0']['min_router_gap']:.2e}")


def main():
    torch.set_num_threads(1)
    tok_dir = tempfile.mkdtemp()
    vocab_size, special = make_tokenizer(tok_dir)

    config = qwen3_moe_config(vocab_size, special)
    state, cases, greedy_prompt = make_hf("qwen3_moe_f32", Qwen3MoeForCausalLM, config, 3001,
                                          tok_dir)
    make_gguf("qwen3_moe", Qwen3MoeForCausalLM, config, state, "qwen3_moe_f32", cases,
              greedy_prompt)

    mixed = qwen3_moe_config(vocab_size, special, num_hidden_layers=3, mlp_only_layers=[1],
                             norm_topk_prob=False, num_experts=6, num_experts_per_tok=3,
                             moe_intermediate_size=16)
    make_hf("qwen3_moe_mixed_f32", Qwen3MoeForCausalLM, mixed, 3002, tok_dir)

    mix = mixtral_config(vocab_size, special)
    state, cases, greedy_prompt = make_hf("mixtral_f32", MixtralForCausalLM, mix, 3003, tok_dir)
    make_gguf("mixtral", MixtralForCausalLM, mix, state, "mixtral_f32", cases, greedy_prompt)

    total = 0
    for d in ("hf/qwen3_moe_f32", "hf/qwen3_moe_mixed_f32", "hf/mixtral_f32", "gguf/qwen3_moe",
              "gguf/mixtral"):
        for f in sorted(os.listdir(os.path.join(ROOT, "tests", "fixtures", d))):
            total += os.path.getsize(os.path.join(ROOT, "tests", "fixtures", d, f))
    print(f"total {total / 1024:.0f} KiB")
    shutil.rmtree(tok_dir)


def _gguf_version():
    from importlib.metadata import version
    return version("gguf")


if __name__ == "__main__":
    sys.exit(main())
