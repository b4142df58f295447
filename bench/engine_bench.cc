// engine_bench: prefill and decode throughput of the CPU engine.
//   prefill tokens/s for prompts of 128 and 512 tokens (one sequence, one forward call);
//   decode tokens/s at batch 1, 8 and 32 (each sequence has a 64-token context).
// Models: stories260K (../shared) and a random-weight stories110M-shaped model (f32, written to
// a temporary folder). Prints a table and writes bench/results/engine_bench.json.
//
//   build/bin/engine_bench [--models stories260K,stories110M] [--out
//   bench/results/engine_bench.json]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/model.h"
#include "engine/model_writer.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int> RandomIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(n);
  for (int& t : ids) t = static_cast<int>(rng() % (vocab - 3)) + 3;
  return ids;
}

// Best of `reps` runs of one prefill of `len` tokens.
double PrefillTokensPerSecond(const Model& m, int len, int reps) {
  const int bs = 16;
  const int nb = (len + bs - 1) / bs;
  auto cache = KvCache::Create(m.config(), nb, bs);
  std::vector<int> table(nb);
  for (int i = 0; i < nb; ++i) table[i] = i;
  const auto ids = RandomIds(len, m.config().vocab_size, 1);
  std::vector<float> logits;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    SequenceChunk c{ids, 0, table, false};
    const auto t0 = Clock::now();
    if (!m.Forward({&c, 1}, &*cache, &logits).ok()) return 0;
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return len / best;
}

// `batch` sequences, each prefilled with `context` tokens, then `steps` decode steps.
double DecodeTokensPerSecond(const Model& m, int batch, int context, int steps) {
  const int bs = 16;
  const int per_seq = (context + steps + bs - 1) / bs;
  auto cache = KvCache::Create(m.config(), per_seq * batch, bs);
  std::vector<std::vector<int>> tables(batch), tokens(batch);
  std::vector<float> logits;
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < per_seq; ++i) tables[s].push_back(s * per_seq + i);
    tokens[s] = RandomIds(context + steps, m.config().vocab_size, 100 + s);
    SequenceChunk c{std::span<const int>(tokens[s]).subspan(0, context), 0, tables[s], false};
    if (!m.Forward({&c, 1}, &*cache, &logits).ok()) return 0;
  }
  std::vector<SequenceChunk> chunks(batch);
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    const int pos = context + step;
    for (int s = 0; s < batch; ++s) {
      chunks[s] = {std::span<const int>(tokens[s]).subspan(pos, 1), pos, tables[s], false};
    }
    if (!m.Forward(chunks, &*cache, &logits).ok()) return 0;
  }
  return static_cast<double>(batch) * steps / Seconds(t0, Clock::now());
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  std::string models = "stories260K,stories110M";
  std::string out_path = "bench/results/engine_bench.json";
  std::string shared = TANDEM_SHARED_DIR;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--models") models = argv[i + 1];
    if (a == "--out") out_path = argv[i + 1];
  }
  auto backend = MakeCpuBackend();
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-14s %-6s %10s %10s %10s %10s %10s\n", "model", "dtype", "pf128 t/s", "pf512 t/s",
              "dec b1", "dec b8", "dec b32");
  for (const std::string name : {"stories260K", "stories110M"}) {
    if (models.find(name) == std::string::npos) continue;
    std::string path;
    std::filesystem::path tmp;
    if (name == "stories260K") {
      path = shared + "/models/stories260K/stories260K.bin";
    } else {
      tmp = std::filesystem::temp_directory_path() / ("tandem_bench_" + std::to_string(::getpid()));
      auto cfg = RandomModelConfig(name);
      if (!cfg.ok() || !WriteRandomModel(*cfg, DType::kF32, 1, tmp.string()).ok()) {
        std::fprintf(stderr, "cannot write the random %s model\n", name.c_str());
        return 1;
      }
      path = tmp.string();
    }
    auto model = Model::Load(path, backend.get());
    if (!model.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(model.status().message()).c_str());
      return 1;
    }
    const Model& m = **model;
    const bool small = m.config().dim < 256;
    const double pf128 = PrefillTokensPerSecond(m, 128, small ? 20 : 3);
    const double pf512 = PrefillTokensPerSecond(m, 512, small ? 10 : 2);
    const int steps = small ? 64 : 16;
    const double d1 = DecodeTokensPerSecond(m, 1, 64, steps);
    const double d8 = DecodeTokensPerSecond(m, 8, 64, steps);
    const double d32 = DecodeTokensPerSecond(m, 32, 64, steps);
    std::printf("%-14s %-6s %10.0f %10.0f %10.1f %10.1f %10.1f\n", name.c_str(), "f32", pf128,
                pf512, d1, d8, d32);
    results.push_back({{"model", name},
                       {"dtype", "f32"},
                       {"n_layers", m.config().n_layers},
                       {"dim", m.config().dim},
                       {"prefill_tokens_per_s", {{"128", pf128}, {"512", pf512}}},
                       {"decode_tokens_per_s", {{"1", d1}, {"8", d8}, {"32", d32}}}});
    model->reset();
    if (!tmp.empty()) std::filesystem::remove_all(tmp);
  }
  nlohmann::json doc = {{"benchmark", "engine_bench"},
                        {"backend", "cpu"},
                        {"threads", DefaultThreadPool().num_threads()},
                        {"hardware_concurrency", std::thread::hardware_concurrency()},
                        {"results", results}};
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path());
  std::ofstream(out_path) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
