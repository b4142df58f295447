#include "tools/plan_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "planner/calibrate.h"
#include "planner/cost_model.h"
#include "planner/plan.h"
#include "planner/simulator.h"
#include "tools/bench_flags.h"
#include "tools/bench_runner.h"
#include "tools/calibrate_in_situ.h"
#include "tools/flags.h"
#include "tools/plan_flags.h"

namespace tandem {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem plan: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

struct Common {
  ModelConfig model;
  planner::HardwareProfile profile;
  planner::ClusterSpec cluster;
};

absl::StatusOr<Common> ParseCommon(const Flags& f) {
  Common c;
  if (!f.Has("model")) return absl::InvalidArgumentError("--model is required");
  if (!f.Has("hardware")) return absl::InvalidArgumentError("--hardware is required");
  auto model = planner::ResolveModel(f.Get("model"));
  if (!model.ok()) return model.status();
  c.model = *model;
  auto profile = planner::LoadProfile(f.Get("hardware"));
  if (!profile.ok()) return profile.status();
  c.profile = *profile;
  if (f.Has("dtype")) {
    const std::string d = f.Get("dtype");
    if (d == "f32") {
      c.profile.weight_bytes = 4;
    } else if (d == "bf16" || d == "f16") {
      c.profile.weight_bytes = 2;
    } else {
      return absl::InvalidArgumentError("--dtype must be f32, bf16 or f16");
    }
  }
  if (f.Has("kv-dtype")) {
    const std::string d = f.Get("kv-dtype");
    if (d == "f32") {
      c.profile.kv_bytes = 4;
    } else if (d == "bf16" || d == "f16") {
      c.profile.kv_bytes = 2;
    } else if (d == "fp8") {
      c.profile.kv_bytes = 1;
    } else {
      return absl::InvalidArgumentError("--kv-dtype must be f32, bf16, f16 or fp8");
    }
  }
  if (f.Has("link")) {
    auto link = planner::ParseLink(f.Get("link"));
    if (!link.ok()) return link.status();
    c.cluster.link = *link;
  }
  auto bs = f.GetInt("block-size");
  auto budget = f.GetInt("token-budget");
  auto chunk = f.GetInt("prefill-chunk");
  auto running = f.GetInt("max-running");
  auto kv = f.GetDouble("kv-bytes");
  for (const auto* v : {&bs, &budget, &chunk, &running}) {
    if (!v->ok()) return v->status();
  }
  if (!kv.ok()) return kv.status();
  auto in_range = [](int64_t v, const char* flag) -> absl::Status {
    if (v < 1 || v > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s must be in [1, 2^24]", flag));
    }
    return absl::OkStatus();
  };
  for (auto s : {in_range(*bs, "block-size"), in_range(*budget, "token-budget"),
                 in_range(*chunk, "prefill-chunk"), in_range(*running, "max-running")}) {
    if (!s.ok()) return s;
  }
  if (!(*kv >= 0)) return absl::InvalidArgumentError("--kv-bytes must be >= 0");
  c.cluster.block_size = static_cast<int>(*bs);
  c.cluster.prefill_scheduler.token_budget = static_cast<int>(*budget);
  c.cluster.prefill_scheduler.chunk_size = static_cast<int>(*chunk);
  c.cluster.max_running = static_cast<int>(*running);
  c.cluster.prefill_kv_bytes = c.cluster.decode_kv_bytes = *kv;
  c.cluster.prefix_cache = !f.Has("no-prefix-cache");
  // Speculative decoding on the decode workers: K proposals per step, each kept with the
  // probability given (as measured: tandem_spec_decode_num_accepted_tokens_total over
  // tandem_spec_decode_num_draft_tokens_total is close to it for small K).
  auto spec = f.GetInt("spec-tokens");
  auto acceptance = f.GetDouble("spec-acceptance");
  if (!spec.ok()) return spec.status();
  if (!acceptance.ok()) return acceptance.status();
  if (*spec < 0 || *spec > 64)
    return absl::InvalidArgumentError("--spec-tokens must be in [0, 64]");
  if (!(*acceptance >= 0 && *acceptance < 1)) {
    return absl::InvalidArgumentError("--spec-acceptance must be in [0, 1)");
  }
  if (f.Has("spec-acceptance") && *spec == 0) {
    return absl::InvalidArgumentError("--spec-acceptance needs --spec-tokens");
  }
  c.cluster.spec_tokens = static_cast<int>(*spec);
  c.cluster.spec_acceptance = *acceptance;
  return c;
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(absl::StrFormat("--json: cannot write %s", path));
  out << j.dump(1) << "\n";
  return out.good() ? absl::OkStatus()
                    : absl::InternalError(absl::StrFormat("writing %s failed", path));
}

nlohmann::json ClusterJson(const planner::ClusterSpec& c) {
  return {{"prefill", c.prefill},
          {"decode", c.colocated ? c.prefill : c.decode},
          {"colocated", c.colocated},
          {"prefill_tp", c.prefill_tp},
          {"decode_tp", c.colocated ? c.prefill_tp : c.decode_tp},
          {"block_size", c.block_size},
          {"token_budget", c.prefill_scheduler.token_budget},
          {"prefill_chunk", c.prefill_scheduler.chunk_size},
          {"max_running", c.max_running},
          {"spec_tokens", c.spec_tokens},
          {"spec_acceptance", c.spec_acceptance}};
}

// Merged in-situ reports whose steps ran this far from their mean (either way) are named.
constexpr double kDriftWarning = 0.1;

int Simulate(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, SimulateCommand(), &f)) return *exit;
  auto common = ParseCommon(*f);
  if (!common.ok()) return Fail(common.status());
  auto workload = BenchConfigFromFlags(*f);
  if (!workload.ok()) return Fail(workload.status());
  planner::ClusterSpec& cluster = common->cluster;
  auto p = f->GetInt("prefill");
  auto d = f->GetInt("decode");
  auto colo = f->GetInt("colocated");
  auto ptp = f->GetInt("prefill-tp");
  auto dtp = f->GetInt("decode-tp");
  absl::StatusOr<int64_t> runs = planner::HasNoise(common->profile) ? kNoisyRuns : 1;
  if (f->Has("runs")) runs = f->GetInt("runs");
  for (const auto* v : {&p, &d, &colo, &ptp, &dtp, &runs}) {
    if (!v->ok()) return Fail(v->status());
  }
  if (*runs < 1 || *runs > 1000)
    return Fail(absl::InvalidArgumentError("--runs must be in [1, 1000]"));
  if (*colo < 0 || *colo > 4096)
    return Fail(absl::InvalidArgumentError("--colocated must be in [0, 4096]"));
  cluster.colocated = *colo > 0;
  cluster.prefill =
      static_cast<int>(std::clamp<int64_t>(cluster.colocated ? *colo : *p, -1, 1 << 20));
  cluster.decode = static_cast<int>(std::clamp<int64_t>(*d, -1, 1 << 20));
  cluster.prefill_tp = static_cast<int>(std::clamp<int64_t>(*ptp, -1, 1 << 20));
  cluster.decode_tp = static_cast<int>(std::clamp<int64_t>(*dtp, -1, 1 << 20));
  planner::SimOptions opts;
  opts.record_steps = f->Has("steps");
  auto all = planner::SimulateRuns(common->model, common->profile, cluster, *workload,
                                   static_cast<int>(*runs), opts);
  if (!all.ok()) return Fail(all.status());
  const planner::SimResult* r = &all->front();  // its records, steps and counts are the JSON's
  const bench::BenchSummary summary = planner::MeanSummary(*all);
  std::printf("%s", bench::FormatSummary(summary).c_str());
  if (all->size() > 1) {
    std::vector<double> p50;
    for (const auto& run : *all) p50.push_back(run.summary.ttft.p50);
    std::sort(p50.begin(), p50.end());
    std::printf(
        "simulated: the mean of %zu runs (each its own noise); TTFT p50 from %.2f to %.2f ms\n",
        all->size(), p50.front() * 1e3, p50.back() * 1e3);
  }
  std::printf("simulated: %lld prefill steps, %lld decode steps (mean batch %.1f), %lld events%s\n",
              static_cast<long long>(r->prefill_steps), static_cast<long long>(r->decode_steps),
              r->mean_decode_batch, static_cast<long long>(r->events),
              all->size() > 1 ? " (the first run)" : "");
  if (f->Has("json")) {
    nlohmann::json requests = nlohmann::json::array();
    for (const auto& rec : r->records) requests.push_back(bench::ToJson(rec));
    bench::BenchConfig shown = *workload;
    shown.router = "simulated";
    nlohmann::json j = {{"config", shown.ToJson()},
                        {"summary", bench::ToJson(summary)},
                        {"requests", requests},
                        {"simulated",
                         {{"cluster", ClusterJson(cluster)},
                          {"profile", common->profile.ToJson()},
                          {"prefill_steps", r->prefill_steps},
                          {"decode_steps", r->decode_steps},
                          {"mean_decode_batch", r->mean_decode_batch},
                          {"runs", all->size()}}}};
    if (all->size() > 1) {
      // The summary is the runs' mean; the requests are the first run's; each run's own:
      nlohmann::json per_run = nlohmann::json::array();
      for (const auto& run : *all) per_run.push_back(bench::ToJson(run.summary));
      j["simulated"]["run_summaries"] = per_run;
    }
    if (absl::Status s = WriteJson(f->Get("json"), j); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s\n", f->Get("json").c_str());
  }
  if (f->Has("steps")) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : r->steps) {
      nlohmann::json work = nlohmann::json::array();
      for (const auto& w : s.work) work.push_back({w.id, w.start, w.count, w.last});
      steps.push_back({{"worker", s.worker},
                       {"prefill", s.prefill},
                       {"start", s.start},
                       {"end", s.end},
                       {"work", work},
                       {"batch", s.batch}});
    }
    if (absl::Status s = WriteJson(f->Get("steps"), steps); !s.ok()) return Fail(s);
  }
  return 0;
}

void PrintInSitu(const planner::HardwareProfile& p) {
  const auto& d = p.decode_factors;
  std::printf(
      "in situ: decode step overhead %.3f ms, efficiency matmul %.3f, attention %.3f, "
      "bandwidth %.3f; request overhead %.3f ms (+ jitter %.3f), decode start %.3f ms (+ "
      "jitter %.3f), sampling %.3f ms and relay %.3f ms of CPU per token, step jitter %.2f "
      "(prefill %.2f); of %.0f "
      "cores a decode step keeps %.2f busy, a prefill step %.2f (0: as a decode step; else "
      "served first, giving way to the rest by %.2f)\n",
      d.step_overhead * 1e3, d.matmul_efficiency, d.attention_efficiency, d.bandwidth_efficiency,
      p.request_overhead * 1e3, p.request_jitter * 1e3, p.decode_start_overhead * 1e3,
      p.decode_start_jitter * 1e3, p.sample_cpu * 1e3, p.relay_cpu * 1e3, p.step_jitter,
      p.prefill_step_jitter, p.host_cores, p.step_threads, p.prefill_threads, p.prefill_yield);
}

void LogLine(const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); }

absl::Status WriteProfile(const std::string& out, const planner::HardwareProfile& p) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out).parent_path(), ec);
  return WriteJson(out, p.ToJson());
}

// --refit REPORT [--refit REPORT]...: the in-situ fit again on reports' measured workloads (more
// than one: on their mean, workload by workload). The forward-pass fit is the first report's.
int Refit(const Flags& f) {
  if (!f.Has("model")) return Fail(absl::InvalidArgumentError("--refit needs --model PATH"));
  nlohmann::json report;
  std::vector<std::vector<InSituRun>> calibrations;
  const std::vector<std::string> paths = f.GetAll("refit");
  for (const std::string& path : paths) {
    std::ifstream in(path);
    if (!in) return Fail(absl::InvalidArgumentError("--refit: cannot read " + path));
    nlohmann::json r = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (r.is_discarded() || !r.is_object() || !r.contains("profile") || !r.contains("in_situ")) {
      return Fail(absl::InvalidArgumentError("--refit: " + path +
                                             " is not the --report of an in-situ calibration"));
    }
    auto runs = InSituRunsFromReport(r["in_situ"]);
    if (!runs.ok()) {
      return Fail(absl::InvalidArgumentError(path + ": " + std::string(runs.status().message())));
    }
    calibrations.push_back(*std::move(runs));
    if (report.is_null()) report = std::move(r);
  }
  auto profile = planner::HardwareProfile::FromJson(report["profile"]);
  if (!profile.ok()) return Fail(profile.status());
  auto runs = MergeInSituRuns(calibrations);
  if (!runs.ok()) return Fail(runs.status());
  if (calibrations.size() > 1) {
    // A host shared with other tenants drifts by 10-40% within minutes: say which report was
    // measured in a slow or fast stretch (the fit still takes their mean).
    const std::vector<double> ratios = InSituStepTimeRatios(calibrations, *runs);
    for (size_t c = 0; c < ratios.size(); ++c) {
      if (std::abs(ratios[c] - 1) <= kDriftWarning) continue;
      std::fprintf(stderr,
                   "note: %s: its steps took %.2f times the mean of the %zu reports' (the host's "
                   "speed drifted between them); the fit takes the mean\n",
                   paths[c].c_str(), ratios[c], ratios.size());
    }
  }
  InSituOptions o;
  o.model = f.Get("model");
  auto config = planner::ResolveModel(o.model);
  if (!config.ok()) return Fail(config.status());
  o.config = *config;
  o.weight_bytes = profile->weight_bytes;  // a one-model calibration's: that model's
  o.host_cores = profile->host_cores;      // the machine that measured
  o.keep_sharing = f.Has("keep-sharing");  // the first report's, in its profile
  o.log = LogLine;
  nlohmann::json in_situ;
  if (absl::Status s = FitInSitu(o, *runs, &*profile, &in_situ); !s.ok()) return Fail(s);
  PrintInSitu(*profile);
  const std::string out = f.Get("out");
  if (absl::Status s = WriteProfile(out, *profile); !s.ok()) return Fail(s);
  std::printf("wrote %s\n", out.c_str());
  if (f.Has("report")) {
    report["in_situ"] = in_situ;
    report["profile"] = profile->ToJson();
    if (paths.size() > 1) report["merged_from"] = paths;
    if (absl::Status s = WriteJson(f.Get("report"), report); !s.ok()) return Fail(s);
  }
  return 0;
}

// --from-device FILE: a GPU profile fitted to a device run of bench/cuda_model_bench.
int FromDevice(const Flags& f) {
  for (const char* other : {"model", "refit", "repeats", "threads", "tokenizer", "draws"}) {
    if (f.Has(other)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrFormat("--from-device fits a device run's JSON: --%s does not apply", other)));
    }
  }
  if (f.Has("in-situ") || f.Has("keep-sharing")) {
    return Fail(absl::InvalidArgumentError(
        "--from-device fits a device run's JSON: --in-situ and --keep-sharing do not apply"));
  }
  if (!f.Has("base")) {
    return Fail(absl::InvalidArgumentError(
        "--from-device needs --base PROFILE: the datasheet profile of the device it ran on (e.g. "
        "h200-datasheet), whose peak, bandwidth, capacity and links the fit keeps"));
  }
  if (!f.Has("out")) {
    return Fail(absl::InvalidArgumentError("--from-device needs --out FILE (the profile written)"));
  }
  const std::string path = f.Get("from-device");
  std::ifstream in(path);
  if (!in) return Fail(absl::InvalidArgumentError("--from-device: cannot read " + path));
  nlohmann::json bench = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (bench.is_discarded() || !bench.is_object()) {
    return Fail(absl::InvalidArgumentError("--from-device: " + path + " is not a JSON object"));
  }
  auto base = planner::LoadProfile(f.Get("base"));
  if (!base.ok()) return Fail(base.status());
  nlohmann::json report;
  auto fitted = planner::ProfileFromDeviceBench(*base, bench, f.Get("provenance"), &report);
  if (!fitted.ok()) {
    return Fail(
        absl::Status(fitted.status().code(), path + ": " + std::string(fitted.status().message())));
  }
  if (f.Has("name")) fitted->name = f.Get("name");
  if (absl::Status s = WriteProfile(f.Get("out"), *fitted); !s.ok()) return Fail(s);
  std::printf(
      "%s: step overhead %.3f ms, efficiency matmul %.3f, attention %.3f, bandwidth %.3f; mean "
      "|error| %.1f%% over %zu steps\nprovenance: %s\nwrote %s\n",
      fitted->name.c_str(), fitted->step_overhead * 1e3, fitted->matmul_efficiency,
      fitted->attention_efficiency, fitted->bandwidth_efficiency,
      100 * report["mean_abs_error"].get<double>(), report["samples"].size(),
      fitted->provenance.c_str(), f.Get("out").c_str());
  if (f.Has("report")) {
    report["profile"] = fitted->ToJson();
    if (absl::Status s = WriteJson(f.Get("report"), report); !s.ok()) return Fail(s);
  }
  return 0;
}

int Calibrate(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, CalibrateCommand(), &f)) return *exit;
  if (f->Has("from-device")) return FromDevice(*f);
  for (const char* only : {"base", "provenance", "name"}) {
    if (f->Has(only)) {
      return Fail(
          absl::InvalidArgumentError(absl::StrFormat("--%s goes with --from-device FILE", only)));
    }
  }
  if (f->Has("refit")) return Refit(*f);
  if (f->Has("keep-sharing")) {
    return Fail(absl::InvalidArgumentError(
        "--keep-sharing keeps a report's sharing of the host: it needs --refit REPORT"));
  }
  planner::CalibrateOptions o;
  o.models = f->GetAll("model");
  auto repeats = f->GetInt("repeats");
  auto threads = f->GetInt("threads");
  if (!repeats.ok()) return Fail(repeats.status());
  if (!threads.ok()) return Fail(threads.status());
  if (*threads < 0 || *threads > 1024) {
    return Fail(absl::InvalidArgumentError("--threads must be in [0, 1024]"));
  }
  auto draws = f->GetInt("draws");
  if (!draws.ok()) return Fail(draws.status());
  if (*draws < 1 || *draws > 20) {
    return Fail(absl::InvalidArgumentError("--draws must be in [1, 20]"));
  }
  o.repeats = static_cast<int>(std::clamp<int64_t>(*repeats, -1, 1 << 20));
  o.threads = static_cast<int>(*threads);
  if (o.models.empty()) return Fail(absl::InvalidArgumentError("calibrate: give --model PATH"));
  int threads_used = o.threads;
  if (threads_used <= 0) {
    const char* env = std::getenv("TANDEM_NUM_THREADS");
    threads_used = env && std::atoi(env) > 0
                       ? std::atoi(env)
                       : static_cast<int>(std::thread::hardware_concurrency());
  }
  std::fprintf(stderr, "calibrate: measuring peak and bandwidth on %d threads\n", threads_used);
  planner::HardwareProfile base = planner::LocalBaseProfile(std::max(1, threads_used));
  auto samples = planner::MeasureSteps(
      o, [](const std::string& line) { std::fprintf(stderr, "  %s\n", line.c_str()); });
  if (!samples.ok()) return Fail(samples.status());
  nlohmann::json report;
  auto fitted = planner::FitProfile(base, *samples, &report);
  if (!fitted.ok()) return Fail(fitted.status());
  if (f->Has("in-situ")) {
    InSituOptions in;
    in.model = o.models[0];
    in.tokenizer = f->Get("tokenizer");
    in.config = (*samples)[0].config;
    in.weight_bytes = (*samples)[0].weight_bytes;
    in.closed_loop_draws = static_cast<int>(*draws);
    in.log = LogLine;
    std::fprintf(stderr, "calibrate: in situ, a 1P1D cluster of %s\n", in.model.c_str());
    nlohmann::json in_situ;
    if (absl::Status s = CalibrateInSitu(in, &*fitted, &in_situ); !s.ok()) return Fail(s);
    report["in_situ"] = in_situ;
    PrintInSitu(*fitted);
  }
  const std::string out = f->Get("out");
  if (absl::Status s = WriteProfile(out, *fitted); !s.ok()) return Fail(s);
  std::printf(
      "local profile: peak %.1f GFLOP/s, bandwidth %.1f GB/s; fitted step overhead %.3f ms, "
      "efficiency matmul %.3f, attention %.3f, bandwidth %.3f; mean |error| %.1f%% over %zu "
      "steps\nwrote %s\n",
      fitted->peak_flops / 1e9, fitted->mem_bandwidth / 1e9, fitted->step_overhead * 1e3,
      fitted->matmul_efficiency, fitted->attention_efficiency, fitted->bandwidth_efficiency,
      100 * report["mean_abs_error"].get<double>(), samples->size(), out.c_str());
  if (f->Has("report")) {
    report["profile"] = fitted->ToJson();
    if (absl::Status s = WriteJson(f->Get("report"), report); !s.ok()) return Fail(s);
  }
  return 0;
}

// --kustomize-base: a kustomization folder, checked before the plan's simulations run.
absl::Status CheckKustomizeBase(const std::string& base) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(base) / "kustomization.yaml", ec)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kustomize-base: %s has no kustomization.yaml (run from the repository root, or give "
        "the path of deploy/k8s/overlays/gpu)",
        base));
  }
  return absl::OkStatus();
}

// `tandem plan --emit-kustomize DIR`: an overlay of `base` (a kustomization folder,
// CheckKustomizeBase) that runs `best`, the flags the plan assumed and the command that made it
// in its comments.
absl::Status EmitKustomize(const std::string& dir, const std::string& base,
                           const planner::PlanCandidate& best, const Flags& f,
                           const std::string& command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--emit-kustomize: cannot create %s: %s", dir, ec.message()));
  }
  const std::string rel = fs::relative(fs::absolute(base), fs::absolute(dir), ec).string();
  const planner::ClusterSpec& c = best.cluster;
  const auto& s = best.summary;
  std::string worker_flags = absl::StrFormat("--block-size %d", c.block_size);
  if (f.Has("kv-dtype")) absl::StrAppend(&worker_flags, " --kv-dtype ", f.Get("kv-dtype"));
  if (f.Has("dtype")) absl::StrAppend(&worker_flags, " --dtype ", f.Get("dtype"));
  const std::string prefill_flags =
      absl::StrFormat("--token-budget %d --prefill-chunk %d", c.prefill_scheduler.token_budget,
                      c.prefill_scheduler.chunk_size);
  std::string decode_flags =
      absl::StrFormat("--max-running %d --lease-timeout-ms 60000", c.max_running);
  if (c.decode_kv_bytes > 0) {
    absl::StrAppend(&decode_flags, absl::StrFormat(" --kv-bytes %.0f", c.decode_kv_bytes));
  }
  if (c.spec_tokens > 0) {  // prompt lookup; a draft model also needs --draft-model
    absl::StrAppend(&decode_flags,
                    absl::StrFormat(" --speculative ngram --spec-tokens %d", c.spec_tokens));
  }
  std::string k = absl::StrFormat(
      "# Written by: %s\n"
      "# Layout %s: %.2f requests/s at the SLO attainment asked for (%.2f per GPU); predicted\n"
      "# TTFT p90 %.1f ms, TPOT p90 %.2f ms. The worker flags below are the ones the plan\n"
      "# assumed; the base's other settings stay. `kubectl kustomize` builds this folder.\n"
      "apiVersion: kustomize.config.k8s.io/v1beta1\n"
      "kind: Kustomization\n"
      "resources:\n"
      "  - %s\n"
      "patches:\n"
      "  - path: plan.yaml\n"
      "configMapGenerator:\n"
      "  - name: tandem-config\n"
      "    behavior: merge\n"
      "    literals:\n"
      "      - TANDEM_WORKER_FLAGS=--device auto %s\n"
      "      - TANDEM_PREFILL_FLAGS=%s\n"
      "      - TANDEM_DECODE_FLAGS=%s\n",
      command, best.Describe(), best.max_rate, best.goodput_per_gpu, s.ttft.p90 * 1e3,
      s.tpot.p90 * 1e3, rel, worker_flags, prefill_flags, decode_flags);
  std::string plan;
  for (const auto& [name, container, replicas, tp] :
       {std::tuple{"tandem-prefill", "prefill", c.prefill, c.prefill_tp},
        std::tuple{"tandem-decode", "decode", c.decode, c.decode_tp}}) {
    absl::StrAppend(&plan, plan.empty() ? "" : "---\n",
                    absl::StrFormat("apiVersion: apps/v1\n"
                                    "kind: Deployment\n"
                                    "metadata:\n"
                                    "  name: %s\n"
                                    "spec:\n"
                                    "  replicas: %d\n"
                                    "  template:\n"
                                    "    spec:\n"
                                    "      containers:\n"
                                    "        - name: %s\n"
                                    "          resources:\n"
                                    "            requests:\n"
                                    "              nvidia.com/gpu: \"%d\"\n"
                                    "            limits:\n"
                                    "              nvidia.com/gpu: \"%d\"\n",
                                    name, replicas, container, tp, tp));
  }
  for (const auto& [file, text] :
       {std::pair{"kustomization.yaml", k}, std::pair{"plan.yaml", plan}}) {
    const std::string path = (fs::path(dir) / file).string();
    std::ofstream out(path);
    out << text;
    if (!out.good()) {
      return absl::InternalError(absl::StrFormat("--emit-kustomize: writing %s failed", path));
    }
  }
  return absl::OkStatus();
}

int Plan(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, PlanSearchCommand(), &f)) return *exit;
  const std::string kustomize_base = f->Get("kustomize-base");
  if (f->Has("emit-kustomize")) {
    if (absl::Status s = CheckKustomizeBase(kustomize_base); !s.ok()) return Fail(s);
  }
  auto common = ParseCommon(*f);
  if (!common.ok()) return Fail(common.status());
  // The workload: --workload, or the bench flags for lengths and arrivals.
  auto workload = BenchConfigFromFlags(*f);
  if (!workload.ok()) return Fail(workload.status());
  if (f->Has("workload")) {
    if (absl::Status s = planner::ParseWorkloadSpec(f->Get("workload"), &*workload); !s.ok()) {
      return Fail(s);
    }
  } else if (!f->Has("input-len") || !f->Has("output-len")) {
    return Fail(absl::InvalidArgumentError(
        "give --workload in=LEN,out=LEN (or --input-len and --output-len)"));
  }
  auto num_requests = f->GetInt("num-requests");
  if (!num_requests.ok()) return Fail(num_requests.status());
  workload->num_requests = static_cast<int>(std::clamp<int64_t>(*num_requests, 0, 1 << 24));
  planner::PlanOptions o;
  auto gpus = f->GetInt("gpus");
  auto attainment = f->GetDouble("attainment");
  auto top = f->GetInt("top");
  auto sim_seconds = f->GetDouble("sim-seconds");
  if (!sim_seconds.ok()) return Fail(sim_seconds.status());
  if (!(*sim_seconds >= 0 && *sim_seconds <= 3600)) {
    return Fail(absl::InvalidArgumentError("--sim-seconds must be in [0, 3600]"));
  }
  o.min_seconds = *sim_seconds;
  if (!gpus.ok()) return Fail(gpus.status());
  if (!attainment.ok()) return Fail(attainment.status());
  if (!top.ok()) return Fail(top.status());
  o.gpus = static_cast<int>(std::clamp<int64_t>(*gpus, -1, 1 << 20));
  o.attainment = *attainment;
  o.top = static_cast<int>(std::clamp<int64_t>(*top, 1, 1000));
  o.colocated = !f->Has("no-colocated");
  if (f->Has("tp")) {
    for (absl::string_view t : absl::StrSplit(f->Get("tp"), ',', absl::SkipEmpty())) {
      int v = 0;
      if (!absl::SimpleAtoi(t, &v)) {
        return Fail(absl::InvalidArgumentError("--tp: expected integers, e.g. 1,2,4"));
      }
      o.tp.push_back(v);
    }
  }
  auto result = planner::SearchPlans(common->model, common->profile, *workload, common->cluster, o);
  if (!result.ok()) return Fail(result.status());
  std::printf(
      "model %s (%d layers, dim %d), hardware %s, workload in=%s out=%s %s arrivals, SLO TTFT "
      "%.3g s TPOT %.3g s at %.0f%% attainment, up to %d GPUs; %d simulations of %d requests\n",
      f->Get("model").c_str(), common->model.n_layers, common->model.dim,
      common->profile.name.c_str(), workload->input_len.c_str(), workload->output_len.c_str(),
      workload->ToJson()["arrival"].get<std::string>().c_str(), workload->slo.ttft,
      workload->slo.tpot, 100 * o.attainment, o.gpus, result->simulations, workload->num_requests);
  std::printf("%s", planner::FormatPlanTable(*result, o.top).c_str());
  for (const auto& s : result->skipped) std::printf("skipped: %s\n", s.c_str());
  if (f->Has("json")) {
    nlohmann::json j = planner::PlanToJson(*result, o.top);
    j["model"] = f->Get("model");
    j["hardware"] = common->profile.ToJson();
    workload->router = "simulated";
    j["workload"] = workload->ToJson();
    j["attainment"] = o.attainment;
    j["gpus"] = o.gpus;
    if (absl::Status s = WriteJson(f->Get("json"), j); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s\n", f->Get("json").c_str());
  }
  if (f->Has("emit-kustomize")) {
    // The best layout Tandem can run as separate prefill and decode Deployments.
    const auto best = std::find_if(
        result->ranked.begin(), result->ranked.end(),
        [](const planner::PlanCandidate& c) { return c.Runnable() && !c.cluster.colocated; });
    if (best == result->ranked.end()) {
      return Fail(absl::FailedPreconditionError(
          "--emit-kustomize: no runnable disaggregated layout meets the SLOs"));
    }
    std::string command = "tandem plan";
    for (const std::string& a : args) absl::StrAppend(&command, " ", a);
    const std::string dir = f->Get("emit-kustomize");
    if (absl::Status s = EmitKustomize(dir, kustomize_base, *best, *f, command); !s.ok()) {
      return Fail(s);
    }
    std::printf("wrote %s: %s\n", dir.c_str(), best->Describe().c_str());
  }
  return 0;
}

// `tandem plan profiles`: the built-in profiles' figures and where each comes from.
int Profiles() {
  for (const std::string& name : planner::BuiltinProfileNames()) {
    auto p = planner::LoadProfile(name);
    if (!p.ok()) return Fail(p.status());
    std::printf(
        "%-15s peak %4.0f TFLOP/s, HBM %.2f TB/s, %3.0f GB, step overhead %.3f ms, "
        "efficiency matmul %.2f, attention %.2f, bandwidth %.2f\n  %s\n",
        name.c_str(), p->peak_flops / 1e12, p->mem_bandwidth / 1e12, p->mem_capacity / 1e9,
        p->step_overhead * 1e3, p->matmul_efficiency, p->attention_efficiency,
        p->bandwidth_efficiency,
        p->provenance.empty() ? "datasheet figures, assumed efficiencies"
                              : ("measured: " + p->provenance).c_str());
  }
  return 0;
}

}  // namespace

int PlanCommand(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "help") {
    std::fputs(kPlanUsage, stdout);
    return 0;
  }
  if (!args.empty() && args[0] == "simulate") {
    return Simulate(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (!args.empty() && args[0] == "profiles") {
    if (args.size() > 1) {
      return Fail(absl::InvalidArgumentError("tandem plan profiles takes no arguments"));
    }
    return Profiles();
  }
  if (!args.empty() && args[0] == "calibrate") {
    return Calibrate(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (args.empty()) {
    std::fputs(kPlanUsage, stderr);
    return 2;
  }
  return Plan(args);
}

}  // namespace tandem
