// What the router knows of its cluster, behind one lock, and the calls to its workers: the
// worker registry, the line for KV room, the requests in flight, the API keys' quotas, the fair
// shares of the decode batch, the waiting requests' wake-ups, and the channels. Router serves
// the registry calls through it, and each request (router/generate_transaction.h) reads and
// changes it only through a Locked handle, never through the router's own members.
#ifndef TANDEM_ROUTER_CLUSTER_VIEW_H_
#define TANDEM_ROUTER_CLUSTER_VIEW_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv_transfer/kv_transfer.h"
#include "router/admission.h"
#include "router/async.h"
#include "router/registry.h"
#include "router/tenant_quota.h"
#include "rpc/internal_auth.h"

namespace tandem {

namespace router_internal {
class CallWatch;
class DecodeCall;
class GenerateTransaction;
}  // namespace router_internal

struct ClusterViewOptions {
  RegistryOptions registry;
  int max_queued = 16384;  // places in the line for KV room
  int keepalive_ms = 10000;
  // The calls to workers: their credentials (nullptr: plaintext) and the cluster's proof.
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials;
  std::shared_ptr<InternalAuth> internal_auth;
};

class ClusterView {
 public:
  ClusterView(ClusterViewOptions options, async::Executor* executor);
  // Waits for the decode streams gRPC still holds (they report to the view when done).
  ~ClusterView();

  // The shared state, for as long as the handle lives (one lock; never held across a wait).
  class Locked {
   public:
    WorkerRegistry& registry() { return v_->registry_; }
    AdmissionLine& line() { return v_->line_; }
    std::set<std::string>& in_flight() { return v_->in_flight_; }
    TenantQuotas& quotas() { return v_->quotas_; }
    RunningShares& shares() { return v_->shares_; }
    // The sequences streaming from decode workers, by their id in the shares.
    std::unordered_map<uint64_t, router_internal::GenerateTransaction*>& streaming() {
      return v_->streaming_;
    }
    uint64_t NextShareId() { return v_->next_share_id_++; }

    // Wake-ups of waiting requests. A waiter registers with the epoch it saw when it last
    // looked; Notify (something changed: room may have freed, a worker came) bumps the epoch
    // and wakes the front of the line's waiter and every waiter for any change.
    uint64_t epoch() const { return v_->epoch_; }
    void AddTurnWaiter(uint64_t ticket, std::function<void(bool)> wake);
    uint64_t AddChangeWaiter(std::function<void(bool)> wake);  // its id
    void RemoveWaiters(uint64_t ticket, uint64_t change);
    void Notify();

    // Workers silent past the registry's forget_after leave it, with their channels: those.
    std::vector<WorkerEntry> ForgetSilent(absl::Time now);

   private:
    friend class ClusterView;
    explicit Locked(ClusterView* v) : lock_(v->mu_), v_(v) {}
    std::unique_lock<std::mutex> lock_;
    ClusterView* v_;
  };
  Locked Lock() { return Locked(this); }

  // ---- Calls to workers (each takes the lock briefly) ----
  std::shared_ptr<grpc::Channel> ChannelFor(const std::string& address);
  std::optional<std::string> AddressOf(const std::string& worker_id);
  // OK when `target` names the KV endpoint decode worker `decode_id` registered.
  grpc::Status CheckKvTarget(const std::string& decode_id, const KvTarget& target);
  // Adds the cluster's proof to a call of `method` to the worker at `address` over `request` (a
  // stream's first message); Learn, after a call ends, keeps the worker's instance current.
  void Prove(grpc::ClientContext* ctx, const char* method, const std::string& address,
             const google::protobuf::MessageLite& request) const;
  void Learn(const std::string& address, const grpc::ClientContext& ctx) const;
  // A decode stream to the worker at `address`, counted as live until gRPC is done with it.
  std::shared_ptr<router_internal::DecodeCall> OpenDecode(const std::string& address,
                                                          std::unique_ptr<grpc::ClientContext> c);

  // ---- The health sweep over the open requests' worker calls ----
  void Watch(router_internal::CallWatch* w);
  void Unwatch(router_internal::CallWatch* w);
  // Cancels every watched call to a worker that is neither healthy nor draining.
  void SweepCalls();

 private:
  const ClusterViewOptions options_;
  async::Executor* const executor_;

  std::mutex mu_;
  WorkerRegistry registry_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::set<std::string> in_flight_;
  AdmissionLine line_;
  TenantQuotas quotas_;
  RunningShares shares_;
  std::unordered_map<uint64_t, router_internal::GenerateTransaction*> streaming_;
  uint64_t next_share_id_ = 1;
  std::unordered_map<uint64_t, std::function<void(bool)>> turn_waiters_;
  std::map<uint64_t, std::function<void(bool)>> change_waiters_;
  uint64_t next_waiter_ = 1;
  uint64_t epoch_ = 0;

  std::mutex watch_mu_;
  std::set<router_internal::CallWatch*> watches_;

  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  int live_calls_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_CLUSTER_VIEW_H_
