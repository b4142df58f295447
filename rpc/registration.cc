#include "rpc/registration.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rpc/grpc_util.h"

namespace tandem {

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::vector<std::string>> ResolveHostPort(const std::string& target) {
  std::string host;
  std::string port_text;
  if (!target.empty() && target[0] == '[') {
    const size_t close = target.find(']');
    if (close == std::string::npos || close + 1 >= target.size() || target[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("--router: expected [IPV6]:PORT, got \"", target, "\""));
    }
    host = target.substr(1, close - 1);
    port_text = target.substr(close + 2);
  } else {
    const size_t colon = target.rfind(':');
    if (colon == std::string::npos || target.find(':') != colon) {
      return absl::InvalidArgumentError(
          absl::StrCat("--router: expected HOST:PORT, got \"", target, "\""));
    }
    host = target.substr(0, colon);
    port_text = target.substr(colon + 1);
  }
  int port = 0;
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--router: empty host in \"", target, "\""));
  }
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router: port must be in [1, 65535], got \"", port_text, "\""));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("--router: cannot resolve \"", host, "\": ", ::gai_strerror(rc)));
  }
  std::set<std::string> addresses;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src = nullptr;
    if (a->ai_family == AF_INET) {
      src = &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr;
    } else if (a->ai_family == AF_INET6) {
      src = &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr;
    } else {
      continue;
    }
    if (::inet_ntop(a->ai_family, src, buf, sizeof(buf)) != nullptr) {
      addresses.insert(JoinHostPort(buf, port));
    }
  }
  ::freeaddrinfo(result);
  if (addresses.empty()) {
    return absl::UnavailableError(absl::StrCat("--router: \"", host, "\" has no IP address"));
  }
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

// One router replica: registers, then heartbeats at the interval the router asks for.
class RegistrationClient::Link {
 public:
  Link(const RegistrationClient* owner, std::string address)
      : owner_(owner),
        address_(std::move(address)),
        stub_(v1::Registry::NewStub(grpc::CreateChannel(
            address_, owner->options_.credentials ? owner->options_.credentials
                                                  : grpc::InsecureChannelCredentials()))),
        thread_([this] { Run(); }) {}

  // Wakes the link's thread to end (a call in flight finishes first, within its deadline).
  void RequestStop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  // Joins the thread. `goodbye`: the worker is shutting down; tell the router it no longer
  // serves (one call, 500 ms at most).
  void Stop(bool goodbye) {
    RequestStop();
    if (thread_.joinable()) thread_.join();
    if (!goodbye || !registered_) return;
    v1::HeartbeatRequest req;
    req.set_worker_id(owner_->base_.worker_id());
    *req.mutable_load() = ToProto(owner_->load_());
    req.set_serving(false);
    v1::HeartbeatResponse resp;
    Call(internal_method::kHeartbeat, req, std::chrono::milliseconds(500),
         [&](grpc::ClientContext* ctx) { return stub_->Heartbeat(ctx, req, &resp); });
  }

  bool registered() const { return registered_; }

 private:
  void Run() {
    int interval_ms = 0;  // the router's, once registered
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      const std::chrono::milliseconds deadline(2000);
      if (!registered_) {
        v1::RegisterRequest req = owner_->base_;
        *req.mutable_load() = ToProto(owner_->load_());
        v1::RegisterResponse resp;
        grpc::Status s =
            Call(internal_method::kRegister, req, deadline,
                 [&](grpc::ClientContext* ctx) { return stub_->Register(ctx, req, &resp); });
        if (s.ok()) {
          registered_ = true;
          interval_ms = resp.heartbeat_interval_ms() > 0 ? resp.heartbeat_interval_ms() : 500;
          std::fprintf(stderr, "[tandem-server] registered %s with the router at %s\n",
                       owner_->base_.worker_id().c_str(), address_.c_str());
        } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                   s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                   s.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
                   s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                   s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          // A refusal (e.g. a KV transport other than the cluster's), not a router that is
          // not up yet: say why, and keep retrying in case the cluster changes.
          std::fprintf(stderr, "[tandem-server] the router at %s refused %s: %s\n",
                       address_.c_str(), owner_->base_.worker_id().c_str(),
                       s.error_message().c_str());
        }
      } else {
        v1::HeartbeatRequest req;
        req.set_worker_id(owner_->base_.worker_id());
        *req.mutable_load() = ToProto(owner_->load_());
        req.set_serving(owner_->serving_());
        req.set_draining(owner_->draining_ && owner_->draining_());
        v1::HeartbeatResponse resp;
        grpc::Status s =
            Call(internal_method::kHeartbeat, req, deadline,
                 [&](grpc::ClientContext* ctx) { return stub_->Heartbeat(ctx, req, &resp); });
        if (!s.ok() || !resp.known()) {
          registered_ = false;
          std::fprintf(stderr, "[tandem-server] router at %s %s; registering again\n",
                       address_.c_str(), s.ok() ? "forgot this worker" : "did not answer");
        }
      }
      lock.lock();
      cv_.wait_for(lock, registered_ ? std::chrono::milliseconds(interval_ms)
                                     : absl::ToChronoMilliseconds(owner_->options_.retry_interval));
    }
  }

  // One call to this router with the cluster's proof, made again at once when the router named
  // an instance the proof did not (a router restarted, or the first call to it).
  grpc::Status Call(const char* method, const google::protobuf::MessageLite& req,
                    std::chrono::milliseconds timeout,
                    const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
    auto prepare = [timeout](grpc::ClientContext* ctx) {
      ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    };
    if (owner_->options_.auth == nullptr) {
      grpc::ClientContext ctx;
      prepare(&ctx);
      return call(&ctx);
    }
    const PeerRole as =
        owner_->base_.role() == v1::WORKER_ROLE_PREFILL ? PeerRole::kPrefill : PeerRole::kDecode;
    return owner_->options_.auth->Call(address_, method, as, req, prepare, call);
  }

  const RegistrationClient* owner_;
  const std::string address_;
  std::unique_ptr<v1::Registry::Stub> stub_;
  std::atomic<bool> registered_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

RegistrationClient::RegistrationClient(std::string router, v1::RegisterRequest base,
                                       std::function<WorkerLoadSnapshot()> load,
                                       std::function<bool()> serving,
                                       std::function<bool()> draining, RegistrationOptions options)
    : router_(std::move(router)),
      base_(std::move(base)),
      load_(std::move(load)),
      serving_(std::move(serving)),
      draining_(std::move(draining)),
      options_(options),
      thread_([this] { Run(); }) {}

RegistrationClient::~RegistrationClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Every link stops at once, so that an unreachable router delays shutdown by one deadline
  // rather than one per router; then the goodbyes go out in parallel.
  for (auto& [address, link] : links_) link->RequestStop();
  std::vector<std::thread> goodbyes;
  for (auto& [address, link] : links_) {
    goodbyes.emplace_back([l = link.get()] { l->Stop(/*goodbye=*/true); });
  }
  for (auto& t : goodbyes) t.join();
}

std::vector<std::string> RegistrationClient::registered_with() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [address, link] : links_) {
    if (link->registered()) out.push_back(address);
  }
  return out;
}

void RegistrationClient::Run() {
  std::string last_error;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    absl::StatusOr<std::vector<std::string>> resolved = ResolveHostPort(router_);
    std::vector<std::unique_ptr<Link>> gone;
    lock.lock();
    if (resolved.ok()) {
      last_error.clear();
      const std::set<std::string> now(resolved->begin(), resolved->end());
      for (auto it = links_.begin(); it != links_.end();) {
        if (now.count(it->first)) {
          ++it;
        } else {
          std::fprintf(stderr, "[tandem-server] router %s no longer resolves to %s\n",
                       router_.c_str(), it->first.c_str());
          gone.push_back(std::move(it->second));
          it = links_.erase(it);
        }
      }
      for (const std::string& address : now) {
        if (!links_.count(address)) links_[address] = std::make_unique<Link>(this, address);
      }
    } else if (std::string(resolved.status().message()) != last_error) {
      // A name that does not resolve (yet, or for a moment): keep the routers we have.
      last_error = std::string(resolved.status().message());
      std::fprintf(stderr, "[tandem-server] %s\n", last_error.c_str());
    }
    if (!gone.empty()) {
      lock.unlock();
      for (auto& link : gone) link->Stop(/*goodbye=*/false);
      lock.lock();
    }
    // Until the name first resolves, retry quickly.
    cv_.wait_for(lock, absl::ToChronoMilliseconds(links_.empty() ? options_.retry_interval
                                                                 : options_.resolve_interval));
  }
}

}  // namespace tandem
