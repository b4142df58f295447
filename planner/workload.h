// Workloads and their measurement, without a network: arrival processes, prompt/output length
// distributions, per-request records, latency statistics, goodput and the JSON report (the SVG
// chart of several reports is planner/report_svg.h). The capacity planner's simulator and `tandem
// bench` (tools/bench_runner.h, which sends them to a router) share them. Everything random is
// seeded, so a run repeats.
#ifndef TANDEM_PLANNER_WORKLOAD_H_
#define TANDEM_PLANNER_WORKLOAD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {

// Inter-arrival gaps of an open-loop load, in seconds.
class ArrivalProcess {
 public:
  enum class Kind { kPoisson, kConstant, kGamma };
  // rate in requests/s (> 0). For kGamma, burstiness = 1 is Poisson, < 1 burstier, > 1 more
  // regular (shape = burstiness, mean gap 1/rate), as in vLLM's benchmark.
  ArrivalProcess(Kind kind, double rate, double burstiness, uint64_t seed);
  double NextGap();

 private:
  Kind kind_;
  double rate_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
  std::exponential_distribution<double> exp_;
};

// A distribution of token counts, parsed from a spec:
//   "N" (fixed), "uniform:LO:HI" (inclusive), "lognormal:MEDIAN:SIGMA" (ShareGPT-like; rounded,
//   at least 1), each optionally capped with ":max=M".
class LengthDistribution {
 public:
  static absl::StatusOr<LengthDistribution> Parse(const std::string& spec);
  int Sample(std::mt19937_64& rng) const;
  double Mean(int samples = 20000) const;  // estimated, for reports

 private:
  enum class Kind { kFixed, kUniform, kLogNormal };
  Kind kind_ = Kind::kFixed;
  double a_ = 0, b_ = 0;
  int max_ = 1 << 30;
};

// One request of the workload.
struct WorkItem {
  std::vector<int> prompt;  // token ids
  std::string text;         // or text (from a trace), when prompt is empty
  int output_tokens = 0;
};

// Trace lines: {"prompt_tokens": N, "output_tokens": M} or {"prompt": "text", "output_tokens": M}.
absl::StatusOr<std::vector<WorkItem>> LoadTrace(const std::string& path, int vocab_size,
                                                uint64_t seed);

// Random prompts of the given length: token ids in [3, vocab) (clear of BOS/EOS/UNK).
std::vector<int> RandomPrompt(int length, int vocab_size, std::mt19937_64& rng);

// What happened to one request. Times are seconds since the run started.
struct RequestRecord {
  int id = 0;
  bool warmup = false;
  double sent = 0;
  double first_token = -1;  // -1: never
  double done = 0;
  std::vector<double> token_times;  // arrival time of each streamed message's tokens
  int prompt_tokens = 0;
  int output_tokens = 0;
  int status_code = 0;  // gRPC status code; 0 = OK
  std::string status_message;

  bool ok() const { return status_code == 0; }
  double ttft() const { return first_token - sent; }
  double e2e() const { return done - sent; }
  // Time per output token after the first: (done - first_token) / (output_tokens - 1).
  std::optional<double> tpot() const;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  int count = 0;
};
// Linear interpolation between closest ranks (numpy's default).
Percentiles Summarize(std::vector<double> values);
double Percentile(std::vector<double> values, double q);
// The same of values already in ascending order (no copy, no sort).
double PercentileOfSorted(const std::vector<double>& sorted, double q);

struct Slo {
  double ttft = 0;  // seconds; 0 = no limit
  double tpot = 0;
};

struct BenchSummary {
  int sent = 0, completed = 0, failed = 0;
  std::map<std::string, int> rejected;  // by status name (RESOURCE_EXHAUSTED, ...)
  int rejected_total = 0;
  double duration = 0;  // first send to last completion, measured requests only
  double request_throughput = 0, output_token_throughput = 0, total_token_throughput = 0;
  double goodput = 0;  // requests/s meeting every SLO
  double slo_attainment = 0;
  Percentiles ttft, tpot, itl, e2e;
  int64_t prompt_tokens = 0, output_tokens = 0;
};
// Statuses that count as "rejected" (the server refused to take the request) rather than
// "failed": RESOURCE_EXHAUSTED, UNAVAILABLE before the first token, INVALID_ARGUMENT.
BenchSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo);

// What `tandem bench` sends and measures; the capacity planner's simulator takes the same.
struct BenchConfig {
  std::string router;  // host:port
  // Open loop (rate > 0: arrivals at `rate` req/s) or closed loop (rate == 0: `concurrency`
  // requests in flight at all times).
  double rate = 0;
  ArrivalProcess::Kind arrival = ArrivalProcess::Kind::kPoisson;
  double burstiness = 1.0;
  int concurrency = 8;
  std::string input_len = "128";  // LengthDistribution specs
  std::string output_len = "128";
  // > 0: every request declares this max_tokens (the server must plan for it) and the client
  // ends its stream once the request's output length has arrived, as an answer ends at EOS
  // long before its limit. 0: max_tokens is the output length.
  int max_tokens = 0;
  std::string trace;       // JSONL; overrides the lengths
  int num_requests = 100;  // measured requests (after warm-up)
  double duration = 0;     // > 0: stop sending after this many seconds
  int warmup = 0;          // requests run (and discarded) before measuring
  uint64_t seed = 0;
  float temperature = 0;    // greedy by default; outputs run to their length
  double timeout = 600;     // per request, seconds
  int max_inflight = 1024;  // open loop: sends wait beyond this
  Slo slo;
  bool progress = true;  // live line on stderr

  absl::Status Validate() const;
  nlohmann::json ToJson() const;
};

// The requests of a run (warm-up first), fixed by the seed: from the trace, or with lengths
// drawn from the distributions (output first, then the prompt, clamped so both fit in
// `max_context`) and random prompt ids.
absl::StatusOr<std::vector<WorkItem>> BuildWorkload(const BenchConfig& config, int vocab_size,
                                                    int max_context);

nlohmann::json ToJson(const BenchSummary& s);
nlohmann::json ToJson(const RequestRecord& r);
std::string FormatSummary(const BenchSummary& s);

}  // namespace tandem::bench

#endif  // TANDEM_PLANNER_WORKLOAD_H_
