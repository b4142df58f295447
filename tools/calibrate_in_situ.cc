#include "tools/calibrate_in_situ.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "metrics/scrape.h"
#include "planner/calibrate.h"
#include "planner/parallel.h"
#include "planner/simulator.h"
#include "planner/workload.h"
#include "tools/bench_runner.h"
#include "tools/calibrate_in_situ_internal.h"
#include "tools/remote.h"
#include "tools/server_process.h"

namespace tandem {
namespace {

using in_situ_internal::ConfigOf;
using in_situ_internal::FiguresOf;
using in_situ_internal::SamplesOf;
using in_situ_internal::ToJson;

// The processes of the calibration cluster, stopped (SIGTERM, then SIGKILL after 5 s) however
// the calibration ends.
class LocalProcesses {
 public:
  ~LocalProcesses() { StopProcesses(pids_); }
  absl::StatusOr<ServerProcess> Start(const std::string& binary,
                                      const std::vector<std::string>& args) {
    ServerProcess p = StartServerProcess(binary, args);
    if (p.pid > 0) pids_.push_back(p.pid);
    if (p.address.empty() || p.metrics.empty()) {
      return absl::UnavailableError(
          absl::StrFormat("calibrate: %s %s did not start", binary, args.empty() ? "" : args[0]));
    }
    return p;
  }

 private:
  std::vector<pid_t> pids_;
};

// The rate of the workloads "alone" (concurrency 1), requests/s.
constexpr double kAloneRate = 4;
// Between two draws of a closed loop: the workers go idle, and the seed stride keeps each draw's
// prompts out of the prefill worker's prefix cache (the workloads' own seeds differ by less).
constexpr int kDrawPauseMs = 500;
constexpr int kDrawSeedStride = 100000;

// The workloads: closed loops of fixed lengths, so that every decode step's shape is known.
// Concurrency 1 is an open loop at kAloneRate instead: the workers idle between requests, as a
// lightly loaded service's do (threads asleep, caches cold), which back-to-back requests would
// hide. Short and long prompts alone, four at a time, eight of a mid length. A closed loop's
// clients start together, so its first requests queue behind one another's prefills until the
// clients fall out of step (5-6 requests each on this machine): 36-48 requests were half that
// start, and their TTFT p50 fell in one mode or the other by chance (23 to 59 ms between runs
// of the validation's four clients); 144 and 192 requests, the first two per client left out,
// measure the loop as it runs.
std::vector<InSituRun> Workloads(int ctx) {
  const int out = std::clamp(ctx / 8, 8, 64);
  const int longer = std::min(ctx / 2, ctx - out - 1);
  const int mid = std::min(ctx / 4, ctx - out - 1);
  // The requests alone (concurrency 1) give the hops' jitter from their p90 - p50: 60 of them
  // (15 s at 4/s), as the p90 of 24 (the third largest) moved with a moment's load of the host.
  std::vector<InSituRun> w(5);
  for (auto [i, concurrency, input, requests] : {std::tuple{0, 1, 16, 60},
                                                 {1, 1, longer, 60},
                                                 {2, 4, 16, 144},
                                                 {3, 4, longer, 144},
                                                 {4, 8, mid, 192}}) {
    w[i].concurrency = concurrency;
    w[i].input = input;
    w[i].output = out;
    w[i].requests = requests;
    w[i].warmup = concurrency > 1 ? 2 * concurrency : 2;
  }
  return w;
}

// The client's figures as a report stores them (under "measured" and "simulated").
constexpr std::pair<const char*, double ClientFigures::*> kFigureKeys[] = {
    {"ttft_p50_s", &ClientFigures::ttft50}, {"ttft_p90_s", &ClientFigures::ttft90},
    {"tpot_p50_s", &ClientFigures::tpot50}, {"tpot_p90_s", &ClientFigures::tpot90},
    {"gap_p50_s", &ClientFigures::gap50},   {"gap_p90_s", &ClientFigures::gap90}};

// Throws nlohmann::json::exception on a missing or non-numeric figure.
ClientFigures ClientFiguresFromJson(const nlohmann::json& j) {
  ClientFigures f;
  for (const auto& [key, member] : kFigureKeys) f.*member = j.at(key).get<double>();
  return f;
}

// The mean of several runs' figures, quantile by quantile (as the validation holds a prediction
// against the mean of measured runs).
ClientFigures MeanOf(const std::vector<ClientFigures>& runs) {
  ClientFigures mean;
  for (const ClientFigures& f : runs) {
    for (const auto& [key, member] : kFigureKeys) {
      mean.*member += f.*member / static_cast<double>(runs.size());
    }
  }
  return mean;
}

struct Histogram {
  double sum = 0, count = 0, extra = 0;  // extra: a companion histogram's sum (batch sizes)
};

absl::StatusOr<Histogram> Read(const std::string& metrics, const std::string& name,
                               const std::string& companion) {
  auto text = HttpGet(metrics, "/metrics");
  if (!text.ok()) return text.status();
  const auto samples = ParseMetricsText(*text);
  Histogram h;
  h.sum = MetricValue(samples, name + "_sum");
  h.count = MetricValue(samples, name + "_count");
  if (!companion.empty()) h.extra = MetricValue(samples, companion + "_sum");
  if (h.sum < 0 || h.count < 0 || h.extra < 0) {
    return absl::NotFoundError(absl::StrFormat("calibrate: %s missing from %s", name, metrics));
  }
  return h;
}

}  // namespace

namespace in_situ_internal {

nlohmann::json ToJson(const ClientFigures& f) {
  nlohmann::json j;
  for (const auto& [key, member] : kFigureKeys) j[key] = f.*member;
  return j;
}

ClientFigures FiguresOf(const std::vector<bench::RequestRecord>& records) {
  const bench::BenchSummary s = bench::Summarize(records, {});
  std::vector<double> gap;
  for (const bench::RequestRecord& r : records) {
    if (!r.warmup && r.ok() && r.token_times.size() >= 2) {
      gap.push_back(r.token_times[1] - r.token_times[0]);
    }
  }
  std::sort(gap.begin(), gap.end());
  return {s.ttft.p50,
          s.ttft.p90,
          s.tpot.p50,
          s.tpot.p90,
          bench::PercentileOfSorted(gap, 0.5),
          bench::PercentileOfSorted(gap, 0.9)};
}

// Each workload has its own seed: the same prompts twice would hit the prefill worker's prefix
// cache.
bench::BenchConfig ConfigOf(const InSituRun& w, const std::string& router) {
  bench::BenchConfig b;
  b.router = router;
  b.rate = w.concurrency == 1 ? kAloneRate : 0;
  b.concurrency = w.concurrency;
  b.input_len = std::to_string(w.input);
  b.output_len = std::to_string(w.output);
  b.num_requests = w.requests;
  b.warmup = w.warmup;
  b.seed = 1 + 1000 * w.concurrency + w.input;
  b.progress = false;
  b.timeout = 120;
  return b;
}

// The steps of one run as the cost model sees them: `batch` sequences (rounded; their total
// context kept) at the mean context of a request's decode, its prompt and half its output; and
// the prompts of a prefill step (every prompt is `input` tokens, one chunk, so the mean tokens
// per step give how many).
std::pair<planner::StepSample, planner::StepSample> SamplesOf(const InSituOptions& o,
                                                              const InSituRun& r) {
  planner::StepSample s;
  s.model = o.model;
  s.config = o.config;
  s.weight_bytes = o.weight_bytes;
  const int seqs = std::max(1, static_cast<int>(std::lround(r.decode_batch)));
  const double context = (r.input + r.output / 2.0) * r.decode_batch / seqs;
  s.batch.assign(seqs, planner::ChunkShape{static_cast<int>(std::lround(context)), 1});
  s.seconds = r.decode_step_s;
  planner::StepSample ps = s;
  const double tokens = r.prefill_tokens_per_step;
  const int prompts = std::max(1, static_cast<int>(std::lround(tokens / r.input)));
  ps.batch.assign(prompts, planner::ChunkShape{
                               0, std::max(1, static_cast<int>(std::lround(tokens / prompts)))});
  ps.seconds = r.prefill_step_s;
  return {s, ps};
}

}  // namespace in_situ_internal

absl::StatusOr<std::vector<InSituRun>> MeasureInSitu(const InSituOptions& o) {
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  const int ctx = o.config.max_seq_len;
  if (ctx < 64) return absl::InvalidArgumentError("calibrate: the model's context is under 64");
  std::vector<InSituRun> runs = Workloads(ctx);

  // The cluster: one router, one prefill and one decode worker, as `tandem up` starts them.
  LocalProcesses procs;
  const std::string bin = o.server_binary.empty() ? DefaultServerBinary() : o.server_binary;
  auto secret = LocalClusterSecret::Make();
  if (!secret.ok()) return secret.status();
  std::vector<std::string> common = {"--model", o.model, "--cluster-secret-file",
                                     (*secret)->file()};
  if (!o.tokenizer.empty()) common.insert(common.end(), {"--tokenizer", o.tokenizer});
  std::vector<std::string> router_args = {"--role=router", "--port", "0"};
  router_args.insert(router_args.end(), common.begin(), common.end());
  auto router = procs.Start(bin, router_args);
  if (!router.ok()) return router.status();
  std::vector<ServerProcess> workers;
  for (const char* role : {"--role=prefill", "--role=decode"}) {
    std::vector<std::string> args = {role, "--router", router->internal};
    args.insert(args.end(), common.begin(), common.end());
    auto w = procs.Start(bin, args);
    if (!w.ok()) return w.status();
    workers.push_back(*w);
  }
  const std::string& prefill_metrics = workers[0].metrics;
  const std::string& decode_metrics = workers[1].metrics;
  if (!WaitForWorkers(router->internal, 2, (*secret)->auth())) {
    return absl::UnavailableError("calibrate: the workers did not register within 60 s");
  }

  // Each workload through the router, with the workers' step histograms around it. A closed
  // loop runs `closed_loop_draws` times (default once: long enough that its start, left out as
  // warm-up, no longer decides its TTFT p50; see Workloads), each after a pause with prompts of
  // its own, the fit taking the draws' mean.
  for (InSituRun& w : runs) {
    auto d0 = Read(decode_metrics, "tandem_decode_step_seconds", "tandem_decode_batch_size");
    auto p0 = Read(prefill_metrics, "tandem_prefill_step_seconds", "tandem_prefill_batch_tokens");
    if (!d0.ok()) return d0.status();
    if (!p0.ok()) return p0.status();
    const int draws = w.concurrency > 1 ? std::max(1, o.closed_loop_draws) : 1;
    std::vector<bench::RequestRecord> records;  // every draw's
    w.draws.clear();
    for (int draw = 0; draw < draws; ++draw) {
      if (draw > 0) std::this_thread::sleep_for(std::chrono::milliseconds(kDrawPauseMs));
      bench::BenchConfig config = ConfigOf(w, router->address);
      config.seed += kDrawSeedStride * draw;
      auto run = bench::RunBench(config);
      if (!run.ok()) return run.status();
      if (run->summary.completed < w.requests) {
        return absl::UnavailableError(absl::StrFormat("calibrate: %d of %d requests completed",
                                                      run->summary.completed, w.requests));
      }
      w.draws.push_back(FiguresOf(run->records));
      records.insert(records.end(), std::make_move_iterator(run->records.begin()),
                     std::make_move_iterator(run->records.end()));
    }
    auto d1 = Read(decode_metrics, "tandem_decode_step_seconds", "tandem_decode_batch_size");
    auto p1 = Read(prefill_metrics, "tandem_prefill_step_seconds", "tandem_prefill_batch_tokens");
    if (!d1.ok()) return d1.status();
    if (!p1.ok()) return p1.status();
    w.decode_steps = d1->count - d0->count;
    if (w.decode_steps < 1) return absl::InternalError("calibrate: the decode worker ran no step");
    w.decode_step_s = (d1->sum - d0->sum) / w.decode_steps;
    w.decode_batch = (d1->extra - d0->extra) / w.decode_steps;
    // The decode factors are fitted to the forward pass (the metric). What the loop adds to it
    // (sampling, bookkeeping, handing tokens to the streams) is the relay's CPU per token in
    // the simulator, fitted to TPOT: fitting the factors to the loop's wall time too counted it
    // twice (TPOT 15-30% high). The wall time (every running request gets one token a step, so
    // a request's mean interval after its second token) is reported beside it.
    double wall = 0;
    int spans = 0;
    for (const bench::RequestRecord& r : records) {
      const size_t n = r.token_times.size();
      if (r.warmup || !r.ok() || n < 3) continue;
      wall += (r.token_times.back() - r.token_times[1]) / static_cast<double>(n - 2);
      ++spans;
    }
    if (spans == 0) return absl::InternalError("calibrate: no request streamed 3 tokens");
    w.decode_loop_step_s = wall / spans;
    const double prefill_steps = p1->count - p0->count;
    if (prefill_steps < 1) return absl::InternalError("calibrate: the prefill worker ran no step");
    w.prefill_step_s = (p1->sum - p0->sum) / prefill_steps;
    w.prefill_tokens_per_step = (p1->extra - p0->extra) / prefill_steps;
    w.measured = MeanOf(w.draws);
    log(absl::StrFormat(
        "in situ: concurrency %d, %d + %d tokens (%d draw%s): decode step %.3f ms (loop %.3f ms) "
        "at batch %.2f, prefill step %.3f ms; TTFT p50 %.3f ms, TPOT p50 %.3f ms",
        w.concurrency, w.input, w.output, draws, draws > 1 ? "s" : "", w.decode_step_s * 1e3,
        w.decode_loop_step_s * 1e3, w.decode_batch, w.prefill_step_s * 1e3, w.measured.ttft50 * 1e3,
        w.measured.tpot50 * 1e3));
  }
  return runs;
}

absl::StatusOr<std::vector<InSituRun>> InSituRunsFromReport(const nlohmann::json& in_situ) {
  if (!in_situ.is_object() || !in_situ.contains("workloads") || !in_situ["workloads"].is_array() ||
      in_situ["workloads"].empty()) {
    return absl::InvalidArgumentError("refit: the report has no in_situ.workloads");
  }
  std::vector<InSituRun> runs;
  for (const nlohmann::json& w : in_situ["workloads"]) {
    InSituRun r;
    try {
      r.concurrency = w.at("concurrency").get<int>();
      r.input = w.at("input").get<int>();
      r.output = w.at("output").get<int>();
      r.decode_steps = w.at("decode_steps").get<double>();
      r.decode_step_s = w.at("decode_step_s").get<double>();
      r.decode_batch = w.at("decode_batch").get<double>();
      r.decode_loop_step_s = w.value("decode_loop_step_s", 0.0);
      r.prefill_step_s = w.at("prefill_step_s").get<double>();
      r.prefill_tokens_per_step = w.at("prefill_tokens_per_step").get<double>();
      r.measured = ClientFiguresFromJson(w.at("measured"));
      if (w.contains("measured_draws")) {
        for (const nlohmann::json& d : w.at("measured_draws")) {
          r.draws.push_back(ClientFiguresFromJson(d));
        }
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("refit: in_situ.workloads[%d]: %s", runs.size(), e.what()));
    }
    // Reports before the request count was written ran Workloads(): 60 alone, 48 at 4, 64 at 8.
    r.requests = w.value("requests", r.concurrency == 1 ? 60 : r.concurrency == 4 ? 48 : 64);
    r.warmup = w.value("warmup", 2);  // reports before it was written: 2
    if (r.concurrency < 1 || r.input < 1 || r.output < 1 || r.requests < 1 || r.warmup < 0 ||
        r.warmup >= r.requests || r.decode_step_s <= 0 || r.decode_batch <= 0 ||
        r.prefill_step_s <= 0 || r.prefill_tokens_per_step <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("refit: in_situ.workloads[%d] is not a measured run", runs.size()));
    }
    runs.push_back(r);
  }
  return runs;
}

absl::StatusOr<std::vector<InSituRun>> MergeInSituRuns(
    const std::vector<std::vector<InSituRun>>& calibrations) {
  if (calibrations.empty()) return absl::InvalidArgumentError("merge: no calibrations");
  if (calibrations.size() == 1) return calibrations[0];  // a report refitted as it is
  const std::vector<InSituRun>& first = calibrations[0];
  for (size_t c = 1; c < calibrations.size(); ++c) {
    if (calibrations[c].size() != first.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("merge: calibration %d has %d workloads, the first %d", c,
                          calibrations[c].size(), first.size()));
    }
    for (size_t i = 0; i < first.size(); ++i) {
      const InSituRun& a = first[i];
      const InSituRun& b = calibrations[c][i];
      if (a.concurrency != b.concurrency || a.input != b.input || a.output != b.output ||
          a.requests != b.requests || a.warmup != b.warmup) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "merge: calibration %d's workloads[%d] (concurrency %d, %d + %d tokens, %d requests "
            "after %d warm-up) is not the first's (concurrency %d, %d + %d, %d after %d)",
            c, i, b.concurrency, b.input, b.output, b.requests, b.warmup, a.concurrency, a.input,
            a.output, a.requests, a.warmup));
      }
    }
  }
  const double n = static_cast<double>(calibrations.size());
  std::vector<InSituRun> merged = first;
  for (size_t i = 0; i < first.size(); ++i) {
    InSituRun& m = merged[i];
    m.decode_steps = m.decode_step_s = m.decode_batch = m.decode_loop_step_s = 0;
    m.prefill_step_s = m.prefill_tokens_per_step = 0;
    m.draws.clear();
    std::vector<ClientFigures> figures;
    for (const std::vector<InSituRun>& runs : calibrations) {
      const InSituRun& r = runs[i];
      m.decode_steps += r.decode_steps;
      m.decode_step_s += r.decode_step_s / n;
      m.decode_batch += r.decode_batch / n;
      m.decode_loop_step_s += r.decode_loop_step_s / n;
      m.prefill_step_s += r.prefill_step_s / n;
      m.prefill_tokens_per_step += r.prefill_tokens_per_step / n;
      figures.push_back(r.measured);
      if (r.draws.empty()) {
        m.draws.push_back(r.measured);
      } else {
        m.draws.insert(m.draws.end(), r.draws.begin(), r.draws.end());
      }
    }
    m.measured = MeanOf(figures);
  }
  return merged;
}

std::vector<double> InSituStepTimeRatios(const std::vector<std::vector<InSituRun>>& calibrations,
                                         const std::vector<InSituRun>& merged) {
  std::vector<double> log_sum(calibrations.size(), 0);
  int terms = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    for (double InSituRun::*step : {&InSituRun::decode_step_s, &InSituRun::prefill_step_s}) {
      const double mean = merged[i].*step;
      if (!(mean > 0)) continue;
      for (size_t c = 0; c < calibrations.size(); ++c) {
        log_sum[c] += std::log(std::max(calibrations[c][i].*step, 1e-12) / mean);
      }
      ++terms;
    }
  }
  std::vector<double> ratios;
  for (double s : log_sum) ratios.push_back(terms > 0 ? std::exp(s / terms) : 1.0);
  return ratios;
}

absl::Status CalibrateInSitu(const InSituOptions& o, planner::HardwareProfile* profile,
                             nlohmann::json* report) {
  auto runs = MeasureInSitu(o);
  if (!runs.ok()) return runs.status();
  return FitInSitu(o, *runs, profile, report);
}

}  // namespace tandem
