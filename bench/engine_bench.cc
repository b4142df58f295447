// engine_bench: prefill and decode throughput of the CPU engine, against the machine's roofline.
//
// Measures, in the same run, the machine's read bandwidth (every thread streams its part of a
// 1 GiB buffer, far larger than the last-level cache; re-measured before and after every decode
// case, as it drifts on a shared machine) and its float32 FMA peak (every thread runs
// independent 8-lane FMAs on registers). Then, per model and weight dtype:
//   prefill 512: one sequence, one forward call;
//   decode b1 / b32: 1 or 32 sequences with a 64-token context each, one token per sequence per
//   step; decode_b<N>_ctx<C> is N sequences at a C-token context, prefill_<N> an N-token prompt;
//   matmul_b<N>: each distinct (dtype, shape) of the model's matrices multiplied alone by N
//   tokens, as a decode step multiplies them, with the GB/s of weights it streams (one line each).
// Roofline of a case: decode is bounded by (weight bytes + KV bytes read per step) / bandwidth
// and by FLOPs / peak, whichever is slower; prefill by FLOPs / peak. The fraction reported is
// measured tokens/s over that bound. Figures are the best of several repetitions.
//
//   build/bin/engine_bench [--models stories110M,stories260K,PATH] [--dtypes f32,f16,bf16]
//                          [--cases decode_b1,decode_b32,prefill_512,matmul_b1] [--threads N]
//                          [--out bench/results/engine_bench.json]   (--help: the flags)
// A model is a random-weight shape name (tandem model random), stories260K, or a path (a GGUF
// file, an HF directory or a llama2.c checkpoint). A dtype is a --dtype of `tandem generate`
// (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k), or "native": as stored.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv/block_table.h"
#include "engine/kv/kv_cache.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/machine_probe.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Machine limits: cpu::BandwidthMeter and cpu::MeasureFmaPeak (kernels/cpu/machine_probe.h).

// ---------------------------------------------------------------------------------------------
// Cost model of one forward pass.

// Bytes of every matrix a forward pass reads in full (the embedding is only gathered, unless
// it is also the classifier).
double MatrixBytes(const Model& m) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  double bytes = 0;
  auto add = [&](const WeightRef& r) { bytes += double(r.rows) * RowBytes(r.dtype, r.cols); };
  for (const LayerWeights& l : w.layers) {
    for (const WeightRef* r : l.Matrices()) add(*r);
  }
  add(w.classifier);
  (void)c;
  return bytes;
}

// Multiply-add FLOPs of `tokens` new tokens of one sequence after `context` cached positions,
// with logits for the last token only.
double ForwardFlops(const ModelConfig& c, int tokens, int context) {
  const double per_token_matmul = 2.0 * c.n_layers *
                                  (double(c.dim) * c.q_dim() + 2.0 * c.dim * c.kv_dim() +
                                   double(c.q_dim()) * c.dim + 3.0 * c.dim * c.hidden_dim);
  double attended = 0;  // sum over new tokens of the positions each attends to
  for (int t = 0; t < tokens; ++t) attended += context + t + 1;
  const double attention = 2.0 * 2.0 * c.n_layers * c.n_heads * c.head_dim * attended;
  return per_token_matmul * tokens + attention + 2.0 * c.vocab_size * c.dim;
}

// ---------------------------------------------------------------------------------------------
// Timed cases.

std::vector<int> RandomIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(n);
  for (int& t : ids) t = static_cast<int>(rng() % (vocab - 3)) + 3;
  return ids;
}

constexpr int kBlockSize = 16;

// `sequences` block tables of room for `tokens` positions each, in the cache's layer-group layout
// (engine/kv/block_table.h), sequence s taking the s-th run of blocks.
std::vector<std::vector<int>> SequenceTables(const Model& m, int sequences, int tokens) {
  const std::vector<int> first =
      ContiguousTable(KvCacheSpec::For(m.config(), kBlockSize, DType::kF32).table_layout(), tokens);
  std::vector<std::vector<int>> tables(sequences, first);
  for (int s = 0; s < sequences; ++s) {
    for (int& b : tables[s]) b += s * static_cast<int>(first.size());
  }
  return tables;
}

// A cache holding `tables`' blocks, or nullopt after saying why on stderr.
std::optional<KvCache> CacheFor(const Model& m, const std::vector<std::vector<int>>& tables) {
  auto cache =
      KvCache::Create(m.config(), static_cast<int>(tables.size() * tables[0].size()), kBlockSize);
  if (!cache.ok()) {
    std::fprintf(stderr, "KV cache: %s\n", std::string(cache.status().message()).c_str());
    return std::nullopt;
  }
  return std::move(*cache);
}

// A forward pass that failed ends the case (0 tokens/s) after saying why on stderr.
bool Forwarded(const absl::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "forward: %s\n", std::string(s.message()).c_str());
  return s.ok();
}

// Best of `reps` runs of one prefill of `len` tokens, in tokens/s.
double PrefillTokensPerSecond(const Model& m, int len, int reps) {
  const std::vector<std::vector<int>> tables = SequenceTables(m, 1, len);
  std::optional<KvCache> cache = CacheFor(m, tables);
  if (!cache) return 0;
  const auto ids = RandomIds(len, m.config().vocab_size, 1);
  std::vector<float> logits;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    SequenceChunk c{ids, 0, tables[0], false};
    const auto t0 = Clock::now();
    if (!Forwarded(m.Forward({&c, 1}, &*cache, &logits))) return 0;
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return len / best;
}

// `batch` sequences, each prefilled with `context` tokens, then `steps` decode steps, `reps`
// times from the same context; best tokens/s.
double DecodeTokensPerSecond(const Model& m, int batch, int context, int steps, int reps) {
  const std::vector<std::vector<int>> tables = SequenceTables(m, batch, context + steps);
  std::optional<KvCache> cache = CacheFor(m, tables);
  if (!cache) return 0;
  std::vector<std::vector<int>> tokens(batch);
  std::vector<float> logits;
  for (int s = 0; s < batch; ++s) {
    tokens[s] = RandomIds(context + steps, m.config().vocab_size, 100 + s);
    SequenceChunk c{std::span<const int>(tokens[s]).subspan(0, context), 0, tables[s], false};
    if (!Forwarded(m.Forward({&c, 1}, &*cache, &logits))) return 0;
  }
  std::vector<SequenceChunk> chunks(batch);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int step = 0; step < steps; ++step) {
      const int pos = context + step;
      for (int s = 0; s < batch; ++s) {
        chunks[s] = {std::span<const int>(tokens[s]).subspan(pos, 1), pos, tables[s], false};
      }
      if (!Forwarded(m.Forward(chunks, &*cache, &logits))) return 0;
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return static_cast<double>(batch) * steps / best;
}

struct Machine {
  int threads = 1;
  cpu::BandwidthMeter* bandwidth = nullptr;
  double peak_flops = 0;
};

struct Case {
  std::string name;
  double tokens_per_s = 0;
  double roofline_tokens_per_s = 0;
  std::string bound;            // "bandwidth" or "compute"
  double read_bytes_per_s = 0;  // measured around the case (decode only)
  double bytes_per_step = 0;    // weights + KV read per decode step
  double flops_per_token = 0;
  double weight_bytes_per_s = 0;  // matmul cases: the weights' bytes over the call's time
};

// "decode_b<batch>" or "decode_b<batch>_ctx<context>" (context 64 when absent).
bool ParseDecodeCase(const std::string& name, int* batch, int* context) {
  int b = 0, ctx = 64, used = 0;
  if (std::sscanf(name.c_str(), "decode_b%d%n", &b, &used) != 1 || b < 1 || b > 256) return false;
  if (used != static_cast<int>(name.size())) {
    int used2 = 0;
    if (std::sscanf(name.c_str() + used, "_ctx%d%n", &ctx, &used2) != 1 || ctx < 1 || ctx > 32768 ||
        used + used2 != static_cast<int>(name.size())) {
      return false;
    }
  }
  *batch = b;
  *context = ctx;
  return true;
}

// Decode of `batch` sequences at average context `ctx`: the slower of the byte and FLOP bounds.
Case DecodeCase(const Model& m, const Machine& hw, int batch, int context, int steps, int reps) {
  const ModelConfig& c = m.config();
  Case k;
  k.name = "decode_b" + std::to_string(batch);
  if (context != 64) k.name += "_ctx" + std::to_string(context);
  // The larger of the bandwidths measured just before and just after: the stricter roofline.
  const double bw_before = hw.bandwidth->Measure();
  k.tokens_per_s = DecodeTokensPerSecond(m, batch, context, steps, reps);
  k.read_bytes_per_s = std::max(bw_before, hw.bandwidth->Measure());
  const double ctx = context + steps / 2.0;  // positions attended on average
  const double kv_bytes = 2.0 * c.n_layers * ctx * c.kv_dim() * sizeof(float);
  const double step_bytes = MatrixBytes(m) + batch * kv_bytes;
  const double step_flops = batch * ForwardFlops(c, 1, static_cast<int>(ctx) - 1);
  const double t_bw = step_bytes / k.read_bytes_per_s;
  k.bytes_per_step = step_bytes;
  k.flops_per_token = step_flops / batch;
  const double t_fl = hw.peak_flops > 0 ? step_flops / hw.peak_flops : 0;
  k.bound = t_bw >= t_fl ? "bandwidth" : "compute";
  k.roofline_tokens_per_s = batch / std::max(t_bw, t_fl);
  return k;
}

Case PrefillCase(const Model& m, const Machine& hw, int len, int reps) {
  Case k;
  k.name = "prefill_" + std::to_string(len);
  k.tokens_per_s = PrefillTokensPerSecond(m, len, reps);
  k.bound = "compute";
  k.flops_per_token = ForwardFlops(m.config(), len, 0) / len;
  k.roofline_tokens_per_s =
      hw.peak_flops > 0 ? len / (ForwardFlops(m.config(), len, 0) / hw.peak_flops) : 0;
  return k;
}

// "matmul_b<N>": the token count, else 0.
int ParseMatmulCase(const std::string& name) {
  int n = 0, used = 0;
  if (std::sscanf(name.c_str(), "matmul_b%d%n", &n, &used) != 1 ||
      used != static_cast<int>(name.size()) || n < 1 || n > 512) {
    return 0;
  }
  return n;
}

// Each distinct (dtype, rows, cols) of the model's matrices (the classifier included), multiplied
// by n tokens on `threads` threads: best of several calls, as GB/s of weights against the
// bandwidth measured around it. Repeats the call for at least ~0.2 s so that short matrices are
// timed over many calls (their weights still come from memory: the set of all of them is
// cycled through a buffer far larger than the last-level cache where one matrix is smaller).
std::vector<Case> MatmulCases(const Model& m, const Machine& hw, int n) {
  std::vector<const WeightRef*> all;
  for (const LayerWeights& l : m.weights().layers) {
    for (const WeightRef* r : l.Matrices()) all.push_back(r);
  }
  all.push_back(&m.weights().classifier);
  std::vector<std::vector<const WeightRef*>> groups;  // one per (dtype, rows, cols), in order
  for (const WeightRef* r : all) {
    auto same = [&](const std::vector<const WeightRef*>& g) {
      return g[0]->dtype == r->dtype && g[0]->rows == r->rows && g[0]->cols == r->cols;
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({r});
    } else {
      it->push_back(r);
    }
  }
  ThreadPool pool(hw.threads);
  std::vector<Case> out;
  for (const auto& g : groups) {
    const WeightRef& w0 = *g[0];
    const double bytes = double(w0.rows) * RowBytes(w0.dtype, w0.cols);
    std::vector<float> x(static_cast<size_t>(n) * w0.cols), y(static_cast<size_t>(n) * w0.rows);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0, 1);
    for (float& v : x) v = normal(rng);
    const double bw_before = hw.bandwidth->Measure();
    // Cycle through every matrix of the group (the layers' copies live at different addresses,
    // so that a call reads its weights from memory, not from a cache the previous call filled).
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      int calls = 0;
      const auto t0 = Clock::now();
      double elapsed = 0;
      do {
        cpu::Matmul(x.data(), *g[calls % g.size()], nullptr, y.data(), n, &pool);
        ++calls;
        elapsed = Seconds(t0, Clock::now());
      } while (elapsed < 0.2 || calls < static_cast<int>(g.size()));
      best = std::min(best, elapsed / calls);
    }
    Case k;
    k.name = "matmul_b" + std::to_string(n) + " " + std::string(DTypeName(w0.dtype)) + " " +
             std::to_string(w0.rows) + "x" + std::to_string(w0.cols);
    k.read_bytes_per_s = std::max(bw_before, hw.bandwidth->Measure());
    k.bytes_per_step = bytes;
    k.tokens_per_s = n / best;
    k.roofline_tokens_per_s = n / (bytes / k.read_bytes_per_s);
    k.bound = "bandwidth";
    k.weight_bytes_per_s = bytes / best;
    out.push_back(k);
  }
  return out;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  std::string models = "stories110M";
  std::string dtypes = "f32,f16,bf16";
  std::string case_names = "decode_b1,decode_b32,prefill_512";
  std::string out_path = "bench/results/engine_bench.json";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: engine_bench [--models M1,M2,...] [--dtypes D1,D2,...] [--cases C1,C2,...]\n"
          "                    [--threads N] [--out FILE.json]\n"
          "  --models   random-weight shapes (stories15M, stories110M, TinyLlama-1.1B, ...),\n"
          "             stories260K, or paths to a GGUF file, HF directory or llama2.c\n"
          "             checkpoint (default stories110M)\n"
          "  --dtypes   f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, or\n"
          "             native (as stored) (default f32,f16,bf16)\n"
          "  --cases    decode_b1, decode_b32, prefill_512 (default all three), or\n"
          "             decode_b<N>_ctx<C> (N sequences at a C-token context), prefill_<N>,\n"
          "             matmul_b<N> (each distinct matrix alone, N tokens: its GB/s)\n"
          "  --threads  CPU threads (default: the cores)\n"
          "  --out      JSON results (default bench/results/engine_bench.json)\n"
          "Prints the ISA the kernels use, the machine's bandwidth and FMA peak, and per case\n"
          "tokens/s against the roofline.\n");
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value (--help)\n", a.c_str());
      return 2;
    }
    if (a == "--models") {
      models = argv[i + 1];
    } else if (a == "--dtypes" || a == "--dtype") {
      dtypes = argv[i + 1];
    } else if (a == "--cases") {
      case_names = argv[i + 1];
    } else if (a == "--threads") {
      threads = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--out") {
      out_path = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown flag %s (--help)\n", a.c_str());
      return 2;
    }
    ++i;
  }
  cpu::BandwidthMeter meter(threads);
  Machine hw;
  hw.threads = threads;
  hw.bandwidth = &meter;
  hw.peak_flops = cpu::MeasureFmaPeak(threads);
  const double first_bw = meter.Measure();
  std::printf(
      "machine: %d threads, isa %s, fp32 FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s now "
      "(re-measured around each decode case)\n",
      threads, cpu::IsaName(cpu::ActiveIsa()), hw.peak_flops / 1e9, first_bw / 1e9);

  auto backend = MakeCpuBackend(threads);
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-12s %-5s %-12s %10s %12s %9s  %-9s %s\n", "model", "dtype", "case", "tok/s",
              "roofline", "fraction", "bound", "GB/s");
  for (const std::string& name : Split(models)) {
    std::string path;
    std::filesystem::path tmp;
    if (name == "stories260K") {
      path = std::string(TANDEM_SHARED_DIR) + "/models/stories260K/stories260K.bin";
    } else if (std::filesystem::exists(name)) {
      path = name;
    } else {
      tmp = std::filesystem::temp_directory_path() / ("tandem_bench_" + std::to_string(::getpid()));
      auto cfg = RandomModelConfig(name);
      if (!cfg.ok() || !WriteRandomModel(*cfg, DType::kF32, 1, tmp.string()).ok()) {
        std::fprintf(stderr, "cannot write the random %s model\n", name.c_str());
        return 1;
      }
      path = tmp.string();
    }
    for (const std::string& dt : Split(dtypes)) {
      std::optional<DType> dtype;
      if (dt != "native") {
        auto parsed = ParseWeightDType(dt);
        if (!parsed.ok()) {
          std::fprintf(stderr, "--dtypes: %s\n", std::string(parsed.status().message()).c_str());
          return 2;
        }
        dtype = *parsed;
      }
      auto model = Model::Load(path, backend.get(), dtype);
      if (!model.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(),
                     std::string(model.status().message()).c_str());
        return 1;
      }
      const Model& m = **model;
      const std::string label = std::filesystem::path(name).filename().string();
      const std::string dlabel =
          dt == "native" ? std::string(DTypeName(m.weights().layers[0].w1.dtype)) : dt;
      const bool small = m.config().dim < 256;
      std::vector<Case> cases;
      for (const std::string& c : Split(case_names)) {
        int batch = 0, context = 64;
        if (ParseDecodeCase(c, &batch, &context)) {
          const int steps = batch == 1 ? (small ? 64 : 16) : (small ? 32 : 8);
          cases.push_back(DecodeCase(m, hw, batch, context, steps,
                                     batch == 1 ? (small ? 5 : 3) : (small ? 5 : 2)));
        } else if (const int n = ParseMatmulCase(c); n > 0) {
          for (Case& k : MatmulCases(m, hw, n)) cases.push_back(std::move(k));
        } else if (int len = 0, used = 0;
                   std::sscanf(c.c_str(), "prefill_%d%n", &len, &used) == 1 &&
                   used == static_cast<int>(c.size()) && len >= 1 && len <= 32768) {
          cases.push_back(PrefillCase(m, hw, len, small ? 10 : 3));
        } else {
          std::fprintf(stderr, "--cases: unknown case %s\n", c.c_str());
          return 2;
        }
      }
      for (const Case& k : cases) {
        const double frac =
            k.roofline_tokens_per_s > 0 ? k.tokens_per_s / k.roofline_tokens_per_s : 0;
        std::printf("%-12s %-5s %-12s %10.1f %12.1f %8.1f%%  %-9s %.1f", label.c_str(),
                    dlabel.c_str(), k.name.c_str(), k.tokens_per_s, k.roofline_tokens_per_s,
                    100 * frac, k.bound.c_str(), k.read_bytes_per_s / 1e9);
        if (k.weight_bytes_per_s > 0)
          std::printf("  (weights at %.1f GB/s)", k.weight_bytes_per_s / 1e9);
        std::printf("\n");
        results.push_back({{"model", label},
                           {"dtype", dlabel},
                           {"case", k.name},
                           {"tokens_per_s", k.tokens_per_s},
                           {"roofline_tokens_per_s", k.roofline_tokens_per_s},
                           {"fraction_of_roofline", frac},
                           {"bound", k.bound},
                           {"read_bandwidth_bytes_per_s", k.read_bytes_per_s},
                           {"bytes_per_step", k.bytes_per_step},
                           {"flops_per_token", k.flops_per_token},
                           {"matrix_bytes", MatrixBytes(m)},
                           {"weight_bytes_per_s", k.weight_bytes_per_s}});
      }
      std::fflush(stdout);
    }
    if (!tmp.empty()) std::filesystem::remove_all(tmp);
  }
  nlohmann::json doc = {{"benchmark", "engine_bench"},
                        {"backend", "cpu"},
                        {"isa", cpu::IsaName(cpu::ActiveIsa())},
                        {"threads", threads},
                        {"read_bandwidth_bytes_per_s_at_start", first_bw},
                        {"fp32_peak_flops", hw.peak_flops},
                        {"results", results}};
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path());
  std::ofstream(out_path) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
