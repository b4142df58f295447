// The device model's speed on a Llama-3-8B-shaped model of random bf16 weights made on the GPU
// (nothing is built on the host), for scripts/gpu_check.sh:
//   decode: step time at batch 1, 8, 64, 256 (graphs on, device greedy sampling, a context of
//           --context tokens per sequence) against the memory bound (weight bytes + KV bytes
//           read) / 4.8 TB/s (H200 HBM3e);
//   prefill: one sequence of 512, 2048, 8192 tokens, TFLOP/s against 989 (H100/H200 dense
//           bf16 nominal); FLOPs = 2 x matmul parameters x tokens + causal attention
//           (4 x layers x q_dim x tokens² / 2).
// Flags: --context N (512), --layers N (32), --batches 1,8,64,256, --prefill 512,2048,8192 (an
// empty list skips that part, e.g. to profile the other under ncu).
// Prints figures and writes JSON to --out (default bench/results/cuda_model_bench.json). Exits 77
// (skipped) without a usable GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend_loader.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "bench/results/cuda_model_bench.json";
  int context = 512;
  int layers = 32;
  std::vector<int> batches = {1, 8, 64, 256}, prefills = {512, 2048, 8192};
  // "1,8,64" -> {1, 8, 64}; "" -> {} (that part skipped, e.g. to profile one of them).
  auto list = [](const char* text) {
    std::vector<int> v;
    for (const char* p = text; *p != '\0';) {
      v.push_back(std::atoi(p));
      while (*p != '\0' && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return v;
  };
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
    if (std::strcmp(argv[i], "--context") == 0) context = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--layers") == 0) layers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--batches") == 0) batches = list(argv[i + 1]);
    if (std::strcmp(argv[i], "--prefill") == 0) prefills = list(argv[i + 1]);
  }
  for (int b : batches) {
    if (b < 1 || b > 256) {
      std::fprintf(stderr, "--batches: each in [1, 256]\n");
      return 2;
    }
  }
  for (int n : prefills) {
    if (n < 1 || n > 8192) {
      std::fprintf(stderr, "--prefill: each in [1, 8192]\n");
      return 2;
    }
  }
  if (context < 1 || context > 8192 || layers < 1 || layers > 32) {
    std::fprintf(stderr, "--context must be in [1, 8192], --layers in [1, 32]\n");
    return 2;
  }
  auto api_or = tandem::LoadCudaApi();
  if (!api_or.ok()) {
    std::fprintf(stderr, "skipped: %s\n", std::string(api_or.status().message()).c_str());
    return 77;
  }
  const TandemCudaApi* api = *api_or;
  // Llama-3-8B: dim 4096, MLP 14336, 32 heads of 128, 8 KV heads, vocab 128256, theta 5e5.
  const int head_dim = 128, block_size = 16, max_batch = 256, max_prefill = 8192;
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = 1.f / std::pow(500000.f, 2.f * i / head_dim);
  }
  TandemModelDesc d{};
  d.dim = 4096;
  d.hidden_dim = 14336;
  d.n_layers = layers;
  d.n_heads = 32;
  d.n_kv_heads = 8;
  d.head_dim = head_dim;
  d.vocab_size = 128256;
  d.max_seq_len = 8192 + 16;
  d.norm_eps = 1e-5f;
  d.rope_style = 1;
  d.rope_inv_freq = inv_freq.data();
  d.weight_dtype = 2;
  const int blocks_per_seq = (context + 1 + block_size - 1) / block_size;
  const int prefill_blocks = max_prefill / block_size;
  d.num_blocks = max_batch * blocks_per_seq + prefill_blocks;
  d.block_size = block_size;
  d.max_batch_tokens = max_prefill;
  d.max_seqs = max_batch;
  d.max_logit_rows = max_batch;
  d.use_graphs = 1;
  TandemModel* m = nullptr;
  auto t0 = std::chrono::steady_clock::now();
  if (api->model_create(&d, nullptr, 1234, &m) != 0) {
    std::fprintf(stderr, "model_create: %s\n", api->last_error());
    return 1;
  }
  TandemModelInfo info{};
  api->model_info(m, &info);
  std::printf("model: %d layers, weights %.2f GB, KV cache %.2f GB, workspace %.2f GB (%.1f s)\n",
              layers, info.weight_bytes / 1e9, info.kv_bytes / 1e9, info.workspace_bytes / 1e9,
              Seconds(t0));
  const double kv_bytes_per_token = 2.0 * layers * d.n_kv_heads * head_dim * 4;
  std::string json =
      "{\"model\":\"llama3-8b-shape random bf16\",\"layers\":" + std::to_string(layers) +
      ",\"context\":" + std::to_string(context) +
      ",\"weight_bytes\":" + std::to_string(info.weight_bytes) + ",\"decode\":[";
  bool ok = true;
  for (int batch : batches) {
    std::vector<int> tables(static_cast<size_t>(batch) * blocks_per_seq);
    std::iota(tables.begin(), tables.end(), 0);
    std::vector<TandemStepChunk> chunks(batch, TandemStepChunk{1, context, blocks_per_seq, 0});
    std::vector<int> tokens(batch, 1), sampled(batch);
    std::vector<TandemSampleRowParams> params(batch, TandemSampleRowParams{0.f, 0, 1.f, 1, 0});
    int rows = 0;
    auto step = [&] {
      return api->model_forward(m, chunks.data(), batch, tokens.data(), tables.data(),
                                params.data(), nullptr, sampled.data(), &rows);
    };
    for (int i = 0; i < 3; ++i) {  // capture + warm up
      if (step() != 0) {
        std::fprintf(stderr, "decode batch %d: %s\n", batch, api->last_error());
        ok = false;
        break;
      }
    }
    if (!ok) break;
    const int iters = 20;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) step();
    const double t = Seconds(t0) / iters;
    const double bytes = static_cast<double>(info.weight_bytes) +
                         static_cast<double>(batch) * (context + 1) * kv_bytes_per_token;
    const double bound = bytes / 4.8e12;
    std::printf("decode batch %3d: %.3f ms/step, %.0f tokens/s, bound %.3f ms (%.0f%% of it)\n",
                batch, t * 1e3, batch / t, bound * 1e3, 100 * bound / t);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"batch\":%d,\"step_ms\":%.4f,\"tokens_per_s\":%.1f,\"bound_ms\":%.4f,"
                  "\"fraction_of_bound\":%.3f}",
                  batch == batches.front() ? "" : ",", batch, t * 1e3, batch / t, bound * 1e3,
                  bound / t);
    json += buf;
  }
  json += "],\"prefill\":[";
  const double matmul_params =
      static_cast<double>(layers) * (2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 14336 * 4096);
  bool first = true;
  for (int n : prefills) {
    if (!ok) break;
    std::vector<int> table(prefill_blocks);
    std::iota(table.begin(), table.end(), max_batch * blocks_per_seq);
    std::vector<int> tokens(n);
    for (int i = 0; i < n; ++i) tokens[i] = (i * 7919) % d.vocab_size;
    TandemStepChunk chunk{n, 0, prefill_blocks, 0};
    std::vector<float> logits(d.vocab_size);
    int rows = 0;
    auto step = [&] {
      return api->model_forward(m, &chunk, 1, tokens.data(), table.data(), nullptr, logits.data(),
                                nullptr, &rows);
    };
    if (step() != 0) {
      std::fprintf(stderr, "prefill %d: %s\n", n, api->last_error());
      ok = false;
      break;
    }
    const int iters = n >= 8192 ? 3 : 5;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) step();
    const double t = Seconds(t0) / iters;
    const double flops = 2.0 * matmul_params * n + 4.0 * layers * 4096.0 * n * n / 2;
    const double tflops = flops / t / 1e12;
    std::printf("prefill %5d tokens: %.1f ms, %.1f TFLOP/s (%.0f%% of 989), %.0f tokens/s\n", n,
                t * 1e3, tflops, 100 * tflops / 989, n / t);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"tokens\":%d,\"ms\":%.3f,\"tflops\":%.2f,\"fraction_of_989\":%.4f}",
                  first ? "" : ",", n, t * 1e3, tflops, tflops / 989);
    first = false;
    json += buf;
  }
  api->model_info(m, &info);
  json += "],\"graphs_captured\":" + std::to_string(info.graphs_captured) + "}\n";
  api->model_destroy(m);
  if (FILE* f = std::fopen(out.c_str(), "w")) {
    std::fputs(json.c_str(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "cannot write %s\n", out.c_str());
  }
  return ok ? 0 : 1;
}
