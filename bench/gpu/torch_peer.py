#!/usr/bin/env python3
"""The PyTorch peer of cuda_model_bench, run by scripts/gpu_check.sh on the same GPU in the same
run: a Llama-3-8B-shaped LlamaForCausalLM (transformers, random bf16 weights made on the GPU,
attn_implementation="sdpa": PyTorch's flash/efficient attention and cuBLAS GEMMs).

  prefill: one eager forward of one sequence of 512, 2048, 8192 tokens with last-token logits,
           timed as cuda_model_bench times Tandem's (mean of a few after a warm-up), FLOPs
           counted the same way (2 x matmul parameters x tokens + causal attention);
  decode:  one token for each of 1, 8, 64, 256 sequences at a context of --context tokens, from a
           static KV cache, the step captured in a CUDA graph and replayed (what a serving
           engine on PyTorch does; eager steps would time Python, not the GPU).

Writes JSON to --out. Exits 77 (skipped) where torch, transformers or a GPU is missing; a part
that fails is written as null with the reason, so the rest still compares.
"""
import argparse
import json
import sys
import time


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def matmul_params(layers):
    return layers * (2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 14336 * 4096)


def build_model(torch, transformers, layers):
    config = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192 + 512, rope_theta=500000.0, rms_norm_eps=1e-5)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    for p in model.parameters():  # small random weights: no NaNs through 32 layers
        p.data.normal_(0.0, 0.02)
    model.eval()
    return model


def time_cuda(torch, fn, iters):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def bench_prefill(torch, model, layers, n):
    ids = (torch.arange(n, device="cuda") * 7919) % 128256
    ids = ids.unsqueeze(0)

    def step():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    t = time_cuda(torch, step, 3 if n >= 8192 else 5)
    flops = 2.0 * matmul_params(layers) * n + 4.0 * layers * 4096.0 * n * n / 2
    tflops = flops / t / 1e12
    return {"tokens": n, "ms": round(t * 1e3, 3), "tflops": round(tflops, 2),
            "fraction_of_989": round(tflops / 989, 4)}


def bench_decode(torch, transformers, model, batch, context):
    from transformers import StaticCache
    try:  # transformers 4.x names the batch; 5.x sizes it at the first update
        cache = StaticCache(config=model.config, max_batch_size=batch,
                            max_cache_len=context + 8, device="cuda", dtype=torch.bfloat16)
    except TypeError:
        cache = StaticCache(config=model.config, max_cache_len=context + 8)
    ids = torch.randint(0, 128256, (batch, context), device="cuda")
    with torch.no_grad():  # fill the cache with a prefill of `context` tokens
        for start in range(0, context, 256):
            end = min(context, start + 256)
            pos = torch.arange(start, end, device="cuda")
            model(input_ids=ids[:, start:end], past_key_values=cache, cache_position=pos,
                  use_cache=True, logits_to_keep=1)
    token = torch.zeros((batch, 1), dtype=torch.long, device="cuda")
    position = torch.tensor([context], device="cuda")

    def step():
        with torch.no_grad():
            model(input_ids=token, past_key_values=cache, cache_position=position,
                  use_cache=True, logits_to_keep=1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    t = time_cuda(torch, graph.replay, 20)
    return {"batch": batch, "step_ms": round(t * 1e3, 4), "tokens_per_s": round(batch / t, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/torch_peer.json")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--prefill", default="512,2048,8192")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"torch_peer: skipped: {e}")
        return 77
    if not torch.cuda.is_available():
        print("torch_peer: skipped: no GPU")
        return 77
    result = {"peer": f"torch {torch.__version__}, transformers {transformers.__version__}, sdpa",
              "device": torch.cuda.get_device_name(0), "layers": args.layers,
              "context": args.context, "prefill": [], "decode": []}
    model = build_model(torch, transformers, args.layers)
    for n in parse_list(args.prefill):
        try:
            r = bench_prefill(torch, model, args.layers, n)
            print(f"torch prefill {n:5d} tokens: {r['ms']:.1f} ms, {r['tflops']:.1f} TFLOP/s "
                  f"({100 * r['fraction_of_989']:.0f}% of 989)")
        except Exception as e:  # noqa: BLE001 - the reason goes in the JSON
            r = {"tokens": n, "ms": None, "error": str(e)[:300]}
            print(f"torch prefill {n}: {e}")
        result["prefill"].append(r)
    for b in parse_list(args.batches):
        try:
            r = bench_decode(torch, transformers, model, b, args.context)
            print(f"torch decode batch {b:3d}: {r['step_ms']:.2f} ms a step")
        except Exception as e:  # noqa: BLE001
            r = {"batch": b, "step_ms": None, "error": str(e)[:300]}
            print(f"torch decode batch {b}: {e}")
        result["decode"].append(r)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
