// `tandem plan`, `tandem plan simulate` and `tandem plan calibrate` (the logic is in planner/).
#ifndef TANDEM_TOOLS_PLAN_CLI_H_
#define TANDEM_TOOLS_PLAN_CLI_H_

#include <string>
#include <vector>

namespace tandem {

// Returns the process exit code (2 for invalid arguments).
int PlanCommand(const std::vector<std::string>& args);

}  // namespace tandem

#endif  // TANDEM_TOOLS_PLAN_CLI_H_
