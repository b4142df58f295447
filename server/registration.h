// A worker's link to the router: registers, then heartbeats its load; registers again when the
// router forgets it or restarts.
#ifndef TANDEM_SERVER_REGISTRATION_H_
#define TANDEM_SERVER_REGISTRATION_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "engine/scheduler.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class RegistrationClient {
 public:
  RegistrationClient(const std::string& router_address, v1::RegisterRequest base,
                     std::function<WorkerLoadSnapshot()> load, std::function<bool()> serving,
                     std::function<bool()> draining = nullptr);
  ~RegistrationClient();
  bool registered() const { return registered_.load(); }

 private:
  void Run();
  std::unique_ptr<v1::Registry::Stub> stub_;
  v1::RegisterRequest base_;
  std::function<WorkerLoadSnapshot()> load_;
  std::function<bool()> serving_;
  std::function<bool()> draining_;
  std::atomic<bool> registered_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_SERVER_REGISTRATION_H_
