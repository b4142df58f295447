#include "tools/remote.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/str_format.h"
#include "rpc/grpc_util.h"
#include "rpc/internal_auth.h"
#include "rpc/tls.h"
#include "security/cluster_secret.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tools/server_process.h"

namespace tandem {

absl::StatusOr<RemoteGenerateResult> RemoteGenerate(
    const RemoteGenerateRequest& req, const std::function<void(std::string_view)>& on_text) {
  auto credentials = ClientChannelCredentials(req.security.tls);
  if (!credentials.ok()) return credentials.status();
  auto channel = grpc::CreateChannel(req.router, *credentials);
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateRequest g;
  g.set_text(req.prompt);
  *g.mutable_sampling() = ToProto(req.sampling);
  g.set_max_tokens(req.max_tokens);
  for (const auto& s : req.stop) g.add_stop(s);
  g.set_ignore_eos(req.ignore_eos);
  g.set_disable_speculation(!req.speculative);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(req.timeout_seconds * 1000)));
  AddApiKey(req.security.api_key, &ctx);
  auto reader = stub->Generate(&ctx, g);
  RemoteGenerateResult result;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    result.tokens.insert(result.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    if (!resp.text().empty() && on_text) on_text(resp.text());
    if (resp.timings().ttft_seconds() > 0 && result.ttft_seconds == 0) {
      result.ttft_seconds = resp.timings().ttft_seconds();
    }
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      switch (resp.finish_reason()) {
        case v1::FINISH_REASON_STOP:
          result.finish_reason = "stop";
          break;
        case v1::FINISH_REASON_LENGTH:
          result.finish_reason = "length";
          break;
        case v1::FINISH_REASON_CONTEXT:
          result.finish_reason = "context";
          break;
        default:
          break;
      }
      result.e2e_seconds = resp.timings().e2e_seconds();
    }
  }
  if (absl::Status s = FromGrpc(reader->Finish()); !s.ok()) return s;
  return result;
}

absl::StatusOr<std::unique_ptr<LocalClusterSecret>> LocalClusterSecret::Make(
    const std::string& file) {
  std::unique_ptr<LocalClusterSecret> out(new LocalClusterSecret());
  out->file_ = file;
  if (file.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-secret-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {  // mode 0700
      return absl::InternalError(
          absl::StrFormat("cannot make a folder for the cluster secret: %s", std::strerror(errno)));
    }
    out->dir_ = tmpl;
    out->file_ = tmpl + "/cluster.secret";
    if (absl::Status s = ClusterSecret::GenerateFile(out->file_).status(); !s.ok()) return s;
  }
  auto secret = ClusterSecret::Load(out->file_);
  if (!secret.ok()) return secret.status();
  out->auth_ = std::make_unique<InternalAuth>(*secret, /*require_role_certificates=*/false);
  return out;
}

LocalClusterSecret::~LocalClusterSecret() {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool WaitForWorkers(const std::string& router_internal, int n, const InternalAuth& auth,
                    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  auto stub = v1::Registry::NewStub(grpc::CreateChannel(router_internal, credentials));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    const v1::ListWorkersRequest req;
    v1::ListWorkersResponse resp;
    int healthy = 0;
    if (auth.Call(router_internal, internal_method::kListWorkers, PeerRole::kRouter, req, nullptr,
                  [&](grpc::ClientContext* ctx) { return stub->ListWorkers(ctx, req, &resp); })
            .ok()) {
      for (const auto& w : resp.workers()) healthy += w.healthy();
    }
    if (healthy >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

namespace {

// How a reaped child ended, for the operator.
std::string HowItEnded(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrFormat("was killed by signal %d (%s)", WTERMSIG(status),
                           strsignal(WTERMSIG(status)));
  }
  return absl::StrFormat("exited with status %d", WEXITSTATUS(status));
}

// A worker of the local cluster: how to start it again.
struct Member {
  std::string role;  // "prefill" or "decode"
  int index = 0;
  std::vector<std::string> args;
  pid_t pid = -1;
  std::vector<std::chrono::steady_clock::time_point> restarts;  // within the last minute
};

constexpr int kMaxRestartsPerMinute = 5;

// After the cluster is ready: waits for Ctrl-C or SIGTERM (0), or the router's exit (1). A
// worker that exits or is killed is started again with the same flags (it registers anew, and
// requests in flight on it resume elsewhere), after a delay growing with its restarts in the
// last minute, at most kMaxRestartsPerMinute times a minute; past that it stays down and the
// rest go on. Without `restart`, a worker's exit stops the cluster (1). A stopped worker (SIGSTOP,
// a debugger) is no exit: its SIGCHLD reaps nothing.
int Supervise(const sigset_t& signals, const std::string& bin, pid_t router, bool restart,
              std::vector<Member>& members, std::vector<pid_t>& children) {
  auto forget = [&](pid_t p) { std::erase(children, p); };
  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != SIGCHLD) return 0;
    int status = 0;
    for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      forget(p);
      if (p == router) {
        std::fprintf(stderr, "tandem up: the router (pid %d) %s; stopping the cluster\n", p,
                     HowItEnded(status).c_str());
        return 1;
      }
      auto m =
          std::find_if(members.begin(), members.end(), [p](const Member& w) { return w.pid == p; });
      if (m == members.end()) continue;
      m->pid = -1;
      if (!restart) {
        std::fprintf(stderr, "tandem up: %s worker %d (pid %d) %s; stopping the cluster\n",
                     m->role.c_str(), m->index, p, HowItEnded(status).c_str());
        return 1;
      }
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(m->restarts, [&](auto t) { return now - t > std::chrono::minutes(1); });
      if (static_cast<int>(m->restarts.size()) >= kMaxRestartsPerMinute) {
        std::fprintf(stderr,
                     "tandem up: %s worker %d (pid %d) %s, its %dth exit within a minute; it "
                     "stays down and the cluster goes on without it\n",
                     m->role.c_str(), m->index, p, HowItEnded(status).c_str(),
                     kMaxRestartsPerMinute + 1);
        continue;
      }
      // Back-off: at once the first time in a minute, then 1, 2, 4, 8 s.
      const int delay_s = m->restarts.empty() ? 0 : 1 << (m->restarts.size() - 1);
      std::fprintf(stderr, "tandem up: %s worker %d (pid %d) %s; starting it again in %d s\n",
                   m->role.c_str(), m->index, p, HowItEnded(status).c_str(), delay_s);
      std::this_thread::sleep_for(std::chrono::seconds(delay_s));
      m->restarts.push_back(std::chrono::steady_clock::now());
      ServerProcess w = StartServerProcess(bin, m->args);
      if (w.pid > 0) {
        children.push_back(w.pid);
        m->pid = w.pid;
      }
      if (w.address.empty()) {
        std::fprintf(stderr, "tandem up: %s worker %d did not start again\n", m->role.c_str(),
                     m->index);
      } else {
        std::printf("metrics %s=%s\n", m->role.c_str(), w.metrics.c_str());
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int RunLocalCluster(const ClusterOptions& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string bin = o.server_binary.empty() ? DefaultServerBinary() : o.server_binary;
  std::vector<pid_t> children;
  auto stop_all = [&](int code) {
    for (pid_t p : children) ::kill(p, SIGTERM);
    for (pid_t p : children) ::waitpid(p, nullptr, 0);
    return code;
  };
  std::vector<std::string> common = {"--model", o.model};
  if (!o.tokenizer.empty()) common.insert(common.end(), {"--tokenizer", o.tokenizer});
  auto secret = LocalClusterSecret::Make(o.cluster_secret_file);
  if (!secret.ok()) {
    std::fprintf(stderr, "tandem up: %s\n", std::string(secret.status().message()).c_str());
    return stop_all(2);
  }
  const std::string& secret_file = (*secret)->file();
  common.insert(common.end(), {"--cluster-secret-file", secret_file});
  // The probe of the workers is a peer like the workers: the same certificate, if any.
  auto tls = LoadServerTls(o.tls);
  if (!tls.ok()) {
    std::fprintf(stderr, "tandem up: %s\n", std::string(tls.status().message()).c_str());
    return stop_all(2);
  }
  for (const auto& [flag, path] :
       {std::pair{"--tls-cert", o.tls.cert}, std::pair{"--tls-key", o.tls.key},
        std::pair{"--tls-ca", o.tls.ca}}) {
    if (!path.empty()) common.insert(common.end(), {flag, path});
  }

  std::vector<std::string> router_args = {"--role=router", "--port", std::to_string(o.router_port),
                                          "--http-port", std::to_string(o.http_port)};
  router_args.insert(router_args.end(), common.begin(), common.end());
  if (!o.api_keys_file.empty())
    router_args.insert(router_args.end(), {"--api-keys-file", o.api_keys_file});
  router_args.insert(router_args.end(), o.extra_router_flags.begin(), o.extra_router_flags.end());
  ServerProcess r = StartServerProcess(bin, router_args);
  if (r.pid > 0) children.push_back(r.pid);
  if (r.address.empty()) {
    std::fprintf(stderr, "tandem up: the router did not start\n");
    return stop_all(1);
  }
  const std::string router = r.address;
  const std::string router_internal = r.internal;
  // "ROLE=HOST:PORT" of each process's /metrics, printed once the cluster is ready.
  std::vector<std::string> metrics = {"router=" + r.metrics};
  std::vector<Member> members;
  for (int i = 0; i < o.prefill + o.decode; ++i) {
    std::vector<std::string> args = {i < o.prefill ? "--role=prefill" : "--role=decode", "--router",
                                     router_internal};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), o.extra_worker_flags.begin(), o.extra_worker_flags.end());
    if (i < o.prefill && o.prefill_idle) {
      args.push_back("--cpu-idle");
    } else if (i < o.prefill && o.prefill_nice != 0) {
      args.insert(args.end(), {"--cpu-nice", std::to_string(o.prefill_nice)});
    }
    ServerProcess w = StartServerProcess(bin, args);
    if (w.pid > 0) children.push_back(w.pid);
    if (w.address.empty()) {
      std::fprintf(stderr, "tandem up: a worker did not start\n");
      return stop_all(1);
    }
    metrics.push_back((i < o.prefill ? "prefill=" : "decode=") + w.metrics);
    members.push_back({i < o.prefill ? "prefill" : "decode",
                       i < o.prefill ? i : i - o.prefill,
                       std::move(args),
                       w.pid,
                       {}});
  }
  // Ready when every worker is registered and healthy. The probe's channel is closed before
  // waiting: an open client channel holds up the router's graceful shutdown.
  if (!WaitForWorkers(router_internal, o.prefill + o.decode, (*secret)->auth(),
                      MakePeerChannelCredentials(*tls))) {
    std::fprintf(stderr, "tandem up: workers did not register within 60 s\n");
    return stop_all(1);
  }
  std::printf("ready router=%s\n", router.c_str());
  std::printf("internal router=%s secret=%s\n", router_internal.c_str(), secret_file.c_str());
  for (const std::string& m : metrics) std::printf("metrics %s\n", m.c_str());
  std::printf("http router=%s\n", r.http.c_str());
  std::fflush(stdout);
  return stop_all(Supervise(signals, bin, r.pid, o.restart_workers, members, children));
}

}  // namespace tandem
