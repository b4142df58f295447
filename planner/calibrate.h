// `tandem plan calibrate`: the `local` hardware profile, fitted to step times measured on this
// machine. The real forward pass runs prefill chunks, decode batches and speculative verify steps
// (every token's logits) of several shapes; a non-negative least-squares fit (relative error) of
//   seconds = overhead + matmul_flops / (peak · e_mm) + attention_flops / (peak · e_att)
//             + bytes / (bandwidth · e_bw)
// gives the step overhead and the three efficiency factors, against the float32 FMA peak and
// read bandwidth measured in the same run.
#ifndef TANDEM_PLANNER_CALIBRATE_H_
#define TANDEM_PLANNER_CALIBRATE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "nlohmann/json.hpp"
#include "planner/cost_model.h"

namespace tandem::planner {

// One measured step.
struct StepSample {
  std::string model;
  ModelConfig config;
  double weight_bytes = 4;  // per parameter, as the model is stored
  std::vector<ChunkShape> batch;
  // The fastest of the repeats: other tenants only ever add time, so the minimum is the step's
  // own cost on this machine.
  double seconds = 0;
  // Its weight in the fit (which minimizes the weighted relative errors' squares).
  double weight = 1;
};

struct CalibrateOptions {
  std::vector<std::string> models;  // paths: HF directories or llama2.c checkpoints
  int repeats = 7;
  int threads = 0;                          // 0: as the workers (TANDEM_NUM_THREADS or every core)
  double max_kv_bytes = 512.0 * (1 << 20);  // cases whose cache would exceed this are skipped
};

// Runs the cases on each model; `log` (may be null) gets one line per case.
absl::StatusOr<std::vector<StepSample>> MeasureSteps(const CalibrateOptions& options,
                                                     const std::function<void(std::string)>& log);

// Fits `base`'s step_overhead and efficiency factors (overlap off: a CPU mostly serializes
// compute and memory traffic) to the samples; `fit_report` (may be null) gets per-sample
// predicted vs measured.
absl::StatusOr<HardwareProfile> FitProfile(HardwareProfile base,
                                           const std::vector<StepSample>& samples,
                                           nlohmann::json* fit_report);

// The local machine's starting point: measured peak and bandwidth, capacity from the physical
// memory, the loopback link, every worker on one shared host.
HardwareProfile LocalBaseProfile(int threads);

// A GPU's profile from a device run of bench/cuda_model_bench (its JSON: a Llama-3-8B-shaped
// bf16 model of `layers` layers; decode steps of `batch` sequences at `context` positions,
// prefills of `tokens`; the KV dtype it ran with, f32 where the file does not say): `base`'s peak,
// bandwidth and capacity (datasheet figures) with the step overhead and efficiencies fitted to
// those steps as FitProfile fits them, in its sum model (overlap off: the measured steps are
// neither at the bandwidth nor at the compute bound). The KV dtype of the profile stays `base`'s
// (what a deployment runs). The profile's provenance is `provenance`, or where that is empty the
// file's own device, date and commit (an error if it names no device).
absl::StatusOr<HardwareProfile> ProfileFromDeviceBench(const HardwareProfile& base,
                                                       const nlohmann::json& bench,
                                                       const std::string& provenance,
                                                       nlohmann::json* fit_report);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_CALIBRATE_H_
