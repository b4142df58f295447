#include "tools/plan_flags.h"

#include <string>

#include "absl/strings/str_format.h"
#include "planner/calibrate.h"
#include "planner/plan.h"
#include "planner/simulator.h"
#include "tools/bench_flags.h"
#include "tools/calibrate_in_situ.h"

namespace tandem {

const char kPlanUsage[] = R"(usage:
  tandem plan --model CONFIG --hardware PROFILE --workload SPEC --slo-ttft S --slo-tpot S ...
      Searches prefill/decode worker counts within a GPU budget for the highest request
      rate meeting the SLOs; ranks the layouts by that rate per GPU.
  tandem plan simulate --model CONFIG --hardware PROFILE ...
      One configuration, simulated; prints what `tandem bench` prints for a run.
  tandem plan profiles
      The built-in hardware profiles: their figures, and for each whether they are
      datasheet figures or measured (on which device, date and commit).
  tandem plan calibrate --model PATH ... | --refit REPORT ... | --from-device FILE ...
      Fits the `local` profile to forward steps measured on this machine (and, with
      --in-situ, to a 1P1D cluster), again to an earlier calibration's reports, or a
      GPU's profile to a device run.

`tandem plan --help`, `tandem plan simulate --help` and `tandem plan calibrate --help`
give each one's flags and their defaults.
)";

namespace {

constexpr char kPlanFooter[] =
    "CONFIG: a named shape (llama-3-8b, llama-2-7b, tinyllama-1.1b, stories15m, stories110m, "
    "stories260k), a Hugging Face config.json, a model directory or a llama2.c checkpoint. "
    "PROFILE: h200 (measured on an H200: `tandem plan profiles` says where), h100-sxm, "
    "h200-datasheet, a100-80gb, l40s (datasheet figures), local, or a profile JSON file.";

}  // namespace

// The flags of the simulated workers (and the model, hardware and --json), every plan mode's.
std::vector<FlagSpec> WorkerFlags() {
  const planner::ClusterSpec d;
  return {
      ValueFlag("model", "CONFIG", "", "The model (required)"),
      ValueFlag("hardware", "PROFILE", "", "The devices (required)"),
      ValueFlag("json", "FILE", "", "Write the result as JSON"),
      ValueFlag("block-size", "N", std::to_string(d.block_size), "KV block size (tokens)"),
      ValueFlag("token-budget", "N", std::to_string(d.prefill_scheduler.token_budget),
                "Prefill tokens per step"),
      ValueFlag("prefill-chunk", "N", std::to_string(d.prefill_scheduler.chunk_size),
                "Most tokens of one prompt per prefill step"),
      ValueFlag("max-running", "N", std::to_string(d.max_running),
                "Requests on a decode worker at once"),
      BoolFlag("no-prefix-cache", "Prefill workers keep no prefix cache"),
      ValueFlag("kv-bytes", "B", "0",
                "KV cache bytes per worker (0: the device memory after the weights, 1 GiB on "
                "local)"),
      ValueFlag("link", "nvlink|infiniband|roce|tcp|loopback|NAME:GBPS[:LAT_US]", "",
                "The KV transfer's link (default: the profile's)"),
      ValueFlag("dtype", "f32|bf16|f16", "", "The weights (default: the profile's)"),
      ValueFlag("kv-dtype", "f32|bf16|f16|fp8", "", "The KV cache (default: the profile's)"),
      ValueFlag("spec-tokens", "K", std::to_string(d.spec_tokens),
                "Decode workers speculate: K proposals a step (verify steps cost their 1 + K "
                "tokens and logit rows)"),
      ValueFlag("spec-acceptance", "A", absl::StrFormat("%g", d.spec_acceptance),
                "Each proposal is kept with probability A while those before it were"),
  };
}

Flags::Command PlanSearchCommand() {
  const planner::PlanOptions d;
  std::vector<FlagSpec> flags = Concat(
      WorkerFlags(),
      {
          ValueFlag("workload", "SPEC", "",
                    "in=LEN,out=LEN[,arrival=poisson|constant|gamma][,burstiness=B] (LEN as tandem "
                    "bench --input-len), or a .jsonl trace; or give --input-len and --output-len"),
          ValueFlag("gpus", "N", std::to_string(d.gpus),
                    "The GPU budget: prefill + decode devices"),
          ValueFlag("attainment", "F", absl::StrFormat("%g", d.attainment),
                    "The fraction of requests that must meet both SLOs"),
          ValueFlag(
              "tp", "1,2,4,8", "",
              "Tensor-parallel degrees tried (no Tandem worker implements tensor parallelism: "
              "such layouts are marked not runnable)"),
          BoolFlag("no-colocated", "Rank no colocated instances (--role=all) for comparison"),
          ValueFlag("num-requests", "N", "200",
                    "Each simulation sends max(N, rate x --sim-seconds) requests"),
          ValueFlag("sim-seconds", "S", absl::StrFormat("%g", d.min_seconds),
                    "Each simulation sends at least this long at the rate tried"),
          ValueFlag("top", "K", std::to_string(d.top), "Layouts printed"),
          ValueFlag(
              "emit-kustomize", "DIR", "",
              "Write DIR/kustomization.yaml and DIR/plan.yaml: an overlay of --kustomize-base "
              "with the best runnable disaggregated layout's replica counts, GPUs per worker "
              "and the worker flags the plan assumed (`kubectl kustomize DIR` builds it)"),
          ValueFlag("kustomize-base", "PATH", "deploy/k8s/overlays/gpu", "The overlay's base"),
      });
  flags = Concat(std::move(flags),
                 Pick(BenchWorkloadFlags(), {"slo-ttft", "slo-tpot", "seed", "input-len",
                                             "output-len", "arrival", "burstiness"}));
  return {"tandem plan",
          "Capacity planning: searches prefill/decode worker counts within --gpus for the highest "
          "request rate whose SLO attainment reaches --attainment, and ranks the layouts by that "
          "rate per GPU, with predicted TTFT and TPOT. `tandem plan simulate`, `tandem plan "
          "profiles` and `tandem plan calibrate` are the other modes.",
          std::move(flags), "", kPlanFooter};
}

Flags::Command SimulateCommand() {
  const planner::ClusterSpec d;
  std::vector<FlagSpec> flags = Concat(WorkerFlags(), BenchWorkloadFlags());
  flags = Concat(
      std::move(flags),
      {
          ValueFlag("prefill", "N", std::to_string(d.prefill), "Prefill workers"),
          ValueFlag("decode", "M", std::to_string(d.decode), "Decode workers"),
          ValueFlag("colocated", "N", "0",
                    "N colocated instances (--role=all) instead of separate workers"),
          ValueFlag("prefill-tp", "T", std::to_string(d.prefill_tp), "Devices per prefill worker"),
          ValueFlag("decode-tp", "T", std::to_string(d.decode_tp), "Devices per decode worker"),
          ValueFlag("runs", "N", "",
                    absl::StrFormat("Runs averaged, each drawing its own noise as a measured run "
                                    "does (default: %d on a profile with jitter, as a calibrated "
                                    "local one; else 1)",
                                    kNoisyRuns)),
          ValueFlag("steps", "FILE", "", "Write every simulated step as JSON"),
      });
  return {"tandem plan simulate",
          "One configuration, simulated; prints what `tandem bench` prints for a run (the mean "
          "of --runs runs, what repeated `tandem bench` runs average to).",
          std::move(flags), "", kPlanFooter};
}

Flags::Command CalibrateCommand() {
  const planner::CalibrateOptions d;
  return {
      "tandem plan calibrate",
      "Measures forward steps on this machine and fits the `local` profile (written to "
      "$TANDEM_LOCAL_PROFILE or ~/.cache/tandem/local_profile.json). With --in-situ, also starts "
      "a 1P1D cluster of the first model and fits the decode steps and the request path's "
      "overheads to what it measures there (about a minute). --refit REPORT: fits the in-situ "
      "part again to the workloads the reports of in-situ calibrations of --model measured, "
      "without starting a cluster (several: to their mean, which averages a shared host's drift "
      "between them). --from-device FILE: a GPU's profile fitted to the JSON of "
      "bench/cuda_model_bench (scripts/gpu_check.sh writes it) on --base's datasheet peak, "
      "bandwidth, capacity and links; the profile records where it comes from.",
      {
          RepeatedFlag("model", "PATH", "A model measured (repeatable; required)"),
          ValueFlag("out", "FILE", planner::LocalProfilePath(), "The profile written"),
          ValueFlag("report", "FILE", "", "Write the fit's samples and errors as JSON"),
          ValueFlag("repeats", "N", std::to_string(d.repeats), "Timings per step measured"),
          ValueFlag("threads", "N", std::to_string(d.threads),
                    "Threads (0: as the workers, TANDEM_NUM_THREADS or every core)"),
          BoolFlag("in-situ", "Also fit to a 1P1D cluster of the first model"),
          ValueFlag("tokenizer", "PATH", "", "--in-situ: the model's tokenizer"),
          ValueFlag("draws", "N", std::to_string(InSituOptions{}.closed_loop_draws),
                    "--in-situ: runs of each closed loop, the fit taking their mean"),
          RepeatedFlag("refit", "REPORT", "Fit again to this report (repeatable)"),
          BoolFlag("keep-sharing",
                   "--refit: keep the first report's sharing of the host (how many cores a step "
                   "keeps busy) instead of searching it again, about 8 times cheaper"),
          ValueFlag("from-device", "FILE", "", "A device run's JSON"),
          ValueFlag("base", "PROFILE", "", "--from-device: the datasheet profile of its device"),
          ValueFlag("name", "NAME", "", "--from-device: the profile's name (default: --base's)"),
          ValueFlag("provenance", "TEXT", "",
                    "--from-device: where the profile comes from (default: the file's device, "
                    "date and commit)"),
      },
      "",
      kPlanFooter};
}

}  // namespace tandem
