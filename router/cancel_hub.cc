#include "router/cancel_hub.h"

#include <chrono>

namespace tandem::router_internal {

void CancelHub::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (int64_t tick = 1; !stop_; ++tick) {
    for (CancelWatcher* w : watchers_) w->Poll(tick % 20 == 0);
    cv_.wait_for(lock, std::chrono::milliseconds(5));
  }
}

}  // namespace tandem::router_internal
