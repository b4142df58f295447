// Cancelling a request's worker calls when its client goes away or a worker it streams from turns
// unhealthy: one polling thread (CancelHub) for every request's CancelWatcher.
#ifndef TANDEM_ROUTER_CANCEL_HUB_H_
#define TANDEM_ROUTER_CANCEL_HUB_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace tandem::router_internal {

class CancelWatcher;

// One thread for every request's CancelWatcher (not a thread per request): every 5 ms it polls
// each watcher's client, every 100 ms the health of the workers they stream from.
class CancelHub {
 public:
  CancelHub() : thread_([this] { Run(); }) {}
  ~CancelHub() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add(CancelWatcher* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.insert(w);
  }
  // Once it returns, the hub no longer touches `w`.
  void Remove(CancelWatcher* w) {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.erase(w);
  }

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<CancelWatcher*> watchers_;
  bool stop_ = false;
  std::thread thread_;
};

// Cancels the client contexts of a request's worker calls when the router's own client goes
// away (`cancelled` turns true: a gRPC cancel or deadline, an HTTP disconnect), and a worker
// call whose worker turned unhealthy (WatchWorker). Polled by the router's CancelHub.
class CancelWatcher {
 public:
  CancelWatcher(CancelHub* hub, std::function<bool()> cancelled)
      : hub_(hub), cancelled_fn_(std::move(cancelled)) {
    hub_->Add(this);
  }
  ~CancelWatcher() { hub_->Remove(this); }
  // A context watched is a new call (a later attempt's context may sit at an earlier one's
  // address): it starts not abandoned.
  void Watch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) c->TryCancel();
    watched_.insert(c);
    abandoned_.erase(c);
  }
  void Unwatch(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.erase(c);
    workers_.erase(c);
  }
  // Also cancels `c` when `bad` turns true (checked every 100 ms); abandoned(c) says so after.
  void WatchWorker(grpc::ClientContext* c, std::function<bool()> bad) {
    std::lock_guard<std::mutex> lock(mu_);
    workers_[c] = std::move(bad);
  }
  bool abandoned(grpc::ClientContext* c) {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_.count(c) > 0;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

  // The hub's poll (on its thread, never concurrently with itself).
  void Poll(bool check_workers) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cancelled_ && cancelled_fn_) {
      lock.unlock();
      const bool gone = cancelled_fn_();
      lock.lock();
      if (gone) {
        cancelled_ = true;
        for (auto* c : watched_) c->TryCancel();
      }
    }
    if (!check_workers || workers_.empty()) return;
    auto workers = workers_;
    lock.unlock();
    std::vector<grpc::ClientContext*> bad;
    for (auto& [c, fn] : workers) {
      if (fn()) bad.push_back(c);
    }
    lock.lock();
    for (auto* c : bad) {
      if (workers_.erase(c) == 0) continue;  // unwatched meanwhile
      abandoned_.insert(c);
      c->TryCancel();
    }
  }

 private:
  CancelHub* hub_;
  std::function<bool()> cancelled_fn_;
  std::mutex mu_;
  std::set<grpc::ClientContext*> watched_;
  std::map<grpc::ClientContext*, std::function<bool()>> workers_;
  std::set<grpc::ClientContext*> abandoned_;
  bool cancelled_ = false;
};

}  // namespace tandem::router_internal

#endif  // TANDEM_ROUTER_CANCEL_HUB_H_
