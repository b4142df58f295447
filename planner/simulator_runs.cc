// The simulator's entry points that stand outside one simulation (planner/simulator.h): the
// cluster's validation, several runs of a workload and their mean.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "planner/simulator.h"

namespace tandem::planner {

absl::Status ClusterSpec::Validate() const {
  if (prefill < 1 || prefill > 4096) {
    return absl::InvalidArgumentError("cluster.prefill must be in [1, 4096]");
  }
  if (!colocated && (decode < 1 || decode > 4096)) {
    return absl::InvalidArgumentError("cluster.decode must be in [1, 4096]");
  }
  if (prefill_tp < 1 || decode_tp < 1 || prefill_tp > 64 || decode_tp > 64) {
    return absl::InvalidArgumentError("cluster tensor-parallel degrees must be in [1, 64]");
  }
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError("cluster.block_size must be in [1, 4096]");
  }
  if (prefill_scheduler.token_budget < 1 || prefill_scheduler.chunk_size < 1 ||
      prefill_scheduler.max_batch < 1) {
    return absl::InvalidArgumentError(
        "cluster token_budget, prefill chunk and max_batch must be >= 1");
  }
  if (max_running < 1) return absl::InvalidArgumentError("cluster.max_running must be >= 1");
  if (!(prefill_kv_bytes >= 0) || !(decode_kv_bytes >= 0)) {
    return absl::InvalidArgumentError("cluster KV bytes must be >= 0");
  }
  if (!(heartbeat_interval > 0)) {
    return absl::InvalidArgumentError("cluster.heartbeat_interval must be > 0");
  }
  if (decode_attempts < 1)
    return absl::InvalidArgumentError("cluster.decode_attempts must be >= 1");
  if (max_queued < 0) return absl::InvalidArgumentError("cluster.max_queued must be >= 0");
  if (spec_tokens < 0 || spec_tokens > 64) {
    return absl::InvalidArgumentError("cluster.spec_tokens must be in [0, 64]");
  }
  if (!(spec_acceptance >= 0 && spec_acceptance < 1)) {
    return absl::InvalidArgumentError("cluster.spec_acceptance must be in [0, 1)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SimResult>> SimulateRuns(const ModelConfig& model,
                                                    const HardwareProfile& profile,
                                                    const ClusterSpec& cluster,
                                                    const bench::BenchConfig& workload, int runs,
                                                    const SimOptions& options) {
  if (runs < 1 || runs > 1000) return absl::InvalidArgumentError("runs must be in [1, 1000]");
  std::vector<SimResult> results;
  SimOptions o = options;
  for (int i = 0; i < runs; ++i) {
    o.noise_seed = runs == 1 ? options.noise_seed : static_cast<uint64_t>(i + 1);
    auto r = Simulate(model, profile, cluster, workload, o);
    if (!r.ok()) return r.status();
    results.push_back(*std::move(r));
  }
  return results;
}

bench::BenchSummary MeanSummary(const std::vector<SimResult>& runs) {
  if (runs.empty()) return {};
  if (runs.size() == 1) return runs[0].summary;
  const double n = static_cast<double>(runs.size());
  // Counts are summed, then divided (rounded) at the end; rates and percentiles are averaged.
  bench::BenchSummary m;
  int64_t sent = 0, completed = 0, failed = 0;
  for (const SimResult& r : runs) {
    const bench::BenchSummary& s = r.summary;
    sent += s.sent;
    completed += s.completed;
    failed += s.failed;
    m.prompt_tokens += s.prompt_tokens;
    m.output_tokens += s.output_tokens;
    for (const auto& [status, count] : s.rejected) m.rejected[status] += count;
    m.rejected_total += s.rejected_total;
    m.duration += s.duration / n;
    m.request_throughput += s.request_throughput / n;
    m.output_token_throughput += s.output_token_throughput / n;
    m.total_token_throughput += s.total_token_throughput / n;
    m.goodput += s.goodput / n;
    m.slo_attainment += s.slo_attainment / n;
    for (auto [to, from] : {std::pair{&m.ttft, &s.ttft}, std::pair{&m.tpot, &s.tpot},
                            std::pair{&m.itl, &s.itl}, std::pair{&m.e2e, &s.e2e}}) {
      to->mean += from->mean / n;
      to->p50 += from->p50 / n;
      to->p90 += from->p90 / n;
      to->p99 += from->p99 / n;
      to->max += from->max / n;
      to->count += from->count;
    }
  }
  auto per_run = [&](int64_t total) { return std::llround(total / n); };
  m.sent = static_cast<int>(per_run(sent));
  m.completed = static_cast<int>(per_run(completed));
  m.failed = static_cast<int>(per_run(failed));
  m.prompt_tokens = per_run(m.prompt_tokens);
  m.output_tokens = per_run(m.output_tokens);
  for (auto& [status, count] : m.rejected) count = static_cast<int>(per_run(count));
  m.rejected_total = static_cast<int>(per_run(m.rejected_total));
  for (bench::Percentiles* p : {&m.ttft, &m.tpot, &m.itl, &m.e2e}) {
    p->count = static_cast<int>(per_run(p->count));
  }
  return m;
}

bool HasNoise(const HardwareProfile& p) {
  return p.step_jitter > 0 || p.prefill_step_jitter > 0 || p.request_jitter > 0 ||
         p.decode_start_jitter > 0;
}

}  // namespace tandem::planner
