#ifndef TANDEM_PLANNER_PARALLEL_H_
#define TANDEM_PLANNER_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::planner {

// Independent evaluations (a layout's simulations, a sharing's fit) on up to `threads` threads
// (<= 0: the machine's cores): `fn(i)` for every i in [0, n), each once, the results in index
// order, so a search that takes them in order chooses as a sequential one would. `fn` must be
// safe to call from several threads at once (the simulator is: each run is its own).
template <typename T, typename Fn>
std::vector<absl::StatusOr<T>> EvaluateInParallel(size_t n, int threads, Fn fn) {
  std::vector<absl::StatusOr<T>> results(n, absl::UnknownError("not evaluated"));
  const size_t asked = threads > 0 ? static_cast<size_t>(threads)
                                   : static_cast<size_t>(std::thread::hardware_concurrency());
  const size_t workers = std::clamp<size_t>(asked, 1, std::max<size_t>(1, n));
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < n;) results[i] = fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
  return results;
}

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PARALLEL_H_
