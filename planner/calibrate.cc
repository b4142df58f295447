#include "planner/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/kv/kv_cache.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "engine/sampling/sampler.h"
#include "kernels/backend.h"
#include "kernels/cpu/machine_probe.h"

namespace tandem::planner {

HardwareProfile LocalBaseProfile(int threads) {
  HardwareProfile p;
  p.name = "local";
  cpu::BandwidthMeter meter(threads, int64_t{256} << 20);
  p.mem_bandwidth = meter.Measure();
  p.peak_flops = cpu::MeasureFmaPeak(threads);
  if (p.peak_flops <= 0) p.peak_flops = 1e9 * threads;  // no AVX2: a nominal 1 GFLOP/s a thread
  const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  p.mem_capacity = pages > 0 && page > 0 ? pages * page : 8e9;
  p.mem_utilization = 0.5;
  p.overlap = false;
  p.weight_bytes = 4;
  p.kv_bytes = 4;  // the CPU backend's cache is float32
  p.act_bytes = 4;
  p.max_tp = 1;
  p.tp_bandwidth = 0;
  p.tp_latency = 0;
  p.kv_link = {"loopback", 2e9, 100e-6};
  p.shared_host = true;
  // Not measured by the step fit: gRPC hops on loopback (decode admission, the prefill call
  // and its reply, the first message to the client) and the relay of each decode token.
  p.request_overhead = 3e-3;
  p.token_overhead = 0.2e-3;
  return p;
}

absl::StatusOr<std::vector<StepSample>> MeasureSteps(const CalibrateOptions& options,
                                                     const std::function<void(std::string)>& log) {
  if (options.models.empty()) return absl::InvalidArgumentError("calibrate: give --model PATH");
  if (options.repeats < 1 || options.repeats > 1000) {
    return absl::InvalidArgumentError("--repeats must be in [1, 1000]");
  }
  std::vector<StepSample> samples;
  int64_t sink = 0;  // keeps the sampled ids alive
  auto backend = MakeCpuBackend(options.threads);
  for (const std::string& path : options.models) {
    auto model = Model::Load(path, backend.get());
    if (!model.ok()) return model.status();
    const ModelConfig& c = (*model)->config();
    const double weight_bytes = DTypeSize((*model)->weights().layers[0].wq.dtype);
    const int ctx = c.max_seq_len;
    // (sequences, new tokens each, context before them, logits for every token)
    std::vector<std::tuple<int, int, int, bool>> cases;
    for (int n : {16, 64, 128, 256, 512}) {
      if (n < ctx) cases.emplace_back(1, n, 0, false);
    }
    if (ctx > 256) cases.emplace_back(1, 128, ctx / 2, false);
    cases.emplace_back(4, std::min(64, ctx / 4), 0, false);
    for (int b : {1, 2, 4, 8, 16, 32, 64}) {
      for (int context : {16, ctx / 4, ctx / 2}) {
        if (context >= 1 && context + 1 < ctx) cases.emplace_back(b, 1, context, false);
      }
    }
    // Speculative decoding's verify steps: 1 + K tokens per sequence, a logit row each.
    for (int b : {1, 8}) {
      for (int k : {4, 8}) {
        if (ctx / 4 + k + 1 < ctx) cases.emplace_back(b, k + 1, ctx / 4, true);
      }
    }
    const int block_size = 16;
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<int> tok(3, std::max(3, c.vocab_size - 1));
    struct Case {
      std::vector<std::vector<int>> ids, tables;
      std::vector<SequenceChunk> batch;
      std::vector<ChunkShape> shapes;
      double best = 1e300;
    };
    std::vector<Case> runs;
    int max_blocks = 1;
    for (const auto& [seqs, tokens, context, all_logits] : cases) {
      const int per_seq = (context + tokens + block_size - 1) / block_size;
      const double kv = 2.0 * c.n_layers * c.kv_dim() * 4.0 * per_seq * block_size * seqs;
      if (kv > options.max_kv_bytes) continue;
      max_blocks = std::max(max_blocks, per_seq * seqs);
      Case k;
      k.ids.resize(seqs);
      k.tables.resize(seqs);
      for (int s = 0; s < seqs; ++s) {
        for (int t = 0; t < tokens; ++t) k.ids[s].push_back(tok(rng));
        for (int b = 0; b < per_seq; ++b) k.tables[s].push_back(s * per_seq + b);
        k.shapes.push_back({context, tokens, all_logits ? tokens : 1});
      }
      runs.push_back(std::move(k));
    }
    for (Case& k : runs) {  // spans into the vectors, now that they stay put
      for (size_t s = 0; s < k.ids.size(); ++s) {
        k.batch.push_back({k.ids[s], k.shapes[s].context, k.tables[s], k.shapes[s].logit_rows > 1});
      }
    }
    // One cache for every case (their contents do not matter), touched: never-written pages
    // would read as the shared zero page.
    auto cache = KvCache::Create(c, max_blocks, block_size);
    if (!cache.ok()) return cache.status();
    const int64_t layer_floats = int64_t{max_blocks} * block_size * c.kv_dim();
    for (int l = 0; l < c.n_layers; ++l) {
      std::fill(cache->k(l), cache->k(l) + layer_floats, 0.01f);
      std::fill(cache->v(l), cache->v(l) + layer_floats, 0.01f);
    }
    std::vector<float> logits;
    SamplingParams greedy;
    greedy.temperature = 0;
    // Rounds over every case rather than repeats of one: each case's repeats then spread over
    // the whole run, so a burst of load from other tenants cannot spoil all of them.
    for (int round = 0; round <= options.repeats; ++round) {
      for (Case& k : runs) {
        const auto t0 = std::chrono::steady_clock::now();
        if (absl::Status s = (*model)->Forward(k.batch, &*cache, &logits); !s.ok()) return s;
        size_t row = 0;  // the workers sample every row
        for (const ChunkShape& sh : k.shapes) {
          for (int j = 0; j < sh.logit_rows; ++j, ++row) {
            sink += Sample(std::span<const float>(logits).subspan(row * c.vocab_size, c.vocab_size),
                           greedy, sh.context + sh.tokens);
          }
        }
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (round > 0) k.best = std::min(k.best, dt);  // round 0 warms caches and pages
      }
    }
    for (const Case& k : runs) {
      StepSample sample;
      sample.model = path;
      sample.config = c;
      sample.weight_bytes = weight_bytes;
      sample.batch = k.shapes;
      sample.seconds = k.best;
      if (log) {
        log(absl::StrFormat("%s: %d seq x %d tokens after %d%s: %.3f ms", path, k.shapes.size(),
                            k.shapes[0].tokens, k.shapes[0].context,
                            k.shapes[0].logit_rows > 1 ? " (verify)" : "", sample.seconds * 1e3));
      }
      samples.push_back(std::move(sample));
    }
  }
  if (sink == -1) return absl::InternalError("unreachable");
  return samples;
}

namespace {

// Solves the weighted least-squares problem on the columns in `mask`; false when singular.
bool SolveSubset(const std::vector<std::array<double, 4>>& x, const std::vector<double>& y,
                 const std::vector<double>& w, int mask, std::array<double, 4>* coef) {
  std::vector<int> cols;
  for (int j = 0; j < 4; ++j) {
    if (mask & (1 << j)) cols.push_back(j);
  }
  const int n = static_cast<int>(cols.size());
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0));
  for (size_t i = 0; i < x.size(); ++i) {
    const double wi = w[i] * w[i];
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < n; ++k) a[r][k] += wi * x[i][cols[r]] * x[i][cols[k]];
      a[r][n] += wi * x[i][cols[r]] * y[i];
    }
  }
  for (int p = 0; p < n; ++p) {
    int best = p;
    for (int r = p + 1; r < n; ++r) {
      if (std::abs(a[r][p]) > std::abs(a[best][p])) best = r;
    }
    std::swap(a[p], a[best]);
    if (std::abs(a[p][p]) < 1e-300) return false;
    for (int r = 0; r < n; ++r) {
      if (r == p) continue;
      const double f = a[r][p] / a[p][p];
      for (int k = p; k <= n; ++k) a[r][k] -= f * a[p][k];
    }
  }
  coef->fill(0);
  for (int r = 0; r < n; ++r) (*coef)[cols[r]] = a[r][n] / a[r][r];
  return true;
}

}  // namespace

absl::StatusOr<HardwareProfile> ProfileFromDeviceBench(const HardwareProfile& base,
                                                       const nlohmann::json& bench,
                                                       const std::string& provenance,
                                                       nlohmann::json* fit_report) {
  auto field = [&](const nlohmann::json& o, const char* key) -> absl::StatusOr<double> {
    if (!o.is_object() || !o.contains(key) || !o[key].is_number() || !(o[key].get<double>() > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("device bench: \"%s\" must be a positive number", key));
    }
    return o[key].get<double>();
  };
  auto layers = field(bench, "layers");
  if (!layers.ok()) return layers.status();
  auto config = RandomModelConfig("Llama-3-8B");
  if (!config.ok()) return config.status();
  config->n_layers = static_cast<int>(*layers);
  config->max_seq_len = 1 << 16;
  const std::string kv = bench.value("kv_dtype", std::string("f32"));
  const double kv_bytes = kv == "f32" ? 4 : kv == "bf16" ? 2 : kv == "fp8" ? 1 : 0;
  if (kv_bytes == 0) {
    return absl::InvalidArgumentError("device bench: kv_dtype must be f32, bf16 or fp8");
  }
  std::vector<StepSample> samples;
  auto add = [&](const char* what, std::vector<ChunkShape> batch, double ms) {
    StepSample s;
    s.model = what;
    s.config = *config;
    s.weight_bytes = 2;
    s.batch = std::move(batch);
    s.seconds = ms / 1e3;
    samples.push_back(std::move(s));
  };
  for (const char* part : {"decode", "prefill"}) {
    if (!bench.contains(part) || !bench[part].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("device bench: \"%s\" must be a list", part));
    }
  }
  auto context = field(bench, "context");
  if (!context.ok()) return context.status();
  for (const auto& row : bench["decode"]) {
    auto batch = field(row, "batch");
    auto ms = field(row, "step_ms");
    if (!batch.ok() || !ms.ok()) return batch.ok() ? ms.status() : batch.status();
    add("decode",
        std::vector<ChunkShape>(static_cast<size_t>(*batch),
                                ChunkShape{static_cast<int>(*context), 1, 1}),
        *ms);
  }
  for (const auto& row : bench["prefill"]) {
    auto tokens = field(row, "tokens");
    auto ms = field(row, "ms");
    if (!tokens.ok() || !ms.ok()) return tokens.ok() ? ms.status() : tokens.status();
    add("prefill", {ChunkShape{0, static_cast<int>(*tokens), 1}}, *ms);
  }
  std::string origin = provenance;
  if (origin.empty()) {
    if (!bench.contains("device") || !bench["device"].is_string() ||
        bench["device"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          "device bench: the file names no device; say where it was measured (--provenance)");
    }
    auto text = [&](const char* key) {
      return bench.contains(key) && bench[key].is_string() ? bench[key].get<std::string>()
                                                           : std::string("unknown");
    };
    origin = absl::StrFormat(
        "%s, %s, commit %s: bench/cuda_model_bench (%d layers, context %d, %s KV)", text("device"),
        text("date"), text("commit"), static_cast<int>(*layers), static_cast<int>(*context), kv);
  }
  HardwareProfile fit_base = base;
  fit_base.overlap = false;
  fit_base.kv_bytes = kv_bytes;
  fit_base.has_decode_factors = fit_base.has_prefill_factors = false;
  auto fitted = FitProfile(fit_base, samples, fit_report);
  if (!fitted.ok()) return fitted.status();
  fitted->kv_bytes = base.kv_bytes;
  fitted->provenance = origin;
  return fitted;
}

absl::StatusOr<HardwareProfile> FitProfile(HardwareProfile base,
                                           const std::vector<StepSample>& samples,
                                           nlohmann::json* fit_report) {
  if (samples.size() < 4) {
    return absl::InvalidArgumentError("calibrate: need at least 4 measured steps to fit");
  }
  // Columns: 1, matmul seconds at peak, attention seconds at peak, memory seconds at bandwidth.
  std::vector<std::array<double, 4>> x;
  std::vector<double> y, w;
  for (const StepSample& s : samples) {
    HardwareProfile unit = base;
    unit.weight_bytes = s.weight_bytes;
    unit.matmul_efficiency = unit.attention_efficiency = unit.bandwidth_efficiency = 1;
    unit.step_overhead = 0;
    const StepCost c = CostModel(s.config, unit).Step(s.batch);
    x.push_back({1.0, c.matmul_flops / base.peak_flops, c.attention_flops / base.peak_flops,
                 c.bytes() / base.mem_bandwidth});
    y.push_back(s.seconds);
    w.push_back(s.weight / s.seconds);  // relative error
  }
  // Non-negative least squares over the 15 column subsets: the best fit with no negative
  // coefficient.
  double best_err = 1e300;
  std::array<double, 4> best{};
  for (int mask = 1; mask < 16; ++mask) {
    std::array<double, 4> coef;
    if (!SolveSubset(x, y, w, mask, &coef)) continue;
    if (std::any_of(coef.begin(), coef.end(), [](double v) { return v < 0; })) continue;
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      double pred = 0;
      for (int j = 0; j < 4; ++j) pred += coef[j] * x[i][j];
      err += std::pow((pred - y[i]) * w[i], 2);
    }
    if (err < best_err) {
      best_err = err;
      best = coef;
    }
  }
  if (best_err == 1e300) return absl::InternalError("calibrate: the fit found no solution");
  // A zero coefficient means the term costs nothing measurable: efficiency capped at 1000.
  auto eff = [](double coef) { return coef > 1e-3 ? 1.0 / coef : 1e3; };
  HardwareProfile p = base;
  p.step_overhead = best[0];
  p.matmul_efficiency = eff(best[1]);
  p.attention_efficiency = eff(best[2]);
  p.bandwidth_efficiency = eff(best[3]);
  p.weight_bytes = samples.back().weight_bytes;
  if (fit_report) {
    nlohmann::json rows = nlohmann::json::array();
    double sum_abs = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      HardwareProfile q = p;
      q.weight_bytes = samples[i].weight_bytes;
      const double pred = CostModel(samples[i].config, q).Step(samples[i].batch).seconds;
      const double rel = (pred - samples[i].seconds) / samples[i].seconds;
      sum_abs += std::abs(rel);
      rows.push_back({{"model", samples[i].model},
                      {"sequences", samples[i].batch.size()},
                      {"tokens", samples[i].batch[0].tokens},
                      {"context", samples[i].batch[0].context},
                      {"measured_s", samples[i].seconds},
                      {"predicted_s", pred},
                      {"error", rel}});
    }
    *fit_report = {{"samples", rows}, {"mean_abs_error", sum_abs / samples.size()}};
  }
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  return p;
}

}  // namespace tandem::planner
