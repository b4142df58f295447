#include "tools/bench_flags.h"

#include <algorithm>

#include "absl/status/status.h"

namespace tandem {

const std::set<std::string>& BenchWorkloadFlags() {
  static const auto* flags = new std::set<std::string>{
      "rate",         "arrival",  "burstiness", "concurrency",  "input-len",   "output-len",
      "trace",        "duration", "warmup",     "seed",         "temperature", "timeout",
      "max-inflight", "slo-ttft", "slo-tpot",   "num-requests", "max-tokens"};
  return *flags;
}

absl::StatusOr<bench::BenchConfig> BenchConfigFromFlags(const Flags& f) {
  bench::BenchConfig c;
  auto rate = f.GetDouble("rate", 0);
  auto burst = f.GetDouble("burstiness", 1);
  auto conc = f.GetInt("concurrency", 8);
  auto n = f.GetInt("num-requests", 100);
  auto dur = f.GetDouble("duration", 0);
  auto warm = f.GetInt("warmup", 0);
  auto seed = f.GetInt("seed", 0);
  auto temp = f.GetDouble("temperature", 0);
  auto timeout = f.GetDouble("timeout", 600);
  auto inflight = f.GetInt("max-inflight", 1024);
  auto slo_ttft = f.GetDouble("slo-ttft", 0);
  auto slo_tpot = f.GetDouble("slo-tpot", 0);
  auto max_tokens = f.GetInt("max-tokens", 0);
  for (const auto* v : {&rate, &burst, &dur, &temp, &timeout, &slo_ttft, &slo_tpot}) {
    if (!v->ok()) return v->status();
  }
  for (const auto* v : {&conc, &n, &warm, &seed, &inflight, &max_tokens}) {
    if (!v->ok()) return v->status();
  }
  const std::string arrival = f.Get("arrival", "poisson");
  if (arrival == "poisson") {
    c.arrival = bench::ArrivalProcess::Kind::kPoisson;
  } else if (arrival == "constant") {
    c.arrival = bench::ArrivalProcess::Kind::kConstant;
  } else if (arrival == "gamma") {
    c.arrival = bench::ArrivalProcess::Kind::kGamma;
  } else {
    return absl::InvalidArgumentError("--arrival must be poisson, constant or gamma");
  }
  c.rate = *rate;
  c.burstiness = *burst;
  c.concurrency = static_cast<int>(std::clamp<int64_t>(*conc, 0, 1 << 16));
  c.num_requests = static_cast<int>(std::clamp<int64_t>(*n, 0, 1 << 24));
  c.duration = *dur;
  c.warmup = static_cast<int>(std::clamp<int64_t>(*warm, -1, 1 << 20));
  c.seed = static_cast<uint64_t>(*seed);
  c.temperature = static_cast<float>(*temp);
  c.timeout = *timeout;
  c.max_inflight = static_cast<int>(std::clamp<int64_t>(*inflight, 0, 1 << 20));
  c.slo.ttft = *slo_ttft;
  c.slo.tpot = *slo_tpot;
  c.input_len = f.Get("input-len", "128");
  c.output_len = f.Get("output-len", "128");
  c.max_tokens = static_cast<int>(std::clamp<int64_t>(*max_tokens, -1, 1 << 24));
  c.trace = f.Get("trace");
  return c;
}

}  // namespace tandem
