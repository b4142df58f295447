#!/usr/bin/env python3
"""Make tiny Hugging Face checkpoints plus transformers' own logits, as C++ test fixtures.

What it makes
-------------
Under tests/fixtures/hf/<name>/, for each tiny random-weight model below:

  config.json                   written by transformers' save_pretrained
  generation_config.json        written by transformers' save_pretrained
  model.safetensors             (or model.safetensors.index.json + model-0000k-of-0000n.safetensors)
  expected.json                 transformers' float32 logits for every position of 3 prompts,
                                plus an 8-token greedy continuation

  llama3_f32         LlamaForCausalLM, rope_scaling rope_type "llama3", untied, float32,
                     config.json carries an explicit "head_dim" (as Llama 3.x configs do)
  llama_tied_bf16    LlamaForCausalLM, tie_word_embeddings, bfloat16 weights, plain rope,
                     no "head_dim" key (the loader must derive hidden_size / num_attention_heads)
  qwen2_f32          Qwen2ForCausalLM, q/k/v biases, tied embeddings, float32
  mistral_f16        MistralForCausalLM, untied, float16 weights, sliding_window null
  llama_sharded_f32  LlamaForCausalLM, plain rope, float32, saved sharded (index json + 3 shards)

All use hidden_size 64, 4 attention heads, 2 KV heads (GQA), head_dim 16, 2 layers and
max_position_embeddings 256. The weights are random (fixed seeds) and scaled up from
transformers' default init (std 0.02 gives nearly flat logits) so that a wrong rotary
rotation, a missing bias or a mis-tied head changes the logits far beyond tolerance.
They are test data, not model data.

expected.json schema:
  {"name", "architecture", "transformers_version", "torch_version",
   "dtype":          dtype of the saved weights ("float32" | "bfloat16" | "float16"),
   "compute_dtype":  "float32" (the model was loaded back with torch_dtype=float32, so
                     bf16/f16 weights are upcast exactly as a float32 engine would),
   "cases": [{"input_ids": [int, ...], "logits": [[vocab_size floats] per position]}],
   "greedy_prompt": [int, ...], "greedy_tokens": [8 ints]}
Logits are rounded to 6 significant digits. Computed with attn_implementation="eager",
batch size 1, no padding. greedy_tokens come from model.generate(do_sample=False) with
EOS stopping disabled (the 8 tokens are pure argmax, even if one equals eos_token_id).

How to run
----------
Needs torch, transformers and safetensors, e.g. (Debian 12):
  apt-get install python3-torch                        # torch 1.13.1+dfsg (reports 1.13.0a0)
  python3 -m venv --system-site-packages /root/hfenv
  /root/hfenv/bin/pip install "transformers==4.44.2" "numpy<2" safetensors
  /root/hfenv/bin/python scripts/make_hf_fixtures.py            # (re)make all fixtures
  /root/hfenv/bin/python scripts/make_hf_fixtures.py --check    # reload and verify only

Versions used for the committed fixtures: transformers 4.44.2, torch 1.13.1 (Debian
python3-torch 1.13.1+dfsg-4, torch.__version__ "1.13.0a0"), safetensors 0.8.0, numpy 1.24.2,
Python 3.11.2. Other versions are expected to give the same logits within float32 noise, but may write
slightly different config.json keys.
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "hf")

SEQ_LENS = (1, 7, 33)
GREEDY_PROMPT_LEN = 12
GREEDY_NEW_TOKENS = 8

# Shared tiny geometry. head_dim = hidden_size / num_attention_heads = 16.
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    hidden_act="silu",
)

# Llama 3.1-style rope scaling. original_max_position_embeddings is 64 (real: 8192) so that at
# head_dim 16 and rope_theta 500000 all three regimes of the llama3 rule occur: pair 0
# (wavelength 6.3 < 64/4) is unchanged, pair 1 (wavelength 32.4) is smoothed, pairs 2..7
# (wavelength > 64) are divided by factor 8. check_llama3_scaling() asserts this.
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

FIXTURES = [
    dict(
        name="llama3_f32",
        cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **COMMON,
            head_dim=16,  # not read by transformers 4.44 (it derives 64/4 = 16); written as Llama 3.x do
            vocab_size=128,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(LLAMA3_ROPE_SCALING),
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dtype=torch.float32,
        seed=1001,
    ),
    dict(
        name="llama_tied_bf16",
        cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **COMMON,
            vocab_size=160,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dtype=torch.bfloat16,
        seed=1002,
    ),
    dict(
        name="qwen2_f32",
        cls=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(
            **COMMON,
            vocab_size=192,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            use_sliding_window=False,
            sliding_window=256,  # ignored (written as null) since use_sliding_window is False
            max_window_layers=2,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dtype=torch.float32,
        seed=1003,
    ),
    dict(
        name="mistral_f16",
        cls=MistralForCausalLM,
        config=lambda: MistralConfig(
            **COMMON,
            head_dim=16,
            vocab_size=144,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dtype=torch.float16,
        seed=1004,
    ),
    dict(
        name="llama_sharded_f32",
        cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **COMMON,
            vocab_size=128,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dtype=torch.float32,
        seed=1005,
        max_shard_size="160KB",  # ~420 KB of float32 weights -> 3 shards
    ),
]


def dtype_name(dt):
    return str(dt).split(".")[-1]


def randomize_(model, seed):
    """Replace transformers' std-0.02 init with larger random weights (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is not listed separately
            if name.endswith("norm.weight"):  # input/post_attention layernorm and final norm
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif name.endswith(".bias"):
                v = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(p.shape, generator=g)
            else:  # q/k/v/o, gate/up/down, untied lm_head
                v = 0.2 * torch.randn(p.shape, generator=g)
            p.copy_(v.to(p.dtype))


def check_llama3_scaling(config):
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plain, _ = ROPE_INIT_FUNCTIONS["default"](config, "cpu")
    unchanged = torch.isclose(scaled, plain, rtol=0, atol=0)
    divided = torch.isclose(scaled, plain / LLAMA3_ROPE_SCALING["factor"], rtol=1e-6, atol=0)
    smoothed = ~unchanged & ~divided
    assert unchanged.any() and divided.any() and smoothed.any(), (scaled, plain)
    print(f"  llama3 inv_freq: unchanged {unchanged.nonzero().flatten().tolist()}, "
          f"smoothed {smoothed.nonzero().flatten().tolist()}, "
          f"divided by factor {divided.nonzero().flatten().tolist()}")


def prompts(vocab_size, seed):
    g = torch.Generator().manual_seed(seed + 7)
    cases = [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in SEQ_LENS]
    greedy = torch.randint(0, vocab_size, (GREEDY_PROMPT_LEN,), generator=g).tolist()
    return cases, greedy


def load_f32(cls, path):
    model = cls.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


@torch.no_grad()
def full_logits(model, ids):
    out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def greedy(model, prompt, new_tokens=GREEDY_NEW_TOKENS):
    model.generation_config.eos_token_id = None  # never stop early: 8 plain argmax steps
    out = model.generate(
        torch.tensor([prompt], dtype=torch.long),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    return out[0, len(prompt):].tolist()


def round6(x):
    return float(f"{x:.6g}")


def write_expected(path, doc):
    """JSON with one logits row per line (readable diffs, modest size)."""
    lines = ["{"]
    for k in ("name", "architecture", "transformers_version", "torch_version", "dtype", "compute_dtype"):
        lines.append(f"  {json.dumps(k)}: {json.dumps(doc[k])},")
    lines.append('  "cases": [')
    for ci, case in enumerate(doc["cases"]):
        lines.append(f'    {{"input_ids": {json.dumps(case["input_ids"])},')
        lines.append('     "logits": [')
        rows = [json.dumps(r, separators=(",", ":")) for r in case["logits"]]
        lines.append(",\n".join("      " + r for r in rows))
        lines.append("     ]}" + ("," if ci + 1 < len(doc["cases"]) else ""))
    lines.append("  ],")
    lines.append(f'  "greedy_prompt": {json.dumps(doc["greedy_prompt"])},')
    lines.append(f'  "greedy_tokens": {json.dumps(doc["greedy_tokens"])}')
    # Further keys (make_qwen3_fixtures.py adds the tokenizer's and chat template's), one a line.
    known = ("name", "architecture", "transformers_version", "torch_version", "dtype",
             "compute_dtype", "cases", "greedy_prompt", "greedy_tokens")
    for k in (k for k in doc if k not in known):
        lines[-1] += ","
        lines.append(f"  {json.dumps(k)}: {json.dumps(doc[k])}")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def make(fx):
    name = fx["name"]
    out = os.path.join(OUT_DIR, name)
    print(f"[{name}]")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)

    torch.manual_seed(fx["seed"])
    config = fx["config"]()
    if getattr(config, "rope_scaling", None):
        check_llama3_scaling(config)
    model = fx["cls"](config).eval()
    randomize_(model, fx["seed"])  # in float32, then rounded once to the storage dtype
    model = model.to(fx["dtype"])
    save_kwargs = dict(safe_serialization=True)
    if "max_shard_size" in fx:
        save_kwargs["max_shard_size"] = fx["max_shard_size"]
    model.save_pretrained(out, **save_kwargs)
    del model
    for f in os.listdir(out):  # safetensors writes 0600; make the files plain 0644
        os.chmod(os.path.join(out, f), 0o644)

    ref = load_f32(fx["cls"], out)
    cases, greedy_prompt = prompts(config.vocab_size, fx["seed"])
    doc = dict(
        name=name,
        architecture=fx["cls"].__name__,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        dtype=dtype_name(fx["dtype"]),
        compute_dtype="float32",
        cases=[],
        greedy_prompt=greedy_prompt,
        greedy_tokens=greedy(ref, greedy_prompt),
    )
    for ids in cases:
        logits = full_logits(ref, ids)
        doc["cases"].append(dict(input_ids=ids, logits=[[round6(v) for v in row] for row in logits.tolist()]))
    write_expected(os.path.join(out, "expected.json"), doc)


def check(fx):
    """Reload the saved checkpoint and confirm expected.json reproduces."""
    name = fx["name"]
    out = os.path.join(OUT_DIR, name)
    with open(os.path.join(out, "expected.json")) as f:
        doc = json.load(f)
    ref = load_f32(fx["cls"], out)
    vocab = ref.config.vocab_size
    worst = 0.0
    spread = []
    for case in doc["cases"]:
        got = full_logits(ref, case["input_ids"])
        want = torch.tensor(case["logits"], dtype=torch.float32)
        assert got.shape == want.shape == (len(case["input_ids"]), vocab), (got.shape, want.shape)
        err = ((got - want).abs() / (1e-3 + want.abs())).max().item()
        worst = max(worst, err)
        spread.append(want.std(dim=-1).mean().item())
    assert worst < 1e-5, f"{name}: logits differ, max rel err {worst}"

    # greedy: generate() (KV cache) must equal a no-cache argmax loop and the stored tokens.
    ids = list(doc["greedy_prompt"])
    for _ in range(GREEDY_NEW_TOKENS):
        ids.append(int(full_logits(ref, ids)[-1].argmax()))
    loop_tokens = ids[len(doc["greedy_prompt"]):]
    gen_tokens = greedy(ref, doc["greedy_prompt"])
    assert gen_tokens == loop_tokens == doc["greedy_tokens"], (gen_tokens, loop_tokens, doc["greedy_tokens"])

    # Storage dtype really is what the name says.
    from safetensors import safe_open
    st_files = sorted(p for p in os.listdir(out) if p.endswith(".safetensors"))
    dtypes = set()
    for p in st_files:
        with safe_open(os.path.join(out, p), framework="pt") as f:
            for k in f.keys():
                dtypes.add(str(f.get_tensor(k).dtype).split(".")[-1])
    assert dtypes == {doc["dtype"]}, (dtypes, doc["dtype"])
    if "max_shard_size" in fx:
        assert len(st_files) >= 2 and os.path.exists(os.path.join(out, "model.safetensors.index.json"))

    size = sum(os.path.getsize(os.path.join(out, p)) for p in os.listdir(out))
    print(f"  {name:18s} ok: max rel err {worst:.1e}, mean logit std {sum(spread) / len(spread):.2f}, "
          f"greedy {doc['greedy_tokens']}, {len(st_files)} safetensors file(s), {size / 1024:.0f} KiB")
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only reload and verify existing fixtures")
    ap.add_argument("names", nargs="*", help="fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    selected = [fx for fx in FIXTURES if not args.names or fx["name"] in args.names]
    if not args.check:
        for fx in selected:
            make(fx)
    print("check:")
    total = sum(check(fx) for fx in selected)
    print(f"total {total / 1024:.0f} KiB in {OUT_DIR}")


if __name__ == "__main__":
    sys.exit(main())
