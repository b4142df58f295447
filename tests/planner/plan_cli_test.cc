// `tandem plan` as a user runs it: simulate prints what `tandem bench` prints and writes JSON
// `tandem bench report` reads; calibrate writes a profile simulate accepts; bad input is one
// clear line and exit code 2 (or 1 for a missing calibration).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace tandem {
namespace {

struct CliRun {
  int exit_code;
  std::string out, err;
};

// `env` is prepended to the command line (VAR=value ...).
CliRun Tandem(const std::string& args, const std::string& env = "") {
  const std::string base = absl::StrFormat("/tmp/tandem_plan_cli.%d", ::getpid());
  const std::string cmd =
      env + " " + testing::BinDir() + "/tandem " + args + " >" + base + ".out 2>" + base + ".err";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, *ReadFileToString(base + ".out"),
          *ReadFileToString(base + ".err")};
}

std::string TempPath(const char* name) {
  return absl::StrFormat("/tmp/tandem_plan_cli.%d.%s", ::getpid(), name);
}

TEST(PlanCli, SimulatePrintsTheBenchSummaryAndItsJson) {
  const std::string json = TempPath("sim.json");
  const CliRun r = Tandem(
      "plan simulate --model llama-3-8b --hardware h100 --prefill 1 --decode 2 --rate 4 "
      "--num-requests 40 --input-len uniform:100:900 --output-len 64 --seed 3 --slo-ttft 0.2 "
      "--slo-tpot 0.02 --json " +
      json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"requests: sent 40, completed 40", "goodput", "TTFT  ms", "TPOT  ms",
                           "ITL   ms", "E2E   ms", "simulated:"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  auto j = nlohmann::json::parse(*ReadFileToString(json));
  EXPECT_EQ(j["summary"]["completed"], 40);
  EXPECT_EQ(j["requests"].size(), 40u);
  EXPECT_EQ(j["config"]["input_len"], "uniform:100:900");
  EXPECT_EQ(j["simulated"]["cluster"]["decode"], 2);
  EXPECT_EQ(j["simulated"]["runs"], 1) << "a profile without jitter needs one run";
  const CliRun report = Tandem("bench report " + json);
  EXPECT_EQ(report.exit_code, 0) << report.err;
  // The same flags give the same figures.
  const CliRun again = Tandem(
      "plan simulate --model llama-3-8b --hardware h100 --prefill 1 --decode 2 --rate 4 "
      "--num-requests 40 --input-len uniform:100:900 --output-len 64 --seed 3 --slo-ttft 0.2 "
      "--slo-tpot 0.02");
  EXPECT_EQ(again.out, r.out);
  // Speculating decode workers: the cluster's settings are in the JSON.
  const CliRun spec = Tandem(
      "plan simulate --model llama-3-8b --hardware h100 --prefill 1 --decode 2 --rate 4 "
      "--num-requests 40 --input-len uniform:100:900 --output-len 64 --seed 3 --slo-ttft 0.2 "
      "--slo-tpot 0.02 --spec-tokens 4 --spec-acceptance 0.7 --json " +
      json);
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const double plain_tpot = j["summary"]["tpot_s"]["mean"].get<double>();
  j = nlohmann::json::parse(*ReadFileToString(json));
  EXPECT_EQ(j["simulated"]["cluster"]["spec_tokens"], 4);
  // 1 + .7 + .49 + .343 + .24 = 2.8 tokens per verify step, each step about a plain one's cost.
  EXPECT_LT(j["summary"]["tpot_s"]["mean"].get<double>(), 0.6 * plain_tpot);
}

TEST(PlanCli, CalibrateWritesAProfileSimulateReads) {
  const std::string profile = TempPath("local.json");
  const CliRun cal =
      Tandem("plan calibrate --model " + testing::Stories260K() + " --repeats 1 --out " + profile);
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  EXPECT_NE(cal.out.find("local profile:"), std::string::npos) << cal.out;
  const CliRun sim = Tandem("plan simulate --model " + testing::Stories260K() + " --hardware " +
                            profile + " --dtype f32 --rate 20 --num-requests 20");
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  // --hardware local reads the same file through $TANDEM_LOCAL_PROFILE.
  const CliRun local = Tandem("plan simulate --model stories260k --hardware local --rate 20",
                              "TANDEM_LOCAL_PROFILE=" + profile);
  EXPECT_EQ(local.exit_code, 0) << local.err;
}

TEST(PlanCli, CalibrateFromADeviceRunWritesTheShippedProfile) {
  // The command that made planner/profiles/h200.json, run again on the same device run: the same
  // file, and `plan profiles` says which profiles are measured.
  const std::string shipped_path = testing::SourceDir() + "/planner/profiles/h200.json";
  const auto shipped = nlohmann::json::parse(*ReadFileToString(shipped_path));
  const std::string out = TempPath("h200.json");
  const CliRun fit = Tandem("plan calibrate --from-device " + testing::SourceDir() +
                            "/tests/fixtures/planner/h200_cuda_model_bench.json --base "
                            "h200-datasheet --name h200 --provenance '" +
                            shipped["provenance"].get<std::string>() + "' --out " + out);
  ASSERT_EQ(fit.exit_code, 0) << fit.err;
  EXPECT_NE(fit.out.find("mean |error|"), std::string::npos) << fit.out;
  EXPECT_EQ(nlohmann::json::parse(*ReadFileToString(out)), shipped);
  const CliRun profiles = Tandem("plan profiles");
  ASSERT_EQ(profiles.exit_code, 0) << profiles.err;
  EXPECT_NE(profiles.out.find("measured: " + shipped["provenance"].get<std::string>()),
            std::string::npos)
      << profiles.out;
  EXPECT_NE(profiles.out.find("h200-datasheet"), std::string::npos) << profiles.out;
  // The measured profile plans.
  const CliRun sim = Tandem(
      "plan simulate --model llama-3-8b --hardware h200 --prefill 1 --decode 1 --rate 2 "
      "--num-requests 20 --input-len 1024 --output-len 32");
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
}

TEST(PlanCli, CalibrateInSituFitsTheRequestPathOfARealCluster) {
  // --in-situ starts a router, a prefill and a decode worker, runs five workloads through them
  // (each closed loop --draws times) and fits the decode and prefill steps and the request path
  // to what they measured.
  const std::string profile = TempPath("in_situ.json");
  const std::string report = TempPath("in_situ_report.json");
  const CliRun cal = Tandem("plan calibrate --model " + testing::Stories260K() + " --tokenizer " +
                            testing::Tok512() + " --repeats 1 --in-situ --draws 2 --out " +
                            profile + " --report " + report);
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  EXPECT_NE(cal.out.find("in situ: decode step overhead"), std::string::npos) << cal.out;
  std::ifstream pin(profile);
  const nlohmann::json p = nlohmann::json::parse(pin);
  EXPECT_TRUE(p.contains("decode") && p.contains("prefill")) << p.dump();
  // One processor of the machine's cores; the steps' share of them fitted.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(p["host_cores"].get<double>(), cores);
  EXPECT_GE(p.value("step_threads", 1.0), 1);
  EXPECT_LE(p.value("step_threads", 1.0), cores);
  EXPECT_GE(p.value("prefill_threads", 0.0), 0);
  EXPECT_LE(p.value("prefill_threads", 0.0), cores);
  EXPECT_GT(p["request_overhead"].get<double>() + p["request_jitter"].get<double>(), 0);
  std::ifstream rin(report);
  const nlohmann::json r = nlohmann::json::parse(rin);
  ASSERT_EQ(r["in_situ"]["workloads"].size(), 5u) << r.dump();
  for (const auto& w : r["in_situ"]["workloads"]) {
    // Every workload really ran: decode steps at the expected batch, figures on both sides.
    EXPECT_GT(w["decode_steps"].get<double>(), 0);
    EXPECT_GE(w["decode_batch"].get<double>(), 0.99);
    // (The workloads "alone" are an open loop at 4 requests/s: two may overlap now and then.)
    const double most = w["concurrency"].get<double>() == 1 ? 4 : w["concurrency"].get<double>();
    EXPECT_LE(w["decode_batch"].get<double>(), most + 0.01);
    EXPECT_GT(w["measured"]["tpot_p50_s"].get<double>(), 0);
    EXPECT_GT(w["simulated"]["ttft_p50_s"].get<double>(), 0);
    // A closed loop leaves its clients' first two requests each out (they start in step).
    const int concurrency = w["concurrency"].get<int>();
    EXPECT_EQ(w["warmup"].get<int>(), concurrency == 1 ? 2 : 2 * concurrency) << w.dump();
    // A closed loop ran twice; what the fit took is the mean of the two, figure by figure.
    const auto& draws = w["measured_draws"];
    ASSERT_EQ(draws.size(), w["concurrency"].get<int>() == 1 ? 1u : 2u) << w.dump();
    for (const char* key : {"ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s"}) {
      double mean = 0;
      for (const auto& d : draws) mean += d[key].get<double>() / draws.size();
      EXPECT_NEAR(w["measured"][key].get<double>(), mean, 1e-12) << key << " " << w.dump();
    }
  }
  // The profile simulates; it has jitter, so a simulation is the mean of runs that each draw
  // their own noise.
  const std::string sim_json = TempPath("in_situ_sim.json");
  const CliRun sim =
      Tandem("plan simulate --model " + testing::Stories260K() + " --hardware " + profile +
             " --dtype f32 --concurrency 4 --num-requests 20 --runs 3 --json " + sim_json);
  EXPECT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_NE(sim.out.find("the mean of 3 runs"), std::string::npos) << sim.out;
  const auto sj = nlohmann::json::parse(*ReadFileToString(sim_json));
  EXPECT_EQ(sj["simulated"]["runs"], 3);
  ASSERT_EQ(sj["simulated"]["run_summaries"].size(), 3u);
  double p50 = 0;
  for (const auto& run : sj["simulated"]["run_summaries"])
    p50 += run["ttft_s"]["p50"].get<double>() / 3;
  EXPECT_NEAR(sj["summary"]["ttft_s"]["p50"].get<double>(), p50, 1e-9);

  // --refit fits the report's measured workloads again without a cluster: the fit is
  // deterministic, so the same code gives the same profile, field for field. (This and the
  // refits below keep the report's sharing of the host: one candidate fitted, not the search's
  // 23, which is the same fit as the search's choice, so the same profile; the search itself is
  // what the calibration above ran.)
  const std::string refitted = TempPath("refit.json");
  const std::string refit_report = TempPath("refit_report.json");
  const CliRun refit =
      Tandem("plan calibrate --refit " + report + " --model " + testing::Stories260K() + " --out " +
             refitted + " --report " + refit_report + " --keep-sharing");
  ASSERT_EQ(refit.exit_code, 0) << refit.err;
  EXPECT_EQ(refit.err.find("[tandem-server]"), std::string::npos) << "started a cluster";
  std::ifstream again(refitted);
  EXPECT_EQ(nlohmann::json::parse(again), p);
  std::ifstream again_report(refit_report);
  const nlohmann::json rr = nlohmann::json::parse(again_report);
  EXPECT_EQ(rr["in_situ"]["workloads"], r["in_situ"]["workloads"]);

  // Several reports: one fit to their mean. The same report twice is the report itself.
  const CliRun merged = Tandem("plan calibrate --refit " + report + " --refit " + report +
                               " --model " + testing::Stories260K() + " --out " + refitted +
                               " --report " + refit_report + " --keep-sharing");
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  std::ifstream merged_profile(refitted);
  EXPECT_EQ(nlohmann::json::parse(merged_profile), p);
  std::ifstream merged_report(refit_report);
  EXPECT_EQ(nlohmann::json::parse(merged_report)["merged_from"].size(), 2u);
  EXPECT_EQ(merged.err.find("drifted"), std::string::npos) << merged.err;
  // A report measured while the host was slow (every step 1.5 times as long) is named.
  nlohmann::json slow = r;
  for (auto& w : slow["in_situ"]["workloads"]) {
    w["decode_step_s"] = 1.5 * w["decode_step_s"].get<double>();
    w["prefill_step_s"] = 1.5 * w["prefill_step_s"].get<double>();
  }
  const std::string slow_path = TempPath("slow_report.json");
  std::ofstream(slow_path) << slow.dump();
  const CliRun drifted =
      Tandem("plan calibrate --refit " + report + " --refit " + slow_path + " --model " +
             testing::Stories260K() + " --out " + refitted + " --keep-sharing");
  ASSERT_EQ(drifted.exit_code, 0) << drifted.err;
  EXPECT_NE(drifted.err.find(slow_path + ": its steps took 1.20 times"), std::string::npos)
      << drifted.err;
  EXPECT_NE(drifted.err.find(report + ": its steps took 0.80 times"), std::string::npos)
      << drifted.err;
  // The decode start (the router's start message, an idle decode loop waking up) is fitted to
  // the first gaps of both workloads alone, the long prompts' too: with their gaps three times
  // as long, an idle decode loop starts its requests later.
  nlohmann::json late = r;
  nlohmann::json& long_alone = late["in_situ"]["workloads"][1];
  ASSERT_EQ(long_alone["concurrency"].get<int>(), 1) << long_alone.dump();
  for (const char* key : {"gap_p50_s", "gap_p90_s"}) {
    long_alone["measured"][key] = 3 * long_alone["measured"][key].get<double>();
    for (auto& d : long_alone["measured_draws"]) d[key] = 3 * d[key].get<double>();
  }
  const std::string late_path = TempPath("late_start_report.json");
  std::ofstream(late_path) << late.dump();
  const std::string late_profile = TempPath("late_start.json");
  const CliRun late_fit =
      Tandem("plan calibrate --refit " + late_path + " --model " + testing::Stories260K() +
             " --out " + late_profile + " --keep-sharing");
  ASSERT_EQ(late_fit.exit_code, 0) << late_fit.err;
  std::ifstream late_in(late_profile);
  const nlohmann::json lp = nlohmann::json::parse(late_in);
  auto start_delay = [](const nlohmann::json& q) {  // an idle loop's mean decode start
    return q["decode_start_overhead"].get<double>() + q["decode_start_jitter"].get<double>();
  };
  // At least about a step of the fit's grid (a factor of 1.155) later (a fit that took the short
  // prompts' gaps only would give the same start).
  EXPECT_GT(start_delay(lp), 1.1 * start_delay(p)) << lp.dump() << "\n" << p.dump();
  for (const char* key : {"step_threads", "prefill_threads", "prefill_yield"}) {
    EXPECT_EQ(lp.value(key, 0.0), p.value(key, 0.0)) << key;  // --keep-sharing kept it
  }

  // Reports of other workloads do not merge: refused by index.
  nlohmann::json other = r;
  other["in_situ"]["workloads"][1]["input"] = 17;
  const std::string other_path = TempPath("other_report.json");
  std::ofstream(other_path) << other.dump();
  const CliRun mismatched = Tandem("plan calibrate --refit " + report + " --refit " + other_path +
                                   " --model " + testing::Stories260K() + " --out " + refitted);
  EXPECT_EQ(mismatched.exit_code, 2) << mismatched.err;
  EXPECT_NE(mismatched.err.find("workloads[1]"), std::string::npos) << mismatched.err;
  // Nor those of the same shapes with other request counts: other statistics.
  nlohmann::json longer = r;
  longer["in_situ"]["workloads"][3]["requests"] = 1000;
  std::ofstream(other_path) << longer.dump();
  const CliRun more = Tandem("plan calibrate --refit " + report + " --refit " + other_path +
                             " --model " + testing::Stories260K() + " --out " + refitted);
  EXPECT_EQ(more.exit_code, 2) << more.err;
  EXPECT_NE(more.err.find("workloads[3]"), std::string::npos) << more.err;

  // A report whose runs are not measured runs is refused by field.
  nlohmann::json broken = r;
  broken["in_situ"]["workloads"][2]["decode_step_s"] = 0;
  const std::string broken_path = TempPath("broken_report.json");
  std::ofstream(broken_path) << broken.dump();
  const CliRun bad = Tandem("plan calibrate --refit " + broken_path + " --model " +
                            testing::Stories260K() + " --out " + refitted);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("in_situ.workloads[2]"), std::string::npos) << bad.err;
  // As is one that leaves every request out as warm-up.
  broken = r;
  broken["in_situ"]["workloads"][4]["warmup"] = broken["in_situ"]["workloads"][4]["requests"];
  std::ofstream(broken_path) << broken.dump();
  const CliRun all_warmup = Tandem("plan calibrate --refit " + broken_path + " --model " +
                                   testing::Stories260K() + " --out " + refitted);
  EXPECT_EQ(all_warmup.exit_code, 2) << all_warmup.err;
  EXPECT_NE(all_warmup.err.find("in_situ.workloads[4]"), std::string::npos) << all_warmup.err;
}

TEST(PlanCli, PlanPrintsARankedTable) {
  const CliRun r = Tandem(
      "plan --model stories260k --hardware h100 --workload in=64,out=16 --slo-ttft 0.05 "
      "--slo-tpot 0.002 --gpus 2 --tp 1 --no-colocated --sim-seconds 1 --num-requests 50");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("goodput/GPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1P(tp1) + 1D(tp1)"), std::string::npos) << r.out;
}

// Tensor parallelism is off unless asked for, and then marked as not runnable.
TEST(PlanCli, TensorParallelLayoutsOnlyWhenAskedAndMarkedNotRunnable) {
  const std::string args =
      "plan --model llama-3-8b --hardware h100 --workload in=256,out=32 --slo-ttft 1 "
      "--slo-tpot 0.05 --gpus 3 --no-colocated --sim-seconds 1 --num-requests 40";
  CliRun r = Tandem(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("(tp2)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not runnable"), std::string::npos) << r.out;
  const std::string json = TempPath("tp.json");
  r = Tandem(args + " --tp 1,2 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(tp2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not runnable"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(*ReadFileToString(json));
  for (const auto& c : j["ranked"]) {
    EXPECT_EQ(c["runnable"], c["prefill_tp"] == 1 && c["decode_tp"] == 1) << c.dump();
  }
}

// --emit-kustomize writes an overlay of the GPU overlay that kubectl builds, with the best
// runnable layout's replicas, one GPU per worker and the worker flags the plan assumed.
TEST(PlanCli, EmitKustomizeWritesAnOverlayKubectlBuilds) {
  if (std::system("command -v kubectl >/dev/null 2>&1 && /usr/bin/python3 -c 'import yaml'") != 0) {
    GTEST_SKIP() << "needs kubectl and python3-yaml (scripts/setup.sh installs them)";
  }
  const std::string dir = TempPath("overlay");
  const std::string json = TempPath("emit.json");
  const CliRun r = Tandem(
      "plan --model llama-3-8b --hardware h100 --workload in=512,out=128 --slo-ttft 1 "
      "--slo-tpot 0.05 --gpus 4 --sim-seconds 2 --num-requests 60 --block-size 32 "
      "--token-budget 4096 --max-running 128 --kv-dtype bf16 --json " +
      json + " --emit-kustomize " + dir + " --kustomize-base " + testing::SourceDir() +
      "/deploy/k8s/overlays/gpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The layout written is the best runnable disaggregated one of the ranking.
  const auto plan = nlohmann::json::parse(*ReadFileToString(json));
  nlohmann::json best;
  for (const auto& c : plan["ranked"]) {
    if (c["runnable"] && !c["colocated"]) {
      best = c;
      break;
    }
  }
  ASSERT_FALSE(best.is_null()) << plan.dump();
  EXPECT_NE(r.out.find("wrote " + dir + ": " + best["layout"].get<std::string>()),
            std::string::npos)
      << r.out;
  const std::string built = TempPath("built.json");
  const std::string warnings = TempPath("kustomize.err");
  ASSERT_EQ(std::system(("kubectl kustomize " + dir + " 2>" + warnings +
                         " | /usr/bin/python3 -c 'import json, sys, yaml; "
                         "print(json.dumps(list(yaml.safe_load_all(sys.stdin))))' > " +
                         built)
                            .c_str()),
            0);
  // No deprecated field (bases, patchesStrategicMerge): kustomize says nothing.
  EXPECT_EQ(*ReadFileToString(warnings), "");
  const auto objs = nlohmann::json::parse(*ReadFileToString(built));
  int found = 0;
  for (const auto& o : objs) {
    if (o["kind"] == "Deployment" && o["metadata"]["name"] != "tandem-router") {
      const bool prefill = o["metadata"]["name"] == "tandem-prefill";
      EXPECT_EQ(o["spec"]["replicas"], best[prefill ? "prefill" : "decode"]) << o.dump();
      const auto& limits = o["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
      EXPECT_EQ(limits["nvidia.com/gpu"], "1");
      ++found;
    }
    if (o["kind"] == "ConfigMap" &&
        o["metadata"]["name"].get<std::string>().starts_with("tandem-config")) {
      EXPECT_EQ(o["data"]["TANDEM_WORKER_FLAGS"], "--device auto --block-size 32 --kv-dtype bf16");
      EXPECT_EQ(o["data"]["TANDEM_PREFILL_FLAGS"], "--token-budget 4096 --prefill-chunk 512");
      EXPECT_EQ(o["data"]["TANDEM_DECODE_FLAGS"], "--max-running 128 --lease-timeout-ms 60000");
      EXPECT_EQ(o["data"]["TANDEM_MODEL"], "/models/model");  // the base's, kept
      ++found;
    }
  }
  EXPECT_EQ(found, 3);
  // A base that is not a kustomization is one clear error, before any simulation runs (the plan
  // table, printed after them, never is).
  const CliRun bad = Tandem(
      "plan --model llama-3-8b --hardware h100 --workload in=512,out=128 --slo-ttft 1 "
      "--slo-tpot 0.05 --gpus 8 --sim-seconds 600 --num-requests 5000 --emit-kustomize " +
      dir + " --kustomize-base /nonexistent");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--kustomize-base: /nonexistent has no kustomization.yaml"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.out, "") << "the plan ran before the base was checked";
}

TEST(PlanCli, BadInputIsOneClearLine) {
  struct Case {
    std::string args, env, needle;
    int code;
  };
  const std::string ok = " --hardware h100 --rate 1 --num-requests 5";
  const std::vector<Case> cases = {
      {"plan simulate --model gpt-5" + ok, "", "--model", 2},
      {"plan simulate --model llama-3-8b --hardware tpu-v9 --rate 1", "", "--hardware", 2},
      {"plan simulate --model llama-3-8b --prefill 0" + ok, "", "cluster.prefill", 2},
      {"plan simulate --model llama-3-8b --input-len lots" + ok, "", "length", 2},
      {"plan simulate --model llama-3-8b --colour red" + ok, "", "--colour", 2},
      {"plan simulate --model llama-3-8b --link pigeon" + ok, "", "--link", 2},
      {"plan simulate --model llama-3-8b --prefill-tp 3" + ok, "", "n_heads", 2},
      {"plan --model llama-3-8b --hardware h100 --workload in=5 --slo-ttft 1", "", "out=", 2},
      {"plan --model llama-3-8b --hardware h100 --workload in=5,out=5", "", "--slo", 2},
      {"plan --model llama-3-8b --hardware h100 --workload in=5,out=5 --slo-ttft 1 --tp 16", "",
       "--tp", 2},
      {"plan calibrate", "", "--model", 2},
      {"plan simulate --model llama-3-8b --runs 0" + ok, "", "--runs", 2},
      {"plan simulate --model llama-3-8b --spec-tokens 65" + ok, "", "--spec-tokens", 2},
      {"plan simulate --model llama-3-8b --spec-tokens 4 --spec-acceptance 1" + ok, "",
       "--spec-acceptance", 2},
      {"plan simulate --model llama-3-8b --spec-acceptance 0.5" + ok, "",
       "--spec-acceptance needs --spec-tokens", 2},
      {"plan calibrate --model stories260k --in-situ --draws 0", "", "--draws", 2},
      {"plan calibrate --refit /nonexistent/report.json --model stories260k", "", "--refit", 2},
      {"plan calibrate --refit /nonexistent/report.json", "", "--model", 2},
      {"plan calibrate --model stories260k --in-situ --keep-sharing", "", "--keep-sharing", 2},
      {"plan calibrate --from-device /nonexistent.json --out /tmp/x.json", "", "--base", 2},
      {"plan calibrate --from-device /nonexistent.json --base h200-datasheet --out /tmp/x.json", "",
       "cannot read", 2},
      {"plan calibrate --from-device /dev/null --base h200-datasheet --model stories260k", "",
       "--model", 2},
      {"plan calibrate --model stories260k --base h200-datasheet", "", "--from-device", 2},
      {"plan profiles extra", "", "no arguments", 2},
      {"plan simulate --model llama-3-8b --hardware local --rate 1",
       "TANDEM_LOCAL_PROFILE=/nonexistent/profile.json", "tandem plan calibrate", 1},
  };
  for (const Case& c : cases) {
    const CliRun r = Tandem(c.args, c.env);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace tandem
