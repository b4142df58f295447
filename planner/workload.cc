#include "planner/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {

ArrivalProcess::ArrivalProcess(Kind kind, double rate, double burstiness, uint64_t seed)
    : kind_(kind),
      rate_(rate),
      rng_(seed),
      gamma_(burstiness, 1.0 / (rate * burstiness)),
      exp_(rate) {}

double ArrivalProcess::NextGap() {
  switch (kind_) {
    case Kind::kPoisson:
      return exp_(rng_);
    case Kind::kConstant:
      return 1.0 / rate_;
    case Kind::kGamma:
      return gamma_(rng_);
  }
  return 1.0 / rate_;
}

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(const std::string& spec) {
  LengthDistribution d;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "length \"%s\": expected N, uniform:LO:HI or lognormal:MEDIAN:SIGMA (optionally "
        ":max=M)",
        spec));
  };
  if (!parts.empty() && absl::StartsWith(parts.back(), "max=")) {
    if (!absl::SimpleAtoi(parts.back().substr(4), &d.max_) || d.max_ < 1) return bad();
    parts.pop_back();
  }
  if (parts.size() == 1) {
    int n;
    if (!absl::SimpleAtoi(parts[0], &n) || n < 1) return bad();
    d.kind_ = Kind::kFixed;
    d.a_ = n;
  } else if (parts.size() == 3 && parts[0] == "uniform") {
    int lo, hi;
    if (!absl::SimpleAtoi(parts[1], &lo) || !absl::SimpleAtoi(parts[2], &hi) || lo < 1 || hi < lo) {
      return bad();
    }
    d.kind_ = Kind::kUniform;
    d.a_ = lo;
    d.b_ = hi;
  } else if (parts.size() == 3 && parts[0] == "lognormal") {
    double median, sigma;
    if (!absl::SimpleAtod(parts[1], &median) || !absl::SimpleAtod(parts[2], &sigma) ||
        !(median >= 1) || !(sigma >= 0)) {
      return bad();
    }
    d.kind_ = Kind::kLogNormal;
    d.a_ = std::log(median);
    d.b_ = sigma;
  } else {
    return bad();
  }
  return d;
}

int LengthDistribution::Sample(std::mt19937_64& rng) const {
  double v = a_;
  switch (kind_) {
    case Kind::kFixed:
      break;
    case Kind::kUniform:
      v = std::uniform_int_distribution<int>(static_cast<int>(a_), static_cast<int>(b_))(rng);
      break;
    case Kind::kLogNormal:
      v = std::round(std::lognormal_distribution<double>(a_, b_)(rng));
      break;
  }
  return std::clamp(static_cast<int>(std::min(v, 1e9)), 1, max_);
}

double LengthDistribution::Mean(int samples) const {
  std::mt19937_64 rng(1);
  double s = 0;
  for (int i = 0; i < samples; ++i) s += Sample(rng);
  return s / samples;
}

std::vector<int> RandomPrompt(int length, int vocab_size, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> tok(3, std::max(3, vocab_size - 1));
  std::vector<int> p(length);
  for (int& t : p) t = tok(rng);
  return p;
}

absl::StatusOr<std::vector<WorkItem>> LoadTrace(const std::string& path, int vocab_size,
                                                uint64_t seed) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open trace %s", path));
  std::mt19937_64 rng(seed);
  std::vector<WorkItem> items;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    auto bad = [&](const char* why) {
      return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", path, lineno, why));
    };
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    WorkItem w;
    if (!j.contains("output_tokens") || !j["output_tokens"].is_number_integer() ||
        j["output_tokens"].get<int64_t>() < 1 || j["output_tokens"].get<int64_t>() > (1 << 20)) {
      return bad("output_tokens must be a positive integer");
    }
    w.output_tokens = j["output_tokens"].get<int>();
    if (j.contains("prompt") && j["prompt"].is_string()) {
      w.text = j["prompt"].get<std::string>();
      if (w.text.empty()) return bad("prompt must not be empty");
    } else if (j.contains("prompt_tokens") && j["prompt_tokens"].is_number_integer() &&
               j["prompt_tokens"].get<int64_t>() >= 1 &&
               j["prompt_tokens"].get<int64_t>() <= (1 << 20)) {
      w.prompt = RandomPrompt(j["prompt_tokens"].get<int>(), vocab_size, rng);
    } else {
      return bad("needs prompt (text) or prompt_tokens (a positive integer)");
    }
    items.push_back(std::move(w));
  }
  if (items.empty()) return absl::InvalidArgumentError(absl::StrFormat("%s: no requests", path));
  return items;
}

absl::Status BenchConfig::Validate() const {
  if (router.empty()) return absl::InvalidArgumentError("--router is required");
  if (rate < 0 || !std::isfinite(rate)) return absl::InvalidArgumentError("--rate must be >= 0");
  if (!(burstiness > 0)) return absl::InvalidArgumentError("--burstiness must be > 0");
  if (rate == 0 && concurrency < 1) return absl::InvalidArgumentError("--concurrency must be >= 1");
  if (num_requests < 1) return absl::InvalidArgumentError("--num-requests must be >= 1");
  if (warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  if (duration < 0) return absl::InvalidArgumentError("--duration must be >= 0");
  if (!(timeout > 0)) return absl::InvalidArgumentError("--timeout must be > 0");
  if (max_inflight < 1) return absl::InvalidArgumentError("--max-inflight must be >= 1");
  if (!(temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (max_tokens < 0) return absl::InvalidArgumentError("--max-tokens must be >= 0");
  if (trace.empty()) {
    if (auto d = LengthDistribution::Parse(input_len); !d.ok()) return d.status();
    if (auto d = LengthDistribution::Parse(output_len); !d.ok()) return d.status();
  }
  return absl::OkStatus();
}

nlohmann::json BenchConfig::ToJson() const {
  const char* kinds[] = {"poisson", "constant", "gamma"};
  return {{"router", router},
          {"mode", rate > 0 ? "open" : "closed"},
          {"rate", rate},
          {"arrival", kinds[static_cast<int>(arrival)]},
          {"burstiness", burstiness},
          {"concurrency", concurrency},
          {"input_len", input_len},
          {"output_len", output_len},
          {"max_tokens", max_tokens},
          {"trace", trace},
          {"num_requests", num_requests},
          {"duration", duration},
          {"warmup", warmup},
          {"seed", seed},
          {"temperature", temperature},
          {"slo_ttft_s", slo.ttft},
          {"slo_tpot_s", slo.tpot}};
}

absl::StatusOr<std::vector<WorkItem>> BuildWorkload(const BenchConfig& c, int vocab_size,
                                                    int max_context) {
  const int total = c.warmup + c.num_requests;
  std::vector<WorkItem> items;
  if (!c.trace.empty()) {
    auto trace = LoadTrace(c.trace, vocab_size, c.seed);
    if (!trace.ok()) return trace.status();
    for (int i = 0; i < total; ++i) items.push_back((*trace)[i % trace->size()]);
    return items;
  }
  auto in = LengthDistribution::Parse(c.input_len);
  if (!in.ok()) return in.status();
  auto out = LengthDistribution::Parse(c.output_len);
  if (!out.ok()) return out.status();
  std::mt19937_64 rng(c.seed);
  for (int i = 0; i < total; ++i) {
    WorkItem w;
    // Leave room for the output within the context.
    const int o = std::min(out->Sample(rng), std::max(1, max_context - 2));
    const int p = std::min(in->Sample(rng), std::max(1, max_context - 1 - o));
    w.prompt = RandomPrompt(p, vocab_size, rng);
    w.output_tokens = o;
    items.push_back(std::move(w));
  }
  return items;
}

std::optional<double> RequestRecord::tpot() const {
  if (!ok() || output_tokens < 2 || first_token < 0) return std::nullopt;
  return (done - first_token) / (output_tokens - 1);
}

double PercentileOfSorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const double pos = q * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return PercentileOfSorted(v, q);
}

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.count = static_cast<int>(v.size());
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  p.p50 = PercentileOfSorted(v, 0.5);
  p.p90 = PercentileOfSorted(v, 0.9);
  p.p99 = PercentileOfSorted(v, 0.99);
  p.max = v.back();
  return p;
}

namespace {
const char* StatusName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}
}  // namespace

BenchSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo) {
  BenchSummary s;
  std::vector<double> ttft, tpot, itl, e2e;
  double start = 1e300, end = 0;
  int good = 0;
  for (const auto& r : records) {
    if (r.warmup) continue;
    ++s.sent;
    start = std::min(start, r.sent);
    end = std::max(end, r.done);
    if (r.ok()) {
      ++s.completed;
      s.prompt_tokens += r.prompt_tokens;
      s.output_tokens += r.output_tokens;
      if (r.first_token >= 0) ttft.push_back(r.ttft());
      const auto t = r.tpot();
      if (t) tpot.push_back(*t);
      e2e.push_back(r.e2e());
      for (size_t i = 1; i < r.token_times.size(); ++i) {
        itl.push_back(r.token_times[i] - r.token_times[i - 1]);
      }
      const bool meets = (slo.ttft <= 0 || (r.first_token >= 0 && r.ttft() <= slo.ttft)) &&
                         (slo.tpot <= 0 || !t || *t <= slo.tpot);
      good += meets;
    } else {
      const bool rejected =
          r.status_code == 8 || r.status_code == 3 || (r.status_code == 14 && r.first_token < 0);
      if (rejected) {
        ++s.rejected[StatusName(r.status_code)];
        ++s.rejected_total;
      } else {
        ++s.failed;
      }
    }
  }
  s.duration = end > start ? end - start : 0;
  if (s.duration > 0) {
    s.request_throughput = s.completed / s.duration;
    s.output_token_throughput = s.output_tokens / s.duration;
    s.total_token_throughput = (s.prompt_tokens + s.output_tokens) / s.duration;
    s.goodput = good / s.duration;
  }
  s.slo_attainment = s.sent > 0 ? static_cast<double>(good) / s.sent : 0;
  s.ttft = Summarize(ttft);
  s.tpot = Summarize(tpot);
  s.itl = Summarize(itl);
  s.e2e = Summarize(e2e);
  return s;
}

namespace {
nlohmann::json ToJson(const Percentiles& p) {
  return {{"count", p.count}, {"mean", p.mean}, {"p50", p.p50},
          {"p90", p.p90},     {"p99", p.p99},   {"max", p.max}};
}
}  // namespace

nlohmann::json ToJson(const BenchSummary& s) {
  return {{"sent", s.sent},
          {"completed", s.completed},
          {"failed", s.failed},
          {"rejected", s.rejected},
          {"rejected_total", s.rejected_total},
          {"duration_s", s.duration},
          {"request_throughput", s.request_throughput},
          {"output_token_throughput", s.output_token_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"goodput", s.goodput},
          {"slo_attainment", s.slo_attainment},
          {"prompt_tokens", s.prompt_tokens},
          {"output_tokens", s.output_tokens},
          {"ttft_s", ToJson(s.ttft)},
          {"tpot_s", ToJson(s.tpot)},
          {"itl_s", ToJson(s.itl)},
          {"e2e_s", ToJson(s.e2e)}};
}

nlohmann::json ToJson(const RequestRecord& r) {
  return {{"id", r.id},
          {"warmup", r.warmup},
          {"sent", r.sent},
          {"first_token", r.first_token},
          {"done", r.done},
          {"prompt_tokens", r.prompt_tokens},
          {"output_tokens", r.output_tokens},
          {"status", StatusName(r.status_code)},
          {"message", r.status_message},
          {"token_times", r.token_times}};
}

std::string FormatSummary(const BenchSummary& s) {
  std::string rejected;
  for (const auto& [name, n] : s.rejected) rejected += absl::StrFormat(" %s=%d", name, n);
  auto row = [](const char* name, const Percentiles& p) {
    return absl::StrFormat("  %-5s ms   mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f  (n=%d)\n",
                           name, p.mean * 1e3, p.p50 * 1e3, p.p90 * 1e3, p.p99 * 1e3, p.count);
  };
  return absl::StrFormat(
             "requests: sent %d, completed %d, rejected %d%s, failed %d\n"
             "duration %.2f s; %.2f req/s, %.1f output tok/s, %.1f total tok/s\n"
             "goodput %.2f req/s (SLO attainment %.1f%%)\n",
             s.sent, s.completed, s.rejected_total, rejected, s.failed, s.duration,
             s.request_throughput, s.output_token_throughput, s.total_token_throughput, s.goodput,
             100 * s.slo_attainment) +
         row("TTFT", s.ttft) + row("TPOT", s.tpot) + row("ITL", s.itl) + row("E2E", s.e2e);
}

}  // namespace tandem::bench
