#include "planner/plan.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "planner/parallel.h"

namespace tandem::planner {

absl::StatusOr<ModelConfig> ResolveModel(const std::string& spec) {
  if (spec.empty()) return absl::InvalidArgumentError("--model is required");
  for (const std::string& name : RandomModelShapes()) {
    if (absl::EqualsIgnoreCase(name, spec)) return RandomModelConfig(name);
  }
  std::ifstream probe(spec);
  if (!probe) {
    std::string names;
    for (const auto& n : RandomModelShapes()) names += " " + n;
    return absl::InvalidArgumentError(absl::StrFormat(
        "--model \"%s\": not a named shape (known:%s) nor a readable config.json, model "
        "directory or checkpoint",
        spec, names));
  }
  if (absl::EndsWith(spec, ".json")) {
    std::stringstream text;
    text << probe.rdbuf();
    auto c = ModelConfig::FromHfJson(text.str());
    if (!c.ok()) {
      return absl::Status(c.status().code(),
                          absl::StrFormat("%s: %s", spec, std::string(c.status().message())));
    }
    return c;
  }
  return LoadModelConfig(spec);
}

absl::Status ParseWorkloadSpec(const std::string& spec, bench::BenchConfig* c) {
  if (absl::EndsWith(spec, ".jsonl")) {
    c->trace = spec;
    return absl::OkStatus();
  }
  bool have_in = false, have_out = false;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--workload \"%s\": expected in=SPEC,out=SPEC[,arrival=KIND][,burstiness=B] or a "
          ".jsonl trace",
          spec));
    }
    const std::string key(part.substr(0, eq)), value(part.substr(eq + 1));
    if (key == "in" || key == "out") {
      if (auto d = bench::LengthDistribution::Parse(value); !d.ok()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("--workload %s: %s", key, std::string(d.status().message())));
      }
      (key == "in" ? c->input_len : c->output_len) = value;
      (key == "in" ? have_in : have_out) = true;
    } else if (key == "arrival") {
      if (value == "poisson") {
        c->arrival = bench::ArrivalProcess::Kind::kPoisson;
      } else if (value == "constant") {
        c->arrival = bench::ArrivalProcess::Kind::kConstant;
      } else if (value == "gamma") {
        c->arrival = bench::ArrivalProcess::Kind::kGamma;
      } else {
        return absl::InvalidArgumentError("--workload arrival: must be poisson, constant or gamma");
      }
    } else if (key == "burstiness") {
      if (!absl::SimpleAtod(value, &c->burstiness) || !(c->burstiness > 0)) {
        return absl::InvalidArgumentError("--workload burstiness: must be a number > 0");
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("--workload: unknown key \"%s\" (in, out, arrival, burstiness)", key));
    }
  }
  if (!have_in || !have_out) {
    return absl::InvalidArgumentError("--workload: needs both in=SPEC and out=SPEC");
  }
  return absl::OkStatus();
}

bool PlanCandidate::Runnable() const {
  return cluster.prefill_tp == 1 && (cluster.colocated || cluster.decode_tp == 1);
}

std::string PlanCandidate::Describe() const {
  if (cluster.colocated) {
    return absl::StrFormat("%d colocated (tp%d)", cluster.prefill, cluster.prefill_tp);
  }
  return absl::StrFormat("%dP(tp%d) + %dD(tp%d)", cluster.prefill, cluster.prefill_tp,
                         cluster.decode, cluster.decode_tp);
}

namespace {

bool Meets(const bench::BenchSummary& s, double attainment) {
  return s.sent > 0 && s.slo_attainment >= attainment;
}

// The highest rate meeting the attainment target: doubling from a low rate, then bisection.
absl::StatusOr<PlanCandidate> Evaluate(const ModelConfig& model, const HardwareProfile& profile,
                                       bench::BenchConfig workload, const ClusterSpec& cluster,
                                       const PlanOptions& options) {
  PlanCandidate c;
  c.cluster = cluster;
  c.gpus = cluster.gpus();
  const int base_requests = workload.num_requests;
  auto run = [&](double rate) -> absl::StatusOr<bench::BenchSummary> {
    workload.rate = rate;
    // Enough requests for `min_seconds` of arrivals: a short burst never reaches the queues'
    // steady state and flatters high rates.
    workload.num_requests = static_cast<int>(
        std::min(1e6, std::max<double>(base_requests, std::ceil(rate * options.min_seconds))));
    ++c.simulations;
    SimOptions sim;
    sim.record_token_times = false;
    auto r = Simulate(model, profile, cluster, workload, sim);
    if (!r.ok()) return r.status();
    return r->summary;
  };
  double lo = 0, hi = 0;
  bench::BenchSummary best;
  for (double rate = 0.125; rate <= options.max_rate; rate *= 2) {
    auto s = run(rate);
    if (!s.ok()) return s.status();
    if (!Meets(*s, options.attainment)) {
      hi = rate;
      break;
    }
    lo = rate;
    best = *s;
  }
  if (lo == 0) return c;  // not even the lowest rate
  if (hi == 0) hi = lo;   // the ceiling holds
  for (int i = 0; i < options.bisection_steps && hi > lo * 1.01; ++i) {
    const double mid = (lo + hi) / 2;
    auto s = run(mid);
    if (!s.ok()) return s.status();
    if (Meets(*s, options.attainment)) {
      lo = mid;
      best = *s;
    } else {
      hi = mid;
    }
  }
  c.max_rate = lo;
  c.goodput_per_gpu = lo / c.gpus;
  c.summary = best;
  return c;
}

}  // namespace

absl::StatusOr<PlanResult> SearchPlans(const ModelConfig& model, const HardwareProfile& profile,
                                       const bench::BenchConfig& workload, const ClusterSpec& base,
                                       const PlanOptions& options) {
  if (options.gpus < 1 || options.gpus > 1024) {
    return absl::InvalidArgumentError("--gpus must be in [1, 1024]");
  }
  if (!(options.attainment > 0 && options.attainment <= 1)) {
    return absl::InvalidArgumentError("--attainment must be in (0, 1]");
  }
  if (workload.slo.ttft <= 0 && workload.slo.tpot <= 0) {
    return absl::InvalidArgumentError("give --slo-ttft and/or --slo-tpot: the search needs an SLO");
  }
  if (profile.shared_host) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "profile %s shares one host between all workers: use `tandem plan simulate` for it",
        profile.name));
  }
  std::vector<int> tps = options.tp;
  if (tps.empty()) tps = {1};
  for (int t : tps) {
    if (t < 1 || t > profile.max_tp) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--tp %d: must be in [1, %d] (the profile's max_tp)", t, profile.max_tp));
    }
  }
  PlanResult result;
  std::vector<ClusterSpec> layouts;
  auto fits = [&](int tp) -> std::string {
    if (model.n_heads % tp != 0)
      return absl::StrFormat("tp%d does not divide %d heads", tp, model.n_heads);
    CostModel cost(model, profile, tp);
    if (cost.KvCapacityBytes() <= 0) {
      return absl::StrFormat("tp%d: %.1f GB of weights per device leave no room for KV", tp,
                             cost.WeightBytesPerDevice() / 1e9);
    }
    return "";
  };
  for (int tp : tps) {
    if (std::string why = fits(tp); !why.empty()) result.skipped.push_back(why);
  }
  for (int tpp : tps) {
    if (!fits(tpp).empty()) continue;
    for (int tpd : tps) {
      if (!fits(tpd).empty()) continue;
      for (int p = 1; p * tpp + tpd <= options.gpus; ++p) {
        for (int d = 1; p * tpp + d * tpd <= options.gpus; ++d) {
          ClusterSpec c = base;
          c.colocated = false;
          c.prefill = p;
          c.decode = d;
          c.prefill_tp = tpp;
          c.decode_tp = tpd;
          layouts.push_back(c);
        }
      }
    }
    if (options.colocated) {
      for (int n = 1; n * tpp <= options.gpus; ++n) {
        ClusterSpec c = base;
        c.colocated = true;
        c.prefill = n;
        c.decode = n;
        c.prefill_tp = c.decode_tp = tpp;
        layouts.push_back(c);
      }
    }
  }
  // Layouts are independent simulations: evaluated on every core, collected in order.
  const int threads = std::clamp<int>(
      options.threads > 0 ? options.threads : std::thread::hardware_concurrency(), 1, 64);
  std::vector<absl::StatusOr<PlanCandidate>> evaluated = EvaluateInParallel<PlanCandidate>(
      layouts.size(), threads,
      [&](size_t i) { return Evaluate(model, profile, workload, layouts[i], options); });
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto& cand = evaluated[i];
    if (!cand.ok()) {
      PlanCandidate named;
      named.cluster = layouts[i];
      result.skipped.push_back(
          absl::StrFormat("%s: %s", named.Describe(), std::string(cand.status().message())));
      continue;
    }
    result.simulations += cand->simulations;
    if (cand->max_rate > 0) result.ranked.push_back(std::move(*cand));
  }
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) {
                     if (a.goodput_per_gpu != b.goodput_per_gpu) {
                       return a.goodput_per_gpu > b.goodput_per_gpu;
                     }
                     return a.gpus < b.gpus;
                   });
  return result;
}

std::string FormatPlanTable(const PlanResult& r, int top) {
  std::string out = absl::StrFormat("%-4s %-24s %4s %10s %12s %10s %10s %10s %10s %7s\n", "rank",
                                    "layout", "gpus", "rate r/s", "goodput/GPU", "TTFT p50",
                                    "TTFT p90", "TPOT p50", "TPOT p90", "SLO %");
  for (int i = 0; i < std::min<int>(top, r.ranked.size()); ++i) {
    const PlanCandidate& c = r.ranked[i];
    const auto& s = c.summary;
    out += absl::StrFormat("%-4d %-24s %4d %10.2f %12.3f %8.1fms %8.1fms %8.2fms %8.2fms %6.1f%%\n",
                           i + 1, c.Describe(), c.gpus, c.max_rate, c.goodput_per_gpu,
                           s.ttft.p50 * 1e3, s.ttft.p90 * 1e3, s.tpot.p50 * 1e3, s.tpot.p90 * 1e3,
                           100 * s.slo_attainment);
  }
  if (r.ranked.empty()) out += "(no layout meets the SLOs at any rate searched)\n";
  const int shown = std::min<int>(top, r.ranked.size());
  if (std::any_of(r.ranked.begin(), r.ranked.begin() + shown,
                  [](const PlanCandidate& c) { return !c.Runnable(); })) {
    out +=
        "tp > 1: modelled only, not runnable (Tandem workers do not implement tensor "
        "parallelism)\n";
  }
  return out;
}

nlohmann::json PlanToJson(const PlanResult& r, int top) {
  nlohmann::json ranked = nlohmann::json::array();
  for (int i = 0; i < std::min<int>(top, r.ranked.size()); ++i) {
    const PlanCandidate& c = r.ranked[i];
    ranked.push_back(
        {{"rank", i + 1},
         {"layout", c.Describe()},
         {"colocated", c.cluster.colocated},
         {"prefill", c.cluster.prefill},
         {"decode", c.cluster.colocated ? c.cluster.prefill : c.cluster.decode},
         {"prefill_tp", c.cluster.prefill_tp},
         {"decode_tp", c.cluster.colocated ? c.cluster.prefill_tp : c.cluster.decode_tp},
         {"gpus", c.gpus},
         {"max_rate", c.max_rate},
         {"goodput_per_gpu", c.goodput_per_gpu},
         {"runnable", c.Runnable()},
         {"summary", bench::ToJson(c.summary)}});
  }
  return {{"ranked", ranked}, {"skipped", r.skipped}, {"simulations", r.simulations}};
}

}  // namespace tandem::planner
