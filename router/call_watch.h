// Cancelling a request's worker calls, by events: all of them when its client goes away (the
// front end fires the request's `gone` signal: a gRPC OnCancel, an HTTP connection closing or
// failing its outbox), and one when the worker it streams from turns unhealthy (the router's
// health sweep, once per heartbeat period over the open requests, not per request).
#ifndef TANDEM_ROUTER_CALL_WATCH_H_
#define TANDEM_ROUTER_CALL_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "router/async.h"

namespace tandem::router_internal {

class CallWatch {
 public:
  // Subscribes to `gone` (null: the client never goes away by itself).
  explicit CallWatch(std::shared_ptr<async::Signal> gone);
  ~CallWatch();
  CallWatch(const CallWatch&) = delete;
  CallWatch& operator=(const CallWatch&) = delete;

  // A context watched is a new call (a later attempt's context may sit at an earlier one's
  // address): it starts not abandoned, and is cancelled at once if the client is gone.
  void Watch(grpc::ClientContext* c);
  void Unwatch(grpc::ClientContext* c);
  // Sweep cancels `c` when its worker turns unhealthy; abandoned(c) says so after.
  void WatchWorker(grpc::ClientContext* c, std::string worker);
  bool abandoned(grpc::ClientContext* c) const;
  bool cancelled() const { return gone_ && gone_->fired(); }

  // The router's sweep: cancels every call whose worker `healthy` rejects.
  void Sweep(const std::function<bool(const std::string& worker)>& healthy);

 private:
  // Shared with the signal's subscriber, which may run after the watch is gone.
  struct State {
    std::mutex mu;
    bool cancelled = false;
    std::set<grpc::ClientContext*> watched;
    std::map<grpc::ClientContext*, std::string> workers;
    std::set<grpc::ClientContext*> abandoned;
  };
  std::shared_ptr<async::Signal> gone_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  uint64_t subscription_ = 0;
};

}  // namespace tandem::router_internal

#endif  // TANDEM_ROUTER_CALL_WATCH_H_
