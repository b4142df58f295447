// `tandem bench report`: the runs of `tandem bench` (their JSON reports, planner/workload.h) as
// one self-contained SVG.
#ifndef TANDEM_PLANNER_REPORT_SVG_H_
#define TANDEM_PLANNER_REPORT_SVG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::bench {

// Latency CDFs (TTFT, TPOT) of several runs and, when the runs differ in request rate,
// throughput against rate. INVALID_ARGUMENT for no runs.
absl::StatusOr<std::string> RenderReportSvg(const std::vector<nlohmann::json>& runs,
                                            const std::vector<std::string>& labels);

}  // namespace tandem::bench

#endif  // TANDEM_PLANNER_REPORT_SVG_H_
