#include "server/registration.h"

#include <grpcpp/grpcpp.h>

#include "server/grpc_util.h"

namespace tandem {

RegistrationClient::RegistrationClient(const std::string& router_address, v1::RegisterRequest base,
                                       std::function<WorkerLoadSnapshot()> load,
                                       std::function<bool()> serving,
                                       std::function<bool()> draining)
    : stub_(v1::Registry::NewStub(
          grpc::CreateChannel(router_address, grpc::InsecureChannelCredentials()))),
      base_(std::move(base)),
      load_(std::move(load)),
      serving_(std::move(serving)),
      draining_(std::move(draining)),
      thread_([this] { Run(); }) {}

RegistrationClient::~RegistrationClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RegistrationClient::Run() {
  int interval_ms = 200;  // until the router says otherwise
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!registered_) {
      v1::RegisterRequest req = base_;
      *req.mutable_load() = ToProto(load_());
      v1::RegisterResponse resp;
      if (stub_->Register(&ctx, req, &resp).ok()) {
        registered_ = true;
        if (resp.heartbeat_interval_ms() > 0) interval_ms = resp.heartbeat_interval_ms();
      }
    } else {
      v1::HeartbeatRequest req;
      req.set_worker_id(base_.worker_id());
      *req.mutable_load() = ToProto(load_());
      req.set_serving(serving_());
      req.set_draining(draining_ && draining_());
      v1::HeartbeatResponse resp;
      grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
      if (!s.ok() || !resp.known()) registered_ = false;
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(registered_ ? interval_ms : 200));
  }
}

}  // namespace tandem
