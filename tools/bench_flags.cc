#include "tools/bench_flags.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

std::string Str(double v) { return absl::StrFormat("%g", v); }

// Sets *out to the flag's value when it was given, clamped to [lo, hi].
template <class T>
absl::Status IntFlag(const Flags& f, const char* name, int64_t lo, int64_t hi, T* out) {
  if (!f.Has(name)) return absl::OkStatus();
  auto v = f.GetInt(name);
  if (!v.ok()) return v.status();
  *out = static_cast<T>(std::clamp<int64_t>(*v, lo, hi));
  return absl::OkStatus();
}

template <class T>
absl::Status NumberFlag(const Flags& f, const char* name, T* out) {
  if (!f.Has(name)) return absl::OkStatus();
  auto v = f.GetDouble(name);
  if (!v.ok()) return v.status();
  *out = static_cast<T>(*v);
  return absl::OkStatus();
}

}  // namespace

std::vector<FlagSpec> BenchWorkloadFlags() {
  const bench::BenchConfig d;
  return {
      ValueFlag("rate", "R", Str(d.rate), "Open loop: arrivals per second (0: closed loop)"),
      ValueFlag("arrival", "poisson|constant|gamma", "poisson", "The open loop's arrivals"),
      ValueFlag("burstiness", "B", Str(d.burstiness), "Gamma arrivals: the shape (1: Poisson)"),
      ValueFlag("concurrency", "C", std::to_string(d.concurrency),
                "Closed loop: requests in flight at all times"),
      ValueFlag("input-len", "SPEC", d.input_len, "Prompt lengths"),
      ValueFlag("output-len", "SPEC", d.output_len, "Output lengths"),
      ValueFlag("max-tokens", "N", std::to_string(d.max_tokens),
                "Requests declare max_tokens N and end at their output length (the client stops "
                "reading, as an answer ends at EOS before its limit); 0: the output length"),
      ValueFlag("trace", "FILE.jsonl", d.trace, "Requests from a trace (overrides the lengths)"),
      ValueFlag("num-requests", "N", std::to_string(d.num_requests), "Measured requests"),
      ValueFlag("duration", "S", Str(d.duration), "Stop sending after S seconds (0: no limit)"),
      ValueFlag("warmup", "N", std::to_string(d.warmup), "Requests run first and not measured"),
      ValueFlag("seed", "S", std::to_string(d.seed), "Fixes the lengths, prompts and arrivals"),
      ValueFlag("temperature", "T", Str(d.temperature), "The requests' sampling temperature"),
      ValueFlag("timeout", "S", Str(d.timeout), "Per request, seconds"),
      ValueFlag("max-inflight", "N", std::to_string(d.max_inflight),
                "Open loop: sends wait beyond N in flight"),
      ValueFlag("slo-ttft", "S", Str(d.slo.ttft), "Goodput: time to first token within S"),
      ValueFlag("slo-tpot", "S", Str(d.slo.tpot), "Goodput: time per output token within S"),
  };
}

absl::StatusOr<bench::BenchConfig> BenchConfigFromFlags(const Flags& f) {
  bench::BenchConfig c;
  for (absl::Status s : {
           NumberFlag(f, "rate", &c.rate),
           NumberFlag(f, "burstiness", &c.burstiness),
           IntFlag(f, "concurrency", 0, 1 << 16, &c.concurrency),
           IntFlag(f, "num-requests", 0, 1 << 24, &c.num_requests),
           NumberFlag(f, "duration", &c.duration),
           IntFlag(f, "warmup", -1, 1 << 20, &c.warmup),
           IntFlag(f, "seed", INT64_MIN, INT64_MAX, &c.seed),
           NumberFlag(f, "temperature", &c.temperature),
           NumberFlag(f, "timeout", &c.timeout),
           IntFlag(f, "max-inflight", 0, 1 << 20, &c.max_inflight),
           NumberFlag(f, "slo-ttft", &c.slo.ttft),
           NumberFlag(f, "slo-tpot", &c.slo.tpot),
           IntFlag(f, "max-tokens", -1, 1 << 24, &c.max_tokens),
       }) {
    if (!s.ok()) return s;
  }
  if (f.Has("arrival")) {
    const std::string arrival = f.Get("arrival");
    if (arrival == "poisson") {
      c.arrival = bench::ArrivalProcess::Kind::kPoisson;
    } else if (arrival == "constant") {
      c.arrival = bench::ArrivalProcess::Kind::kConstant;
    } else if (arrival == "gamma") {
      c.arrival = bench::ArrivalProcess::Kind::kGamma;
    } else {
      return absl::InvalidArgumentError("--arrival must be poisson, constant or gamma");
    }
  }
  if (f.Has("input-len")) c.input_len = f.Get("input-len");
  if (f.Has("output-len")) c.output_len = f.Get("output-len");
  if (f.Has("trace")) c.trace = f.Get("trace");
  return c;
}

}  // namespace tandem
