// Fitting a hardware profile to the workloads measured in place (tools/calibrate_in_situ.h):
// each sharing of the host's cores is fitted through the simulator, and the one that reproduces
// the measured figures best is kept.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "planner/calibrate.h"
#include "planner/parallel.h"
#include "planner/simulator.h"
#include "planner/workload.h"
#include "tools/bench_runner.h"
#include "tools/calibrate_in_situ.h"
#include "tools/calibrate_in_situ_internal.h"

namespace tandem {

using in_situ_internal::ConfigOf;
using in_situ_internal::Figures;
using in_situ_internal::FiguresOf;
using in_situ_internal::SamplesOf;
using in_situ_internal::ToJson;

namespace {

// Simulated runs (each its own noise) whose mean a candidate sharing is judged by.
constexpr int kFitRuns = 8;
// The weight of the steps of the requests alone in the step factors' fits (a loaded step's: 1).
constexpr double kAloneWeight = 4;

constexpr size_t kShortest = 0;  // the first run: the shortest prompts alone

// A workload's row of the report (under "workloads"), before its simulated figures.
nlohmann::json WorkloadRow(const InSituRun& w) {
  nlohmann::json row = {{"concurrency", w.concurrency},
                        {"input", w.input},
                        {"output", w.output},
                        {"requests", w.requests},
                        {"warmup", w.warmup},
                        {"decode_steps", w.decode_steps},
                        {"decode_step_s", w.decode_step_s},
                        {"decode_loop_step_s", w.decode_loop_step_s},
                        {"decode_batch", w.decode_batch},
                        {"prefill_step_s", w.prefill_step_s},
                        {"prefill_tokens_per_step", w.prefill_tokens_per_step},
                        {"measured", ToJson(w.measured)}};
  if (!w.draws.empty()) {
    nlohmann::json& draws = row["measured_draws"];
    draws = nlohmann::json::array();
    for (const ClientFigures& f : w.draws) draws.push_back(ToJson(f));
  }
  return row;
}

// The squared log error of a simulated figure against the measured one.
double SquaredLogError(double sim, double meas) {
  const double d = std::log(std::max(sim, 1e-7) / std::max(meas, 1e-7));
  return d * d;
}

// A profile fitted for one sharing of the host, and how well it reproduces the workloads.
struct Candidate {
  planner::HardwareProfile profile;
  double error = 1e300;
  nlohmann::json decode_fit, prefill_fit;
  std::vector<Figures> simulated;  // the workloads under `profile`
};

// How a step shares the host's cores: a decode step keeps `threads` busy; a prefill step with
// `first` > 0 is served first on that many cores, giving way to the rest by `yield`, else like a
// decode step.
struct Sharing {
  double threads, first, yield;
};

// What FitInSitu fits against: the measured workloads, the mean step of each role in each, and
// the grids searched. Its fits only read it, so those of several sharings may run at once.
class InSituFitter {
 public:
  // `profile` (the profile as given: the fits start from it) must outlive the fitter.
  InSituFitter(const InSituOptions& o, const std::vector<InSituRun>& workloads,
               const planner::HardwareProfile& profile)
      : o_(o), workloads_(workloads), profile_(profile) {
    for (const InSituRun& w : workloads) {
      measured_.push_back(Figures{w.measured});
      auto [d, p] = SamplesOf(o, w);
      decode_samples_.push_back(d);
      prefill_samples_.push_back(p);
    }
    // The host: one processor of `cores` cores for the steps, the hops and the relay. A step
    // keeps `step_threads` of them busy (the CPU backend's pool spins between ops; a small
    // model's ops run on one thread), fitted below among 1 to `cores`.
    cores_ = o.host_cores > 0 ? o.host_cores : std::max(1u, std::thread::hardware_concurrency());
    all_.assign(workloads.size(), true);
    only_shortest_.assign(workloads.size(), false);
    only_shortest_[kShortest] = true;
    open_loops_.assign(workloads.size(), false);  // the workloads alone
    for (size_t i = 0; i < workloads.size(); ++i) open_loops_[i] = workloads[i].concurrency == 1;
    // A log grid, 0 then 10 us to 10 ms, for the times; 0 to 1.5 by 0.05 for the step jitter.
    grid_ = {0};
    for (double v = 1e-5; v <= 1.0001e-2; v *= std::pow(10.0, 0.0625)) grid_.push_back(v);
    for (int i = 0; i <= 30; ++i) sigmas_.push_back(0.05 * i);
    // The hops' jitter from the shortest prompts alone: the simulator's TTFT has almost no
    // spread of its own there (fixed lengths, a short prefill), so the measured p90 - p50 is the
    // noise; an exponential's p90 - p50 is its mean times ln 5. A long prompt's TTFT spread is
    // its prefill's noise, which the prefill steps' jitter models in proportion to each step.
    // The first gap's spread starts the decode start's jitter, fitted below.
    ttft_spread_ = std::max(0.0, measured_[kShortest].ttft90 - measured_[kShortest].ttft50);
    gap_spread_ = std::max(0.0, measured_[kShortest].gap90 - measured_[kShortest].gap50);
  }

  double cores() const { return cores_; }

  void Log(const std::string& line) const {
    if (o_.log) o_.log(line);
  }

  // Fits every sharing of `sharings`, on the host's cores at once (the fits are independent:
  // each simulates on its own), then takes them in order, so that the choice is a sequential
  // search's: `*chosen` becomes the first with a lower error than it has.
  absl::Status Consider(const std::vector<Sharing>& sharings, Candidate* chosen) const {
    std::vector<absl::StatusOr<Candidate>> fitted =
        planner::EvaluateInParallel<Candidate>(sharings.size(), /*threads=*/0, [&](size_t i) {
          return FitSharing(sharings[i].threads, sharings[i].first, sharings[i].yield);
        });
    for (size_t i = 0; i < sharings.size(); ++i) {
      if (!fitted[i].ok()) return fitted[i].status();
      const auto [threads, first, yield] = sharings[i];
      Log(absl::StrFormat("  a decode step on %.2f cores, a prefill step %s%.2f%s: error %.3f",
                          threads, first > 0 ? "first on " : "on ", first > 0 ? first : threads,
                          yield > 0 ? absl::StrFormat(" yielding %.2f", yield) : "",
                          fitted[i]->error));
      if (fitted[i]->error < chosen->error) *chosen = *std::move(fitted[i]);
    }
    return absl::OkStatus();
  }

  // Logs the chosen fit's figures against the measured ones and adds them to the report's
  // workload rows.
  void Report(const Candidate& chosen, nlohmann::json* rows) const {
    for (size_t i = 0; i < workloads_.size(); ++i) {
      const Figures& m = measured_[i];
      const Figures& s = chosen.simulated[i];
      (*rows)[i]["simulated"] = ToJson(s);
      (*rows)[i]["simulated"]["decode_step_s"] = s.decode_step;
      (*rows)[i]["simulated"]["prefill_step_s"] = s.prefill_step;
      Log(absl::StrFormat(
          "fitted: concurrency %d, %d + %d tokens: TTFT p50 %.3f/%.3f ms, p90 %.3f/%.3f; TPOT p50 "
          "%.3f/%.3f ms, p90 %.3f/%.3f; steps: decode %.3f/%.3f ms, prefill %.3f/%.3f "
          "(measured/simulated)",
          workloads_[i].concurrency, workloads_[i].input, workloads_[i].output, m.ttft50 * 1e3,
          s.ttft50 * 1e3, m.ttft90 * 1e3, s.ttft90 * 1e3, m.tpot50 * 1e3, s.tpot50 * 1e3,
          m.tpot90 * 1e3, s.tpot90 * 1e3, decode_samples_[i].seconds * 1e3, s.decode_step * 1e3,
          prefill_samples_[i].seconds * 1e3, s.prefill_step * 1e3));
    }
  }

 private:
  // Simulates the workloads marked in `used` (the others' figures stay zero), `runs` times each
  // with its own noise: the figures are the runs' mean.
  absl::Status Simulate(const planner::HardwareProfile& q, std::vector<Figures>* figures,
                        const std::vector<bool>& used, int runs = 1) const {
    figures->assign(workloads_.size(), Figures{});
    planner::HardwareProfile as_stored = q;  // the first model's dtype, as its cluster ran
    as_stored.weight_bytes = o_.weight_bytes;
    for (size_t i = 0; i < workloads_.size(); ++i) {
      if (!used[i]) continue;
      auto all = planner::SimulateRuns(o_.config, as_stored, planner::ClusterSpec{},
                                       ConfigOf(workloads_[i], "simulated"), runs);
      if (!all.ok()) return all.status();
      Figures& f = (*figures)[i];
      const bench::BenchSummary mean = planner::MeanSummary(*all);
      std::tie(f.ttft50, f.ttft90, f.tpot50, f.tpot90) =
          std::tie(mean.ttft.p50, mean.ttft.p90, mean.tpot.p50, mean.tpot.p90);
      f.decode_slowdown = f.prefill_slowdown = 0;
      for (const planner::SimResult& r : *all) {
        const ClientFigures one = FiguresOf(r.records);  // the first gap: not in the summary
        const double n = static_cast<double>(runs);
        f.gap50 += one.gap50 / n;
        f.gap90 += one.gap90 / n;
        f.decode_slowdown +=
            (r.decode_step_alone_seconds > 0 ? r.decode_step_seconds / r.decode_step_alone_seconds
                                             : 1) /
            n;
        f.prefill_slowdown += (r.prefill_step_alone_seconds > 0
                                   ? r.prefill_step_seconds / r.prefill_step_alone_seconds
                                   : 1) /
                              n;
        f.decode_step += r.decode_step_seconds / std::max<int64_t>(1, r.decode_steps) / n;
        f.prefill_step += r.prefill_step_seconds / std::max<int64_t>(1, r.prefill_steps) / n;
      }
    }
    return absl::OkStatus();
  }

  // A search on a grid of values of one parameter (`param`, which points into `q`): the least
  // squared log error of one or two figures over the workloads `used`.
  absl::Status FitOn(const planner::HardwareProfile& q, const std::vector<double>& values,
                     double* param, const std::vector<bool>& used, double Figures::*figure,
                     double Figures::*also) const {
    double best_error = 1e300, best_value = *param;
    std::vector<Figures> f;
    for (double v : values) {
      *param = v;
      if (absl::Status s = Simulate(q, &f, used); !s.ok()) return s;
      double e = 0;
      for (size_t i = 0; i < workloads_.size(); ++i) {
        if (!used[i]) continue;
        e += SquaredLogError(f[i].*figure, measured_[i].*figure);
        if (also != nullptr) e += SquaredLogError(f[i].*also, measured_[i].*also);
      }
      if (e < best_error) {
        best_error = e;
        best_value = v;
      }
    }
    *param = best_value;
    return absl::OkStatus();
  }

  // Fits the request path's parameters of `p`, one by one.
  absl::Status FitRequestPath(planner::HardwareProfile* p) const {
    // The request path, parameter by parameter:
    // - the request overhead (CPU work on the host): the shortest prompts' TTFT p50;
    // - the decode start and its jitter (an idle decode loop's wake-up): the first gap's p50
    //   (and p90 for the jitter) of both open loops. From the shortest prompts alone only, the
    //   simulated first gap came out 0.3-0.9 ms long wherever else the machine measured it
    //   (the long prompts alone: 0.8 ms at p50 against 1.5 for the short ones), and with it
    //   TPOT at low load (the first gap is 1/15 of a 16-token answer's TPOT);
    // - the relay's CPU per token: TPOT p50 of every workload;
    // - the decode steps' jitter (lognormal sigma): TPOT p90 of every workload;
    // - the prefill steps' own: TTFT p50 and p90 of the open loops (a long prompt alone: its TTFT
    //   spread is its prefill's noise; a closed loop's TTFT is how its clients fall in step).
    const struct {
      const std::vector<double>& values;
      double* param;
      const std::vector<bool>& used;
      double Figures::*figure;
      double Figures::*also = nullptr;
    } path[] = {
        {grid_, &p->request_overhead, only_shortest_, &Figures::ttft50},
        {grid_, &p->decode_start_overhead, open_loops_, &Figures::gap50},
        {grid_, &p->decode_start_jitter, open_loops_, &Figures::gap90, &Figures::gap50},
        {grid_, &p->sample_cpu, open_loops_, &Figures::tpot50},
        {grid_, &p->relay_cpu, all_, &Figures::tpot50},
        {sigmas_, &p->step_jitter, all_, &Figures::tpot90},
        // Both quantiles: a mean-one noise that only widened p90 would lower p50.
        {sigmas_, &p->prefill_step_jitter, open_loops_, &Figures::ttft90, &Figures::ttft50},
    };
    for (const auto& x : path) {
      if (absl::Status s = FitOn(*p, x.values, x.param, x.used, x.figure, x.also); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // One fit for a given sharing (`threads` for a decode step; `first` > 0: a prefill step
  // served first on that many cores, giving way to the rest by `yield`, else like a decode
  // step). The steps were measured in situ, sharing the host with the other worker's steps and
  // the request path, so their mean is slower than the step alone (which the simulator needs:
  // it adds the sharing itself). The fit alternates: the step factors on the measured steps
  // divided by the slowdown the simulator saw in each workload, then the request path's
  // parameters, then the slowdowns again (three rounds; the first takes the steps as measured).
  absl::StatusOr<Candidate> FitSharing(double threads, double first, double yield) const {
    Candidate best;
    planner::HardwareProfile p = profile_;
    p.host_cores = cores_;
    p.step_threads = threads;
    p.prefill_threads = first;
    p.prefill_yield = yield;
    p.host_step_slots = 1;
    p.request_overhead = p.decode_start_overhead = p.relay_cpu = p.sample_cpu = p.step_jitter = 0;
    p.prefill_step_jitter = 0;
    p.request_jitter = ttft_spread_ / std::log(5.0);
    p.decode_start_jitter = gap_spread_ / std::log(5.0);
    std::vector<double> decode_slow(workloads_.size(), 1), prefill_slow(workloads_.size(), 1);
    for (int round = 0; round < 3; ++round) {
      std::vector<planner::StepSample> ds = decode_samples_, ps = prefill_samples_;
      for (size_t i = 0; i < workloads_.size(); ++i) {
        ds[i].seconds /= decode_slow[i];
        ps[i].seconds /= prefill_slow[i];
        // A step of a request alone ran alone (its slowdown is about one, whatever the sharing);
        // a loaded one is corrected by the candidate's slowdown, a model's guess. Weighed
        // equally, the loaded steps pulled the steps alone 5-20% slow, and low-load TTFT and
        // TPOT with them.
        if (workloads_[i].concurrency == 1) ds[i].weight = ps[i].weight = kAloneWeight;
      }
      Candidate c;
      auto decode = planner::FitProfile(profile_, ds, &c.decode_fit);
      if (!decode.ok()) return decode.status();
      auto prefill = planner::FitProfile(profile_, ps, &c.prefill_fit);
      if (!prefill.ok()) return prefill.status();
      for (auto [fitted, has, f] :
           {std::tuple{&*decode, &p.has_decode_factors, &p.decode_factors},
            std::tuple{&*prefill, &p.has_prefill_factors, &p.prefill_factors}}) {
        *has = true;
        *f = {fitted->matmul_efficiency, fitted->attention_efficiency, fitted->bandwidth_efficiency,
              fitted->step_overhead};
      }
      if (absl::Status s = FitRequestPath(&p); !s.ok()) return s;
      // The candidate's figures are the mean of runs with their own noise: one run is one
      // draw, and a closed loop's TTFT p50 moves by 2x between draws (its clients in step or
      // not), which made the choice of sharing a lottery.
      std::vector<Figures>& f = c.simulated;
      if (absl::Status st = Simulate(p, &f, all_, kFitRuns); !st.ok()) return st;
      c.error = 0;
      for (size_t i = 0; i < workloads_.size(); ++i) {
        decode_slow[i] = f[i].decode_slowdown;
        prefill_slow[i] = f[i].prefill_slowdown;
        // TTFT p90 of the open loops only: a closed loop's TTFT spread is set by how its
        // clients fall into step with one another (a few requests batched into one prefill,
        // or each alone), which one run on the machine and the simulator need not share. Its
        // p50 counts: a sharing under which the simulated clients lock in step (TTFT p50 at
        // 1.5-3 times the measured) is wrong by more than the machine's runs differ.
        c.error += SquaredLogError(f[i].tpot50, measured_[i].tpot50) +
                   SquaredLogError(f[i].tpot90, measured_[i].tpot90);
        c.error += SquaredLogError(f[i].ttft50, measured_[i].ttft50);
        // The steps' mean times, sharing included: how the sharing shows itself most directly.
        c.error += SquaredLogError(f[i].decode_step, decode_samples_[i].seconds) +
                   SquaredLogError(f[i].prefill_step, prefill_samples_[i].seconds);
        if (workloads_[i].concurrency == 1) {
          c.error += SquaredLogError(f[i].ttft90, measured_[i].ttft90);
        }
      }
      c.profile = p;
      if (c.error < best.error) best = std::move(c);
    }
    return best;
  }

  const InSituOptions& o_;
  const std::vector<InSituRun>& workloads_;
  const planner::HardwareProfile& profile_;
  std::vector<Figures> measured_;
  // One per workload: its mean step of each role, as the workers' histograms measured it.
  std::vector<planner::StepSample> decode_samples_, prefill_samples_;
  double cores_ = 1;
  std::vector<bool> all_, only_shortest_, open_loops_;
  std::vector<double> grid_, sigmas_;
  double ttft_spread_ = 0, gap_spread_ = 0;
};

// The report of a fit: the workloads' rows, the step factors' fits and the fitted profile's
// request path and sharing.
nlohmann::json FitReport(const nlohmann::json& rows, const Candidate& chosen,
                         const planner::HardwareProfile& profile) {
  return {{"workloads", rows},
          {"decode_fit", chosen.decode_fit},
          {"prefill_fit", chosen.prefill_fit},
          {"request_overhead_s", profile.request_overhead},
          {"request_jitter_s", profile.request_jitter},
          {"decode_start_overhead_s", profile.decode_start_overhead},
          {"decode_start_jitter_s", profile.decode_start_jitter},
          {"relay_cpu_s", profile.relay_cpu},
          {"sample_cpu_s", profile.sample_cpu},
          {"step_jitter", profile.step_jitter},
          {"prefill_step_jitter", profile.prefill_step_jitter},
          {"host_cores", profile.host_cores},
          {"step_threads", profile.step_threads},
          {"prefill_threads", profile.prefill_threads},
          {"prefill_yield", profile.prefill_yield}};
}

}  // namespace

absl::Status FitInSitu(const InSituOptions& o, const std::vector<InSituRun>& workloads,
                       planner::HardwareProfile* profile, nlohmann::json* report) {
  if (workloads.empty()) return absl::InvalidArgumentError("calibrate: no in-situ runs");
  nlohmann::json rows = nlohmann::json::array();
  for (const InSituRun& w : workloads) rows.push_back(WorkloadRow(w));
  if (workloads[kShortest].concurrency != 1) {
    return absl::InvalidArgumentError("calibrate: the first in-situ run is not an open loop");
  }
  const InSituFitter fitter(o, workloads, *profile);
  const double cores = fitter.cores();

  // The sharing: a decode step keeps 1, (1 + cores) / 2 or `cores` cores busy; a prefill step
  // is either one like it or served first with a quarter to all of the cores. Then, for the
  // chosen decode sharing, prefill steps served first that give way to the rest by a third or
  // two thirds (`prefill_yield`): in situ a prefill step beside decode steps is neither as fast
  // as alone nor slowed like them.
  Candidate chosen;
  std::vector<double> decode_threads = {1}, prefill_threads = {0};
  if (cores > 1) {
    decode_threads = {1, (1 + cores) / 2, cores};
    for (int k = 1; k <= 4; ++k) prefill_threads.push_back(cores * k / 4);
  }
  if (o.keep_sharing) {
    if (absl::Status s = fitter.Consider(
            {{profile->step_threads, profile->prefill_threads, profile->prefill_yield}}, &chosen);
        !s.ok()) {
      return s;
    }
  } else {
    std::vector<Sharing> sharings;
    for (double threads : decode_threads) {
      for (double first : prefill_threads) sharings.push_back({threads, first, 0});
    }
    if (absl::Status s = fitter.Consider(sharings, &chosen); !s.ok()) return s;
    sharings.clear();
    for (double first : prefill_threads) {
      if (first <= 0) continue;
      for (double yield : {1.0 / 3, 2.0 / 3}) {
        sharings.push_back({chosen.profile.step_threads, first, yield});
      }
    }
    if (absl::Status s = fitter.Consider(sharings, &chosen); !s.ok()) return s;
  }
  *profile = chosen.profile;
  fitter.Report(chosen, &rows);
  if (report) *report = FitReport(rows, chosen, *profile);
  return profile->Validate();
}

}  // namespace tandem
