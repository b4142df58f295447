#include "router/cluster_view.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "router/call_watch.h"
#include "router/worker_calls.h"

namespace tandem {

ClusterView::ClusterView(ClusterViewOptions options, async::Executor* executor)
    : options_(std::move(options)),
      executor_(executor),
      registry_(options_.registry),
      line_(options_.max_queued) {}

ClusterView::~ClusterView() {
  std::unique_lock<std::mutex> lock(calls_mu_);
  calls_cv_.wait(lock, [&] { return live_calls_ == 0; });
}

void ClusterView::Locked::AddTurnWaiter(uint64_t ticket, std::function<void(bool)> wake) {
  v_->turn_waiters_[ticket] = std::move(wake);
}

uint64_t ClusterView::Locked::AddChangeWaiter(std::function<void(bool)> wake) {
  const uint64_t id = v_->next_waiter_++;
  v_->change_waiters_[id] = std::move(wake);
  return id;
}

void ClusterView::Locked::RemoveWaiters(uint64_t ticket, uint64_t change) {
  if (ticket != 0) v_->turn_waiters_.erase(ticket);
  if (change != 0) v_->change_waiters_.erase(change);
}

void ClusterView::Locked::Notify() {
  ++v_->epoch_;
  if (const uint64_t front = v_->line_.front(); front != 0) {
    if (auto it = v_->turn_waiters_.find(front); it != v_->turn_waiters_.end()) {
      std::function<void(bool)> wake = std::move(it->second);
      v_->turn_waiters_.erase(it);
      wake(true);
    }
  }
  std::map<uint64_t, std::function<void(bool)>> changes;
  changes.swap(v_->change_waiters_);
  for (auto& [id, wake] : changes) wake(true);
}

std::vector<WorkerEntry> ClusterView::Locked::ForgetSilent(absl::Time now) {
  std::vector<WorkerEntry> gone = v_->registry_.ForgetSilent(now);
  for (const WorkerEntry& w : gone) v_->channels_.erase(w.address);
  return gone;
}

std::shared_ptr<grpc::Channel> ClusterView::ChannelFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ch = channels_[address];
  if (!ch) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options_.keepalive_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(1000, options_.keepalive_ms / 2));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(64 << 20);
    ch = grpc::CreateCustomChannel(address,
                                   options_.worker_credentials ? options_.worker_credentials
                                                               : grpc::InsecureChannelCredentials(),
                                   args);
  }
  return ch;
}

std::optional<std::string> ClusterView::AddressOf(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerEntry* w = registry_.Find(worker_id);
  if (w == nullptr) return std::nullopt;
  return w->address;
}

grpc::Status ClusterView::CheckKvTarget(const std::string& decode_id, const KvTarget& target) {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerEntry* w = registry_.Find(decode_id);
  if (w == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("decode worker %s vanished", decode_id));
  }
  if (!w->kv_endpoint.empty() && target.endpoint != w->kv_endpoint) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrFormat("decode worker %s admitted with KV endpoint %s, not the "
                                        "%s it registered",
                                        decode_id, target.endpoint, w->kv_endpoint));
  }
  return grpc::Status::OK;
}

void ClusterView::Prove(grpc::ClientContext* ctx, const char* method, const std::string& address,
                        const google::protobuf::MessageLite& request) const {
  if (options_.internal_auth) {
    options_.internal_auth->Attach(ctx, method, PeerRole::kRouter, address, request);
  }
}

void ClusterView::Learn(const std::string& address, const grpc::ClientContext& ctx) const {
  if (options_.internal_auth) options_.internal_auth->LearnAudience(address, ctx);
}

std::shared_ptr<router_internal::DecodeCall> ClusterView::OpenDecode(
    const std::string& address, std::unique_ptr<grpc::ClientContext> c) {
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++live_calls_;
  }
  return router_internal::DecodeCall::Start(ChannelFor(address), std::move(c), executor_,
                                            [this, address](const grpc::ClientContext& ctx) {
                                              Learn(address, ctx);
                                              std::lock_guard<std::mutex> lock(calls_mu_);
                                              if (--live_calls_ == 0) calls_cv_.notify_all();
                                            });
}

void ClusterView::Watch(router_internal::CallWatch* w) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  watches_.insert(w);
}

void ClusterView::Unwatch(router_internal::CallWatch* w) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  watches_.erase(w);
}

void ClusterView::SweepCalls() {
  // Workers a call may stay on: healthy, or draining (finishing what they hold).
  std::set<std::string> fine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    for (const WorkerEntry* w : registry_.List()) {
      if (registry_.Healthy(*w, now) || w->draining()) fine.insert(w->id);
    }
  }
  std::lock_guard<std::mutex> lock(watch_mu_);
  for (router_internal::CallWatch* w : watches_) {
    w->Sweep([&](const std::string& worker) { return fine.count(worker) > 0; });
  }
}

}  // namespace tandem
