// The device model's speed on a Llama-3-8B-shaped model of random bf16 weights made on the GPU
// (nothing is built on the host), for scripts/gpu_check.sh:
//   decode: step time at batch 1, 8, 64, 256 (graphs on, device greedy sampling, a context of
//           --context tokens per sequence) against the memory bound (weight bytes + KV bytes
//           read) / 4.8 TB/s (H200 HBM3e);
//   prefill: one sequence of 512, 2048, 8192 tokens, TFLOP/s against 989 (H100/H200 dense
//           bf16 nominal); FLOPs = 2 x matmul parameters x tokens + causal attention
//           (4 x layers x q_dim x tokens² / 2).
// Flags: --context N (512), --layers N (32), --batches 1,8,64,256, --prefill 512,2048,8192 (an
// empty list skips that part, e.g. to profile the other under ncu), --kv-dtype f32|bf16|fp8 (the
// KV cache; bf16, the CUDA default: attention by FlashInfer; f32: the hand-written kernels).
// Prints figures and writes JSON to --out (default bench/results/cuda_model_bench.json): with the
// device's name, the UTC date and the commit built ($TANDEM_COMMIT, which scripts/gpu_check.sh
// sets), so `tandem plan calibrate --from-device` can name where a profile comes from. Exits 77
// (skipped) without a usable GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend_loader.h"

namespace {

// Llama-3-8B: dim 4096, MLP 14336, 32 heads of 128, 8 KV heads, vocab 128256, theta 5e5.
constexpr int kHeadDim = 128, kBlockSize = 16, kMaxBatch = 256, kMaxPrefill = 8192;

double Seconds(const std::chrono::steady_clock::time_point& a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

struct Flags {
  std::string out = "bench/results/cuda_model_bench.json";
  int context = 512;
  int layers = 32;
  std::vector<int> batches = {1, 8, 64, 256}, prefills = {512, 2048, 8192};
  std::string kv_dtype = "bf16";
};

// TANDEM_KV_* of a --kv-dtype name, -1 for another.
int KvCode(const std::string& name) {
  return name == "f32"    ? TANDEM_KV_F32
         : name == "bf16" ? TANDEM_KV_BF16
         : name == "fp8"  ? TANDEM_KV_FP8
                          : -1;
}
int KvElementBytes(int code) { return code == TANDEM_KV_F32 ? 4 : code == TANDEM_KV_BF16 ? 2 : 1; }

// "1,8,64" -> {1, 8, 64}; "" -> {} (that part skipped, e.g. to profile one of them).
std::vector<int> ParseList(const char* text) {
  std::vector<int> v;
  for (const char* p = text; *p != '\0';) {
    v.push_back(std::atoi(p));
    while (*p != '\0' && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// Reads the flags into `flags`; false (with a message) when one is out of range.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0) flags->out = argv[i + 1];
    if (std::strcmp(argv[i], "--context") == 0) flags->context = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--layers") == 0) flags->layers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--batches") == 0) flags->batches = ParseList(argv[i + 1]);
    if (std::strcmp(argv[i], "--prefill") == 0) flags->prefills = ParseList(argv[i + 1]);
    if (std::strcmp(argv[i], "--kv-dtype") == 0) flags->kv_dtype = argv[i + 1];
  }
  if (KvCode(flags->kv_dtype) < 0) {
    std::fprintf(stderr, "--kv-dtype: f32, bf16 or fp8\n");
    return false;
  }
  for (int b : flags->batches) {
    if (b < 1 || b > 256) {
      std::fprintf(stderr, "--batches: each in [1, 256]\n");
      return false;
    }
  }
  for (int n : flags->prefills) {
    if (n < 1 || n > 8192) {
      std::fprintf(stderr, "--prefill: each in [1, 8192]\n");
      return false;
    }
  }
  if (flags->context < 1 || flags->context > 8192 || flags->layers < 1 || flags->layers > 32) {
    std::fprintf(stderr, "--context must be in [1, 8192], --layers in [1, 32]\n");
    return false;
  }
  return true;
}

// The Llama-3-8B-shaped model of `layers` layers, with KV blocks for kMaxBatch sequences of
// `blocks_per_seq` blocks and one prefill of kMaxPrefill tokens. `inv_freq` must outlive it.
TandemModelDesc ModelDesc(int layers, int blocks_per_seq, int kv_code,
                          const std::vector<float>& inv_freq) {
  TandemModelDesc d{};
  d.dim = 4096;
  d.hidden_dim = 14336;
  d.n_layers = layers;
  d.n_heads = 32;
  d.n_kv_heads = 8;
  d.head_dim = kHeadDim;
  d.vocab_size = 128256;
  d.max_seq_len = 8192 + 16;
  d.norm_eps = 1e-5f;
  d.rope_style = 1;
  d.rope_inv_freq = inv_freq.data();
  d.weight_dtype = 2;
  const int prefill_blocks = kMaxPrefill / kBlockSize;
  d.num_blocks = kMaxBatch * blocks_per_seq + prefill_blocks;
  d.block_size = kBlockSize;
  d.max_batch_tokens = kMaxPrefill;
  d.max_seqs = kMaxBatch;
  d.max_logit_rows = kMaxBatch;
  d.use_graphs = 1;
  d.kv_dtype = kv_code;
  return d;
}

// Times decode steps of `batch` sequences at `context` tokens each, prints the figures and appends
// them to `json` (after a comma unless `first`). False when a step fails.
bool BenchDecode(const TandemCudaApi* api, TandemModel* m, const TandemModelInfo& info, int batch,
                 int context, int blocks_per_seq, double kv_bytes_per_token, bool first,
                 std::string* json) {
  std::vector<int> tables(static_cast<size_t>(batch) * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<TandemStepChunk> chunks(batch, TandemStepChunk{1, context, blocks_per_seq, 0});
  std::vector<int> tokens(batch, 1), sampled(batch);
  std::vector<TandemSampleRowParams> params(batch, TandemSampleRowParams{0.f, 0, 1.f, 1, 0});
  int rows = 0;
  auto step = [&] {
    return api->model_forward(m, chunks.data(), batch, tokens.data(), tables.data(), params.data(),
                              nullptr, sampled.data(), &rows);
  };
  for (int i = 0; i < 3; ++i) {  // capture + warm up
    if (step() != 0) {
      std::fprintf(stderr, "decode batch %d: %s\n", batch, api->last_error());
      return false;
    }
  }
  const int iters = 20;
  const auto t0 = std::chrono::steady_clock::now();
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
                first ? "" : ",", batch, t * 1e3, batch / t, bound * 1e3, bound / t);
  *json += buf;
  return true;
}

// Times the prefill of one sequence of `n` tokens in the blocks after the decode sequences',
// prints the figures and appends them to `json` (after a comma unless `first`). False when the
// step fails.
bool BenchPrefill(const TandemCudaApi* api, TandemModel* m, int vocab_size, int layers,
                  int blocks_per_seq, int n, bool first, std::string* json) {
  const int prefill_blocks = kMaxPrefill / kBlockSize;
  const double matmul_params =
      static_cast<double>(layers) * (2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 14336 * 4096);
  std::vector<int> table(prefill_blocks);
  std::iota(table.begin(), table.end(), kMaxBatch * blocks_per_seq);
  std::vector<int> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 7919) % vocab_size;
  TandemStepChunk chunk{n, 0, prefill_blocks, 0};
  std::vector<float> logits(vocab_size);
  int rows = 0;
  auto step = [&] {
    return api->model_forward(m, &chunk, 1, tokens.data(), table.data(), nullptr, logits.data(),
                              nullptr, &rows);
  };
  if (step() != 0) {
    std::fprintf(stderr, "prefill %d: %s\n", n, api->last_error());
    return false;
  }
  const int iters = n >= 8192 ? 3 : 5;
  const auto t0 = std::chrono::steady_clock::now();
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
  *json += buf;
  return true;
}

// `"device":...,"date":...,"commit":...,` (the commit only where $TANDEM_COMMIT is set); names
// are escaped by dropping what JSON would need escaped.
std::string ProvenanceJson(const TandemCudaApi* api) {
  auto clean = [](std::string v) {
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](char c) { return c == '"' || c == '\\' || (c >= 0 && c < 0x20); }),
            v.end());
    return v;
  };
  char name[256] = {0};
  if (api->device_name(0, name, sizeof(name)) != 0) name[0] = 0;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(date, sizeof(date), "%Y-%m-%d", &utc);
  std::string j = "\"device\":\"" + clean(name) + "\",\"date\":\"" + date + "\",";
  if (const char* commit = std::getenv("TANDEM_COMMIT"); commit && *commit) {
    j += "\"commit\":\"" + clean(commit) + "\",";
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  const int context = flags.context, layers = flags.layers;
  auto api_or = tandem::LoadCudaApi();
  if (!api_or.ok()) {
    std::fprintf(stderr, "skipped: %s\n", std::string(api_or.status().message()).c_str());
    return 77;
  }
  const TandemCudaApi* api = *api_or;
  std::vector<float> inv_freq(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) {
    inv_freq[i] = 1.f / std::pow(500000.f, 2.f * i / kHeadDim);
  }
  const int blocks_per_seq = (context + 1 + kBlockSize - 1) / kBlockSize;
  const int kv_code = KvCode(flags.kv_dtype);
  const TandemModelDesc d = ModelDesc(layers, blocks_per_seq, kv_code, inv_freq);
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
  // fp8's scales are per block, not per token: 2 * n_kv_heads floats a block, left out.
  const double kv_bytes_per_token =
      2.0 * layers * d.n_kv_heads * kHeadDim * KvElementBytes(kv_code);
  std::printf("KV cache: %s\n", flags.kv_dtype.c_str());
  std::string json = "{" + ProvenanceJson(api) +
                     "\"model\":\"llama3-8b-shape random bf16\",\"kv_dtype\":\"" + flags.kv_dtype +
                     "\",\"layers\":" + std::to_string(layers) +
                     ",\"context\":" + std::to_string(context) +
                     ",\"weight_bytes\":" + std::to_string(info.weight_bytes) + ",\"decode\":[";
  bool ok = true;
  for (int batch : flags.batches) {
    if (!BenchDecode(api, m, info, batch, context, blocks_per_seq, kv_bytes_per_token,
                     batch == flags.batches.front(), &json)) {
      ok = false;
      break;
    }
  }
  json += "],\"prefill\":[";
  bool first = true;
  for (int n : flags.prefills) {
    if (!ok) break;
    if (!BenchPrefill(api, m, d.vocab_size, layers, blocks_per_seq, n, first, &json)) {
      ok = false;
      break;
    }
    first = false;
  }
  api->model_info(m, &info);
  json += "],\"graphs_captured\":" + std::to_string(info.graphs_captured) + "}\n";
  api->model_destroy(m);
  if (FILE* f = std::fopen(flags.out.c_str(), "w")) {
    std::fputs(json.c_str(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "cannot write %s\n", flags.out.c_str());
  }
  return ok ? 0 : 1;
}
