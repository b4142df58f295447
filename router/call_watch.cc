#include "router/call_watch.h"

#include <utility>
#include <vector>

namespace tandem::router_internal {

CallWatch::CallWatch(std::shared_ptr<async::Signal> gone) : gone_(std::move(gone)) {
  if (!gone_) return;
  subscription_ = gone_->Subscribe([state = state_] {
    std::lock_guard<std::mutex> lock(state->mu);
    state->cancelled = true;
    for (grpc::ClientContext* c : state->watched) c->TryCancel();
  });
}

CallWatch::~CallWatch() {
  if (gone_ && subscription_ != 0) gone_->Unsubscribe(subscription_);
}

void CallWatch::Watch(grpc::ClientContext* c) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->cancelled) c->TryCancel();
  state_->watched.insert(c);
  state_->abandoned.erase(c);
}

void CallWatch::Unwatch(grpc::ClientContext* c) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->watched.erase(c);
  state_->workers.erase(c);
}

void CallWatch::WatchWorker(grpc::ClientContext* c, std::string worker) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->workers[c] = std::move(worker);
}

bool CallWatch::abandoned(grpc::ClientContext* c) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->abandoned.count(c) > 0;
}

void CallWatch::Sweep(const std::function<bool(const std::string& worker)>& healthy) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto it = state_->workers.begin(); it != state_->workers.end();) {
    if (healthy(it->second)) {
      ++it;
      continue;
    }
    state_->abandoned.insert(it->first);
    it->first->TryCancel();
    it = state_->workers.erase(it);
  }
}

}  // namespace tandem::router_internal
