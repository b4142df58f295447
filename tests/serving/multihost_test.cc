// A cluster spread over separate network hosts on one machine: two router replicas,
// two prefill and two decode workers, each in its own network namespace with its own IP
// (10.77.0.x) on a bridge that lives in a namespace of its own, and the test's client in
// another. Workers find the routers by a name (`tandem-router`, resolving to both router IPs
// through the namespace's /etc/netns/NS/hosts, as a headless Service resolves in Kubernetes)
// and advertise their own IP. Checks: every worker registers with both routers; greedy outputs
// through either router are those of a single-host cluster; a decode host whose link is taken
// down mid-run is detected (unhealthy, then forgotten by both routers) and the requests it held
// are resumed on the other decode host with the same tokens.
//
// Needs root and `ip` (iproute2); otherwise every test skips, saying why. Namespaces, the
// bridge and /etc/netns entries are removed when the test ends, failed or not.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/metrics/metrics_text.h"
#include "tests/serving/cluster.h"
#include "tools/server_process.h"

namespace tandem::testing {
namespace {

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs a shell command; returns its exit status and appends its output to `out`.
int Sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  std::string text;
  while (std::fgets(buf, sizeof(buf), p) != nullptr) text += buf;
  const int status = ::pclose(p);
  if (out != nullptr) *out += text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct Host {
  std::string name;  // role name in the test: r1, p1, d1, ...
  std::string ns;    // network namespace
  std::string ip;    // 10.77.0.x
  std::string peer;  // the veth end in the bridge namespace
  ServerProcess proc;
};

// The namespaces, bridge and processes of one test; everything is torn down by the destructor.
class Hosts {
 public:
  Hosts() : ip_(IpBinary()), prefix_(absl::StrCat("td", ::getpid(), "-")) {}
  ~Hosts() { TearDown(); }

  // Empty on success, else why namespaces cannot be used here.
  std::string SetUpBridge() {
    if (::geteuid() != 0) return "needs root to create network namespaces (ip netns)";
    if (ip_.empty()) return "needs iproute2's `ip` to create network namespaces";
    RemoveStale();
    bridge_ns_ = prefix_ + "br";
    std::string out;
    if (Sh(absl::StrCat(ip_, " netns add ", bridge_ns_), &out) != 0) {
      bridge_ns_.clear();
      return "cannot create a network namespace: " + out;
    }
    if (Sh(absl::StrCat(ip_, " -n ", bridge_ns_, " link add br0 type bridge && ", ip_, " -n ",
                        bridge_ns_, " link set br0 up"),
           &out) != 0) {
      return "cannot create a bridge: " + out;
    }
    return "";
  }

  // A host: namespace `prefix-name`, eth0 = 10.77.0.`octet`/24 on the bridge, lo up, and an
  // /etc/netns hosts file where `tandem-router` resolves to every router IP.
  ::testing::AssertionResult AddHost(const std::string& name, int octet,
                                     const std::vector<std::string>& router_ips) {
    Host h{name, prefix_ + name, absl::StrCat("10.77.0.", octet), absl::StrCat("v", octet), {}};
    std::string out;
    std::string hosts = "127.0.0.1 localhost\n";
    for (const auto& r : router_ips) absl::StrAppend(&hosts, r, " tandem-router\n");
    namespaces_.push_back(h.ns);
    std::filesystem::create_directories("/etc/netns/" + h.ns);
    std::ofstream("/etc/netns/" + h.ns + "/hosts") << hosts;
    const std::string cmd = absl::StrCat(
        ip_, " netns add ", h.ns, " && ", ip_, " -n ", bridge_ns_, " link add ", h.peer,
        " type veth peer name eth0 netns ", h.ns, " && ", ip_, " -n ", bridge_ns_, " link set ",
        h.peer, " master br0 && ", ip_, " -n ", bridge_ns_, " link set ", h.peer, " up && ", ip_,
        " -n ", h.ns, " addr add ", h.ip, "/24 dev eth0 && ", ip_, " -n ", h.ns,
        " link set eth0 up && ", ip_, " -n ", h.ns, " link set lo up");
    if (Sh(cmd, &out) != 0) return ::testing::AssertionFailure() << cmd << ": " << out;
    hosts_[name] = h;
    return ::testing::AssertionSuccess();
  }

  // Starts tandem-server inside host `name`'s namespace (ip netns exec replaces itself with
  // the server, so the pid is the server's).
  ServerProcess Start(const std::string& name, std::vector<std::string> args) {
    Host& h = hosts_.at(name);
    std::vector<std::string> argv = {"netns", "exec", h.ns, BinDir() + "/tandem-server"};
    argv.insert(argv.end(), args.begin(), args.end());
    h.proc = StartServerProcess(ip_, argv);
    if (h.proc.pid > 0) pids_.push_back(h.proc.pid);
    return h.proc;
  }

  // Cuts host `name` off the network: its veth end on the bridge goes down.
  bool Disconnect(const std::string& name) {
    return Sh(absl::StrCat(ip_, " -n ", bridge_ns_, " link set ", hosts_.at(name).peer, " down")) ==
           0;
  }

  // Moves the calling process (single-threaded yet: before any gRPC use) into host `name`'s
  // namespace, so that its gRPC client reaches the others as a separate host does.
  bool Enter(const std::string& name) {
    const int fd = ::open(("/var/run/netns/" + hosts_.at(name).ns).c_str(), O_RDONLY);
    if (fd < 0) return false;
    const bool ok = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return ok;
  }

  const Host& host(const std::string& name) const { return hosts_.at(name); }

 private:
  void TearDown() {
    StopProcesses(pids_);
    for (const auto& ns : namespaces_) {
      Sh(absl::StrCat(ip_, " netns del ", ns));
      std::error_code ec;
      std::filesystem::remove_all("/etc/netns/" + ns, ec);
    }
    // Deleting the bridge namespace deletes the bridge and the veth ends in it.
    if (!bridge_ns_.empty()) Sh(absl::StrCat(ip_, " netns del ", bridge_ns_));
  }

  // Namespaces left by a test process that died without its destructor (killed at a
  // timeout): td<PID>-* whose PID is gone, with the servers still running in them.
  void RemoveStale() {
    std::string list;
    Sh(ip_ + " netns list", &list);
    std::istringstream lines(list);
    std::string line;
    while (std::getline(lines, line)) {
      const std::string ns = line.substr(0, line.find(' '));
      int pid = 0;
      if (std::sscanf(ns.c_str(), "td%d-", &pid) != 1 || pid == ::getpid()) continue;
      if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its test is still running
      std::string pids;
      Sh(absl::StrCat(ip_, " netns pids ", ns), &pids);
      std::istringstream ps(pids);
      for (int p; ps >> p;) ::kill(p, SIGKILL);
      Sh(absl::StrCat(ip_, " netns del ", ns));
      std::error_code ec;
      std::filesystem::remove_all("/etc/netns/" + ns, ec);
    }
  }

  const std::string ip_;
  const std::string prefix_;
  std::string bridge_ns_;
  std::vector<std::string> namespaces_;
  std::map<std::string, Host> hosts_;
  std::vector<pid_t> pids_;
};

constexpr int kRouterPort = 7000;          // the same on both router hosts: one name, one port
constexpr int kRouterInternalPort = 7001;  // the registry workers register with

v1::GenerateRequest Greedy(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest req;
  req.set_text(prompt);
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  return req;
}

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time",       "The cat sat",         "Lily and Tom went to the park",
      "One day, a little bird", "The sun was shining", "Ben had a red ball"};
  return prompts;
}

// The multi-host cluster: routers r1 (10.77.0.1) and r2 (.2), prefill p1 (.11) p2 (.12),
// decode d1 (.21) d2 (.22), the test's client c (.100).
class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "multi-host test skipped: needs root to create network namespaces (ip netns)";
    }
    if (IpBinary().empty()) {
      GTEST_SKIP() << "multi-host test skipped: needs iproute2's `ip` to create network namespaces";
    }
    // This process moves into the client namespace and its gRPC threads stay there: one test
    // per process (as ctest runs them).
    static bool used = false;
    if (used) GTEST_SKIP() << "run one multi-host test per process (--gtest_filter); ctest does";
    used = true;
    const std::string why = hosts_.SetUpBridge();
    if (!why.empty()) GTEST_SKIP() << "multi-host test skipped: " << why;
    const std::vector<std::string> routers = {"10.77.0.1", "10.77.0.2"};
    const std::vector<std::pair<std::string, int>> layout = {
        {"r1", 1}, {"r2", 2}, {"p1", 11}, {"p2", 12}, {"d1", 21}, {"d2", 22}, {"c", 100}};
    for (const auto& [name, octet] : layout) ASSERT_TRUE(hosts_.AddHost(name, octet, routers));
    // The client side of this process, and the single-host baseline below, live in c.
    ASSERT_TRUE(hosts_.Enter("c")) << "setns into the client namespace failed";

    const std::vector<std::string> model = {
        "--model", Stories260K(),           "--tokenizer",
        Tok512(),  "--cluster-secret-file", TestClusterSecretFile()};
    for (const std::string r : {"r1", "r2"}) {
      std::vector<std::string> args = {"--role=router",
                                       "--host",
                                       hosts_.host(r).ip,
                                       "--port",
                                       std::to_string(kRouterPort),
                                       "--internal-port",
                                       std::to_string(kRouterInternalPort),
                                       "--heartbeat-ms",
                                       "100",
                                       "--forget-after-ms",
                                       "2000",
                                       "--prefill-timeout-ms",
                                       "5000"};
      args.insert(args.end(), model.begin(), model.end());
      const ServerProcess p = hosts_.Start(r, args);
      ASSERT_EQ(p.address, absl::StrCat(hosts_.host(r).ip, ":", kRouterPort));
      routers_.push_back(p);
    }
    for (const std::string w : {"p1", "p2", "d1", "d2"}) {
      std::vector<std::string> args = {w[0] == 'p' ? "--role=prefill" : "--role=decode",
                                       "--host",
                                       hosts_.host(w).ip,
                                       "--router",
                                       absl::StrCat("tandem-router:", kRouterInternalPort),
                                       "--worker-id",
                                       w};
      args.insert(args.end(), model.begin(), model.end());
      const ServerProcess p = hosts_.Start(w, args);
      ASSERT_FALSE(p.address.empty()) << w << " did not start";
      EXPECT_EQ(p.address.substr(0, p.address.rfind(':')), hosts_.host(w).ip);
    }
    for (const ServerProcess& r : routers_) {
      auto channel = grpc::CreateChannel(r.address, grpc::InsecureChannelCredentials());
      generation_.push_back(v1::Generation::NewStub(channel));
      registry_.push_back(v1::Registry::NewStub(
          grpc::CreateChannel(r.internal, grpc::InsecureChannelCredentials())));
    }
  }

  // Worker id -> healthy, as router `i` sees them.
  std::map<std::string, bool> Workers(int i) {
    const v1::ListWorkersResponse resp = ListWorkers(routers_[i].internal, registry_[i].get());
    std::map<std::string, bool> out;
    for (const auto& w : resp.workers()) out[w.worker_id()] = w.healthy();
    return out;
  }

  template <typename F>
  bool WaitFor(F cond, int timeout_ms) {
    for (int waited = 0; waited < timeout_ms; waited += 50) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return cond();
  }

  bool AllHealthyOnBothRouters() {
    const std::map<std::string, bool> all = {
        {"d1", true}, {"d2", true}, {"p1", true}, {"p2", true}};
    return Workers(0) == all && Workers(1) == all;
  }

  // Greedy tokens of every prompt on a single-host cluster (1 prefill + 1 decode on 127.0.0.1
  // of the client namespace).
  std::vector<std::vector<int>> Baseline(int max_tokens) {
    Cluster single(1, 1);
    EXPECT_TRUE(single.ready());
    std::vector<std::vector<int>> out;
    for (const auto& prompt : Prompts()) {
      Streamed s = Generate(single.generation(), Greedy(prompt, max_tokens));
      EXPECT_TRUE(s.status.ok()) << s.status.error_message();
      EXPECT_EQ(static_cast<int>(s.tokens.size()), max_tokens);
      out.push_back(s.tokens);
    }
    return out;
  }

  Hosts hosts_;
  std::vector<ServerProcess> routers_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> generation_;
  std::vector<std::unique_ptr<v1::Registry::Stub>> registry_;
};

TEST_F(MultiHostTest, WorkersFindBothRoutersByNameAndOutputsMatchOneHost) {
  // Every worker registered with both routers, under the address of its own host.
  ASSERT_TRUE(WaitFor([&] { return AllHealthyOnBothRouters(); }, 20000))
      << "r1 sees " << Workers(0).size() << " workers, r2 " << Workers(1).size();
  {
    grpc::Status s;
    const v1::ListWorkersResponse resp = ListWorkers(routers_[0].internal, registry_[0].get(), &s);
    ASSERT_TRUE(s.ok()) << s.error_message();
    for (const auto& w : resp.workers()) {
      const std::string host = w.address().substr(0, w.address().rfind(':'));
      EXPECT_EQ(host, hosts_.host(w.worker_id()).ip) << w.worker_id();
    }
  }
  const int kMaxTokens = 48;
  const std::vector<std::vector<int>> expected = Baseline(kMaxTokens);
  // Every prompt through each router, concurrently.
  std::vector<Streamed> got(2 * Prompts().size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      got[i] = Generate(generation_[i % 2].get(), Greedy(Prompts()[i / 2], kMaxTokens));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, expected[i / 2])
        << "prompt \"" << Prompts()[i / 2] << "\" via r" << i % 2 + 1;
  }
  // Both prefill and both decode hosts served requests: the routers really spread the work.
  std::map<std::string, double> routed;
  for (const ServerProcess& r : routers_) {
    const auto samples = Scrape(r.metrics);
    for (const std::string w : {"p1", "p2", "d1", "d2"}) {
      const double v = MetricValue(samples, "tandem_routing_decisions_total", {{"worker", w}});
      if (v > 0) routed[w] += v;
    }
  }
  EXPECT_EQ(routed.size(), 4u) << "workers that received requests: " << routed.size();
}

TEST_F(MultiHostTest, DecodeHostCutOffMidRunIsForgottenAndItsRequestsResumed) {
  ASSERT_TRUE(WaitFor([&] { return AllHealthyOnBothRouters(); }, 20000));
  // Long generations (most of stories260K's 512-token context), so that d1 holds some when it
  // is cut off.
  const int kMaxTokens = 400;
  const std::vector<std::vector<int>> expected = Baseline(kMaxTokens);

  // 24 requests (each prompt four times, half through each router), so that both decode hosts
  // run several at once.
  const size_t kCopies = 4;
  std::vector<Streamed> got(kCopies * Prompts().size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      got[i] =
          Generate(generation_[i % 2].get(), Greedy(Prompts()[i / kCopies], kMaxTokens), 120000);
    });
  }
  // Freeze d1 the moment its own /metrics shows it decoding (the first poll that does, so most
  // of its 400 steps are still ahead): its requests cannot finish before its link goes down.
  // Then take the link down and let the process run on, cut off.
  const Host& d1 = hosts_.host("d1");
  double running_at_cut = 0;
  const bool held = WaitFor(
      [&] {
        running_at_cut = MetricValue(Scrape(d1.proc.metrics), "tandem_num_requests_running");
        if (running_at_cut <= 0) return false;
        ::kill(d1.proc.pid, SIGSTOP);
        return true;
      },
      30000);
  ASSERT_TRUE(hosts_.Disconnect("d1"));
  ::kill(d1.proc.pid, SIGCONT);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(held) << "d1 never reported a running request; nothing to resume";
  std::fprintf(stderr, "d1 was running %g requests when cut off\n", running_at_cut);

  // Detected by both routers: d1 stopped heartbeating, so it is forgotten (after 2 s), while
  // the other workers stay healthy.
  const std::map<std::string, bool> rest = {{"d2", true}, {"p1", true}, {"p2", true}};
  EXPECT_TRUE(WaitFor([&] { return Workers(0) == rest && Workers(1) == rest; }, 10000))
      << "r1 sees " << Workers(0).size() << " workers, r2 " << Workers(1).size();

  // Every request completed, with the single-host tokens: those on d1 were resumed on d2.
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, expected[i / kCopies])
        << "prompt \"" << Prompts()[i / kCopies] << "\" via r" << i % 2 + 1;
  }
  double resumes = 0;
  for (const ServerProcess& r : routers_) {
    resumes += std::max(0.0, MetricValue(Scrape(r.metrics), "tandem_resumes_total"));
  }
  EXPECT_GE(resumes, running_at_cut) << "d1 held running requests; each must have been resumed";
  // New requests are served by what is left.
  Streamed after = Generate(generation_[1].get(), Greedy(Prompts()[0], 32));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, std::vector<int>(expected[0].begin(), expected[0].begin() + 32));
}

}  // namespace
}  // namespace tandem::testing
