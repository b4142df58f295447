// Real Tandem processes for the fault tests: a router and workers started one by one with
// their own flags (fault injection, timeouts), that a test can kill (-9), stop and continue,
// terminate and watch exit; health checks; the leak check over every live process's /metrics;
// descriptor and RSS counts; and an asynchronous driver for thousands of concurrent streams.
#ifndef TANDEM_TESTS_RELIABILITY_FAULT_CLUSTER_H_
#define TANDEM_TESTS_RELIABILITY_FAULT_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/cluster_auth.h"
#include "tests/metrics/metrics_text.h"
#include "tests/test_util.h"
#include "tools/server_process.h"

namespace tandem::testing {

struct Proc {
  std::string role;  // "router", "prefill", "decode", "all"
  pid_t pid = -1;
  std::string address;   // the router's public API; a worker's (internal) port
  std::string internal;  // the internal port
  std::string metrics;
  bool alive = false;
};

class FaultCluster {
 public:
  // `model`: every process's --model and --tokenizer flags (empty: stories260K's).
  explicit FaultCluster(std::vector<std::string> model = {})
      : model_(model.empty()
                   ? std::vector<std::string>{"--model", Stories260K(), "--tokenizer", Tok512()}
                   : std::move(model)) {}
  FaultCluster(const FaultCluster&) = delete;
  FaultCluster& operator=(const FaultCluster&) = delete;

  ~FaultCluster() {
    stub_.reset();
    registry_.reset();
    channel_.reset();
    internal_channel_.reset();
    for (size_t i = 0; i < procs_.size(); ++i) {
      if (!procs_[i].alive) continue;
      ::kill(procs_[i].pid, SIGCONT);
      ::kill(procs_[i].pid, SIGKILL);
      int status;
      ::waitpid(procs_[i].pid, &status, 0);
    }
  }

  std::vector<std::string> ModelFlags() const {
    std::vector<std::string> flags = model_;
    Append(flags, {"--cluster-secret-file", TestClusterSecretFile()});
    return flags;
  }

  // Starts the router (index 0). Heartbeats every 100 ms: a silent worker is unhealthy after
  // 1 s (the registry's minimum).
  int StartRouter(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {"--role=router", "--heartbeat-ms", "100"};
    Append(argv, ModelFlags());
    Append(argv, flags);
    const int i = Start("router", argv);
    channel_ = grpc::CreateChannel(procs_[i].address, grpc::InsecureChannelCredentials());
    router_internal_ = procs_[i].internal;
    internal_channel_ = grpc::CreateChannel(router_internal_, grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
    registry_ = v1::Registry::NewStub(internal_channel_);
    return i;
  }

  // Starts a worker registered with the router; returns its index once the router lists it
  // healthy (-1 if it never does).
  int StartWorker(const std::string& role, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {"--role=" + role, "--router", procs_.at(0).internal};
    Append(argv, ModelFlags());
    Append(argv, flags);
    const int i = Start(role, argv);
    if (procs_[i].address.empty()) return -1;
    for (int waited = 0; waited < 10000; waited += 50) {
      if (WorkerHealthy(i)) return i;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  Proc& proc(int i) { return procs_.at(i); }
  int size() const { return static_cast<int>(procs_.size()); }
  v1::Generation::Stub* generation() { return stub_.get(); }

  v1::ListWorkersResponse Workers() { return ListWorkers(router_internal_, registry_.get()); }
  // The router's view of worker `i` (matched by its address); nullptr when not listed.
  std::optional<v1::WorkerInfo> Info(int i) {
    const v1::ListWorkersResponse all = Workers();  // (not a temporary in the range-for)
    for (const auto& w : all.workers()) {
      if (w.address() == procs_.at(i).address) return w;
    }
    return std::nullopt;
  }
  bool WorkerHealthy(int i) {
    auto w = Info(i);
    return w && w->healthy();
  }
  // Polls until `pred` holds (true) or `timeout_ms` passes (false).
  static bool WaitFor(const std::function<bool()>& pred, int timeout_ms = 10000) {
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // The index of the first live worker of `role` running or queueing a request (by the
  // router's view: heartbeats), or -1.
  int Busy(const std::string& role) {
    for (int i = 0; i < size(); ++i) {
      if (procs_[i].role != role || !procs_[i].alive) continue;
      auto w = Info(i);
      if (w && (w->load().running_requests() > 0 || w->load().queue_depth() > 0)) return i;
    }
    return -1;
  }

  // grpc.health.v1 Check on process `i`: SERVING (1), NOT_SERVING (2), or -1 unreachable.
  int Health(int i) {
    auto ch = grpc::CreateChannel(procs_.at(i).address, grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckResponse resp;
    if (!stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok()) return -1;
    return resp.status();
  }

  void Signal(int i, int sig) { ::kill(procs_.at(i).pid, sig); }
  // Renices every thread of process `i` (threads it starts later inherit it); false if one
  // could not be.
  bool Nice(int i, int level) {
    bool ok = true;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(
             absl::StrFormat("/proc/%d/task", procs_.at(i).pid), ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const int tid = std::stoi(it->path().filename().string());
      ok = ::setpriority(PRIO_PROCESS, tid, level) == 0 && ok;
    }
    return ok && !ec;
  }
  void Kill(int i) {
    Proc& p = procs_.at(i);
    ::kill(p.pid, SIGKILL);
    int status;
    ::waitpid(p.pid, &status, 0);
    p.alive = false;
  }
  // Waits for process `i` to exit: its exit code, 128 + signal when killed, -1 on timeout.
  int WaitExit(int i, int timeout_ms) {
    Proc& p = procs_.at(i);
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.alive = false;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  std::vector<MetricSample> Metrics(int i) { return Scrape(procs_.at(i).metrics); }
  double Metric(int i, const std::string& name) { return MetricValue(Metrics(i), name); }

  // The leak check over every live process except `skip`: the router has no request in flight;
  // decode workers hold no KV block, lease or request; prefill workers nothing queued or
  // running. Waits up to `timeout_ms` for the state to settle; `why` says what was left.
  bool NoLeaks(std::string* why = nullptr, std::vector<int> skip = {}, int timeout_ms = 10000) {
    std::string last;
    const bool ok = WaitFor(
        [&] {
          for (int i = 0; i < size(); ++i) {
            const Proc& p = procs_[i];
            if (!p.alive || std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
            const auto m = Metrics(i);
            auto v = [&](const char* n) { return MetricValue(m, n); };
            const double requests =
                v("tandem_num_requests_running") + v("tandem_num_requests_waiting");
            if (requests != 0) {
              last = absl::StrFormat("%s %d: %g requests", p.role, i, requests);
              return false;
            }
            if (p.role == "decode") {
              if (v("tandem_kv_cache_usage_perc") != 0 || v("tandem_kv_leases_waiting") != 0) {
                last =
                    absl::StrFormat("decode %d: KV usage %g, leases %g", i,
                                    v("tandem_kv_cache_usage_perc"), v("tandem_kv_leases_waiting"));
                return false;
              }
            }
          }
          return true;
        },
        timeout_ms);
    if (why) *why = last;
    return ok;
  }

  int Fds(int i) {
    int n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(
             absl::StrFormat("/proc/%d/fd", procs_.at(i).pid), ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++n;
    }
    return n;
  }
  int64_t RssKb(int i) {
    std::ifstream in(absl::StrFormat("/proc/%d/status", procs_.at(i).pid));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    }
    return -1;
  }

 private:
  static void Append(std::vector<std::string>& a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
  }
  int Start(const std::string& role, const std::vector<std::string>& argv) {
    const ServerProcess sp = StartServerProcess(BinDir() + "/tandem-server", argv);
    Proc p;
    p.role = role;
    p.pid = sp.pid;
    p.address = sp.address;
    p.internal = sp.internal;
    p.metrics = sp.metrics;
    p.alive = sp.pid > 0;
    procs_.push_back(p);
    return static_cast<int>(procs_.size()) - 1;
  }

  std::vector<std::string> model_;  // --model and --tokenizer
  std::vector<Proc> procs_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> internal_channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::string router_internal_;
  std::unique_ptr<v1::Registry::Stub> registry_;
};

// One finished call of the asynchronous driver.
struct CallResult {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  std::vector<int> tokens;
  bool retry_pushback = false;  // RESOURCE_EXHAUSTED carried grpc-retry-pushback-ms
  int terminal_events = 0;      // must be exactly 1
  double seconds = 0;           // start to status
};

// Runs `n` Generate calls with at most `concurrency` in flight at once (n for all at once),
// on one completion queue. `make(i)` builds request i; `cancel_after_tokens(i)` >= 0 cancels
// call i once it has that many tokens; `deadline_ms(i)` > 0 sets a deadline.
inline std::vector<CallResult> RunAsync(
    v1::Generation::Stub* stub, int n, int concurrency,
    const std::function<v1::GenerateRequest(int)>& make,
    const std::function<int(int)>& deadline_ms = nullptr,
    const std::function<int(int)>& cancel_after_tokens = nullptr) {
  struct Call {
    int index = 0;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader;
    v1::GenerateResponse resp;
    grpc::Status status;
    std::chrono::steady_clock::time_point t0;
    bool finishing = false;
    bool cancelled = false;
  };
  std::vector<CallResult> results(n);
  std::vector<std::unique_ptr<Call>> calls(n);
  grpc::CompletionQueue cq;
  int next = 0, in_flight = 0, done = 0;
  auto start = [&] {
    const int i = next++;
    auto c = std::make_unique<Call>();
    c->index = i;
    c->t0 = std::chrono::steady_clock::now();
    const int d = deadline_ms ? deadline_ms(i) : 0;
    c->ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(d > 0 ? d : 120000));
    c->reader = stub->PrepareAsyncGenerate(&c->ctx, make(i), &cq);
    c->reader->StartCall(c.get());
    calls[i] = std::move(c);
    ++in_flight;
  };
  const int cap = concurrency > 0 ? concurrency : n;
  while (next < n && in_flight < cap) start();
  void* tag;
  bool ok;
  while (done < n && cq.Next(&tag, &ok)) {
    Call* c = static_cast<Call*>(tag);
    CallResult& r = results[c->index];
    if (c->finishing) {
      r.code = c->status.error_code();
      r.message = c->status.error_message();
      ++r.terminal_events;
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c->t0).count();
      for (const auto& [k, v] : c->ctx.GetServerTrailingMetadata()) {
        if (k == "grpc-retry-pushback-ms") r.retry_pushback = true;
      }
      calls[c->index].reset();
      ++done;
      --in_flight;
      while (next < n && in_flight < cap) start();
      continue;
    }
    if (!ok) {  // the stream ended (or failed to start): collect the status
      c->finishing = true;
      c->reader->Finish(&c->status, c);
      continue;
    }
    // StartCall done or a message read: take its tokens, read the next one.
    r.tokens.insert(r.tokens.end(), c->resp.token_ids().begin(), c->resp.token_ids().end());
    c->resp.Clear();
    const int cancel_at = cancel_after_tokens ? cancel_after_tokens(c->index) : -1;
    if (cancel_at >= 0 && !c->cancelled && static_cast<int>(r.tokens.size()) >= cancel_at) {
      c->cancelled = true;
      c->ctx.TryCancel();
    }
    c->reader->Read(&c->resp, c);
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return results;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_RELIABILITY_FAULT_CLUSTER_H_
