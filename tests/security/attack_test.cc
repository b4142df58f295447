// The attacks of docs/reliability.md rows 24-31, by a hostile client written for the test, against
// real processes on loopback: reaching the internal surfaces without the cluster's credentials
// (or with the wrong ones, or replayed), taking over a worker id, inflating load claims,
// steering a prefill's KV to an address of the attacker's choosing through a decode worker
// that lies about its endpoint, forging and oversizing KV chunks, flooding the KV and HTTP
// ports with idle and slow connections, and hostile JSON. Every test checks that legitimate
// requests are served exactly meanwhile, and ends with the leak check.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/transport_common.h"
#include "kv_transfer/wire.h"
#include "rpc/grpc_util.h"
#include "security/secure_socket.h"
#include "tests/cluster_auth.h"
#include "tests/http/http_client.h"
#include "tests/serving/cluster.h"

namespace tandem {
namespace {

using testing::Cluster;
using testing::Streamed;

v1::GenerateRequest Greedy(const std::string& text, int max_tokens = 24) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> p = {"Once upon a time", "The little dog", "Tom and Sue",
                                             "One day, a bird"};
  return p;
}

// The greedy tokens of every prompt on a quiet cluster: what every run under attack must give.
const std::vector<std::vector<int>>& Reference() {
  static const std::vector<std::vector<int>> ref = [] {
    Cluster c(1, 1);
    std::vector<std::vector<int>> out;
    for (const std::string& p : Prompts()) {
      Streamed s = testing::Generate(c.generation(), Greedy(p));
      out.push_back(s.status.ok() ? s.tokens : std::vector<int>{});
    }
    return out;
  }();
  return ref;
}

// Runs every prompt `rounds` times concurrently; returns how many outputs differ from the
// reference (or failed).
int WrongOutputs(Cluster& c, int rounds) {
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < Prompts().size(); ++i) {
      threads.emplace_back([&, i] {
        Streamed s = testing::Generate(c.generation(), Greedy(Prompts()[i]));
        if (!s.status.ok() || s.tokens != Reference()[i]) ++wrong;
      });
    }
  }
  for (auto& t : threads) t.join();
  return wrong.load();
}

std::shared_ptr<grpc::Channel> Plain(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

grpc::ClientContext* Deadline(grpc::ClientContext* ctx, int ms = 5000) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return ctx;
}

// A wrong secret: proofs made with it must be refused like none.
std::shared_ptr<InternalAuth> WrongSecret() {
  static auto auth = std::make_shared<InternalAuth>(ClusterSecret::Generate(), false);
  return auth;
}

int64_t ProcStatus(pid_t pid, const char* field) {
  std::ifstream in(absl::StrFormat("/proc/%d/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field)));
  }
  return -1;
}
int64_t RssKb(pid_t pid) { return ProcStatus(pid, "VmRSS:"); }

// Polls until `pred` holds (true) or `timeout_ms` passes (false).
bool WaitFor(const std::function<bool()>& pred, int timeout_ms = 10000) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}
int64_t Threads(pid_t pid) { return ProcStatus(pid, "Threads:"); }

// A TCP connection to HOST:PORT from `source` (127.0.0.x); -1 on failure.
int Connect(const std::string& host_port, const char* source = "127.0.0.1") {
  const size_t colon = host_port.rfind(':');
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &to.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A KV connection to a decode worker's receiver that proved `secret` (a member of the cluster
// gone rogue, or one that learned the secret): what it may still not do is the point.
std::unique_ptr<SecureSocket> KvConnection(const std::string& endpoint,
                                           const ClusterSecret& secret) {
  const int fd = Connect(endpoint.substr(std::string("tcp://").size()));
  if (fd < 0) return nullptr;
  auto sock = std::make_unique<SecureSocket>(fd, nullptr, /*server=*/false);
  KvAuth auth;
  auth.secret = secret;
  std::atomic<bool> stop{false};
  if (!AuthenticateKvConnection(*sock, auth, /*receiver=*/false, stop,
                                absl::Now() + absl::Seconds(5))
           .ok()) {
    return nullptr;
  }
  return sock;
}

std::string DecodeKvEndpoint(Cluster& c) {
  const v1::ListWorkersResponse listed1 = c.Workers();
  for (const auto& w : listed1.workers()) {
    if (w.role() == v1::WORKER_ROLE_DECODE) return w.kv_endpoint();
  }
  return "";
}

// ---- Rows 24, 25, 26: the registry and the worker services -----------------------------

TEST(AttackTest, Row24_OutsidersCannotReachTheInternalSurfaces) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const size_t workers_before = c.Workers().workers_size();
  v1::RegisterRequest fake;
  fake.set_worker_id("evil-decode");
  fake.set_role(v1::WORKER_ROLE_DECODE);
  fake.set_address("127.0.0.1:9");
  fake.mutable_load()->set_free_kv_blocks(1 << 30);
  fake.mutable_load()->set_total_kv_blocks(1 << 30);
  fake.mutable_load()->set_block_size(16);
  v1::RegisterResponse rr;

  // The public port serves no registry at all.
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(
        v1::Registry::NewStub(Plain(c.router()))->Register(Deadline(&ctx), fake, &rr).error_code(),
        grpc::StatusCode::UNIMPLEMENTED);
  }
  // The internal port: no proof, a wrong secret, a replayed proof, a proof for another method.
  auto registry = v1::Registry::NewStub(Plain(c.router_internal()));
  {
    grpc::ClientContext ctx;
    const grpc::Status s = registry->Register(Deadline(&ctx), fake, &rr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    WrongSecret()->Attach(&ctx, internal_method::kRegister, PeerRole::kDecode);
    EXPECT_EQ(registry->Register(Deadline(&ctx), fake, &rr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // A proof seen on the wire, used again: it worked once.
    const std::string proof =
        testing::TestInternalAuth()->Proof(internal_method::kListWorkers, PeerRole::kRouter);
    v1::ListWorkersResponse lw;
    grpc::ClientContext first, again;
    first.AddMetadata(kClusterAuthMetadata, proof);
    again.AddMetadata(kClusterAuthMetadata, proof);
    ASSERT_TRUE(registry->ListWorkers(Deadline(&first), {}, &lw).ok());
    const grpc::Status replayed = registry->ListWorkers(Deadline(&again), {}, &lw);
    EXPECT_EQ(replayed.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(absl::StrContains(replayed.error_message(), "replayed"))
        << replayed.error_message();
  }
  {
    // A proof made for ListWorkers does not register.
    grpc::ClientContext ctx;
    testing::ProveCluster(&ctx, internal_method::kListWorkers, PeerRole::kDecode);
    EXPECT_EQ(registry->Register(Deadline(&ctx), fake, &rr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(static_cast<size_t>(c.Workers().workers_size()), workers_before);
  const v1::ListWorkersResponse listed2 = c.Workers();
  for (const auto& w : listed2.workers()) EXPECT_NE(w.worker_id(), "evil-decode");

  // The workers' own services: a stranger can neither open a decode lease nor make a prefill
  // worker connect anywhere.
  int trap_port = 0;
  const int trap = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd, 16);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    trap_port = ntohs(a.sin_port);
    return fd;
  }();
  const v1::ListWorkersResponse listed3 = c.Workers();
  for (const auto& w : listed3.workers()) {
    if (w.role() == v1::WORKER_ROLE_PREFILL) {
      auto prefill = v1::PrefillWorker::NewStub(Plain(w.address()));
      v1::PrefillRequest req;
      req.set_request_id("ssrf");
      req.add_prompt_ids(1);
      req.add_prompt_ids(2);
      req.mutable_kv_target()->set_endpoint(absl::StrCat("tcp://127.0.0.1:", trap_port));
      req.mutable_kv_target()->set_lease_id(1);
      v1::PrefillResponse resp;
      grpc::ClientContext ctx;
      EXPECT_EQ(prefill->Prefill(Deadline(&ctx), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      grpc::ClientContext wrong;
      WrongSecret()->Attach(&wrong, internal_method::kPrefill, PeerRole::kRouter);
      EXPECT_EQ(prefill->Prefill(Deadline(&wrong), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      // A cluster member that is not a router (a decode worker's proof) may not either.
      grpc::ClientContext decode_role;
      testing::ProveCluster(&decode_role, internal_method::kPrefill, PeerRole::kDecode);
      EXPECT_EQ(prefill->Prefill(Deadline(&decode_role), req, &resp).error_code(),
                grpc::StatusCode::PERMISSION_DENIED);
      v1::PrefillScoreRequest score;
      score.add_token_ids(1);
      score.add_token_ids(2);
      v1::PrefillScoreResponse sr;
      grpc::ClientContext sctx;
      EXPECT_EQ(prefill->Score(Deadline(&sctx), score, &sr).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    } else {
      auto decode = v1::DecodeWorker::NewStub(Plain(w.address()));
      // A flood of Decode streams: each is refused before anything is admitted.
      for (int i = 0; i < 20; ++i) {
        grpc::ClientContext ctx;
        auto stream = decode->Decode(Deadline(&ctx));
        v1::DecodeClientMessage m;
        m.mutable_admit()->add_prompt_ids(1);
        m.mutable_admit()->set_max_tokens(8);
        stream->Write(m);
        v1::DecodeServerMessage reply;
        EXPECT_FALSE(stream->Read(&reply));
        EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
      }
      v1::NcclBootstrapRequest nb;
      v1::NcclBootstrapResponse nr;
      grpc::ClientContext ctx;
      EXPECT_EQ(decode->NcclBootstrap(Deadline(&ctx), nb, &nr).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  // Nothing ever connected to the attacker's address, and no lease was opened.
  sockaddr_in from{};
  socklen_t len = sizeof(from);
  EXPECT_LT(::accept(trap, reinterpret_cast<sockaddr*>(&from), &len), 0);
  ::close(trap);
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST(AttackTest, Row25And26_WorkerIdsCannotBeTakenOverAndLoadClaimsAreBounded) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  auto registry = v1::Registry::NewStub(Plain(c.router_internal()));
  v1::WorkerInfo decode;
  const v1::ListWorkersResponse listed4 = c.Workers();
  for (const auto& w : listed4.workers()) {
    if (w.role() == v1::WORKER_ROLE_DECODE) decode = w;
  }
  ASSERT_FALSE(decode.worker_id().empty());
  // Even with the cluster's secret (a rogue member), the live decode worker's id cannot be
  // registered from another address...
  v1::RegisterRequest hijack;
  hijack.set_worker_id(decode.worker_id());
  hijack.set_role(v1::WORKER_ROLE_DECODE);
  hijack.set_address("127.0.0.1:9");
  hijack.set_kv_endpoint("tcp://127.0.0.1:9");
  hijack.mutable_load()->set_total_kv_blocks(1 << 30);
  hijack.mutable_load()->set_free_kv_blocks(1 << 30);
  hijack.mutable_load()->set_block_size(16);
  v1::RegisterResponse rr;
  for (int i = 0; i < 5; ++i) {
    grpc::ClientContext ctx;
    testing::ProveCluster(&ctx, internal_method::kRegister, PeerRole::kDecode);
    const grpc::Status s = registry->Register(Deadline(&ctx), hijack, &rr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  }
  // ...and a heartbeat claiming endless room is held to the capacity it registered.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(decode.worker_id());
  hb.set_serving(true);
  hb.mutable_load()->set_free_kv_blocks(1 << 30);
  hb.mutable_load()->set_total_kv_blocks(1 << 30);
  hb.mutable_load()->set_block_size(1);
  hb.mutable_load()->set_running_requests(-5);
  v1::HeartbeatResponse hr;
  grpc::ClientContext hctx;
  testing::ProveCluster(&hctx, internal_method::kHeartbeat, PeerRole::kDecode);
  ASSERT_TRUE(registry->Heartbeat(Deadline(&hctx), hb, &hr).ok());
  const v1::ListWorkersResponse listed5 = c.Workers();
  for (const auto& w : listed5.workers()) {
    if (w.worker_id() != decode.worker_id()) continue;
    EXPECT_EQ(w.address(), decode.address());
    EXPECT_EQ(w.kv_endpoint(), decode.kv_endpoint());
    EXPECT_EQ(w.load().total_kv_blocks(), decode.load().total_kv_blocks());
    EXPECT_LE(w.load().free_kv_blocks(), decode.load().total_kv_blocks());
    EXPECT_EQ(w.load().block_size(), decode.load().block_size());
    EXPECT_GE(w.load().running_requests(), 0);
  }
  // The real worker keeps serving, and its next heartbeat restores its true load.
  EXPECT_EQ(WrongOutputs(c, 2), 0);
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 27: a decode worker that names another KV endpoint ------------------------------

// A DecodeWorker that admits every request with a KV target of the attacker's choosing (a
// compromised member of the cluster trying to make prefill workers send prompts elsewhere).
class LyingDecode final : public v1::DecodeWorker::Service {
 public:
  explicit LyingDecode(std::string endpoint) : endpoint_(std::move(endpoint)) {}
  grpc::Status Decode(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::DecodeServerMessage, v1::DecodeClientMessage>* stream) override {
    ++admissions;
    v1::DecodeClientMessage m;
    if (!stream->Read(&m)) return grpc::Status::CANCELLED;
    v1::DecodeServerMessage out;
    out.mutable_admitted()->mutable_kv_target()->set_endpoint(endpoint_);
    out.mutable_admitted()->mutable_kv_target()->set_lease_id(7);
    stream->Write(out);
    while (stream->Read(&m)) {
    }
    return grpc::Status::OK;
  }
  std::atomic<int> admissions{0};

 private:
  std::string endpoint_;
};

TEST(AttackTest, Row27_PrefillNeverSendsKvWhereNoDecodeWorkerRegistered) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  // The attacker's listener, which must never see a connection.
  const int trap = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(trap, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::listen(trap, 16);
  socklen_t len = sizeof(a);
  ::getsockname(trap, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string trap_endpoint = absl::StrCat("tcp://127.0.0.1:", ntohs(a.sin_port));

  // The lying decode worker registers (with the secret) under its own KV endpoint, with more
  // room than the real one, so routing picks it first...
  LyingDecode liar(trap_endpoint);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&liar);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto registry = v1::Registry::NewStub(Plain(c.router_internal()));
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    v1::RegisterRequest reg;
    reg.set_worker_id("liar");
    reg.set_role(v1::WORKER_ROLE_DECODE);
    reg.set_address(absl::StrCat("127.0.0.1:", port));
    reg.set_kv_endpoint("tcp://127.0.0.1:1");  // not where its admissions point
    reg.mutable_load()->set_total_kv_blocks(1 << 20);
    reg.mutable_load()->set_free_kv_blocks(1 << 20);
    reg.mutable_load()->set_block_size(16);
    bool registered = false;
    while (!stop.load()) {
      grpc::ClientContext ctx;
      if (!registered) {
        testing::ProveCluster(&ctx, internal_method::kRegister, PeerRole::kDecode);
        v1::RegisterResponse rr;
        registered = registry->Register(Deadline(&ctx), reg, &rr).ok();
      } else {
        testing::ProveCluster(&ctx, internal_method::kHeartbeat, PeerRole::kDecode);
        v1::HeartbeatRequest hb;
        hb.set_worker_id("liar");
        hb.set_serving(true);
        *hb.mutable_load() = reg.load();
        v1::HeartbeatResponse hr;
        registry->Heartbeat(Deadline(&ctx), hb, &hr);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  ASSERT_TRUE(WaitFor([&] { return c.Workers().workers_size() == 3; }));
  // ...but its admissions are refused, it is reported as failing, and every request is served
  // exactly by the real decode worker.
  EXPECT_EQ(WrongOutputs(c, 2), 0);
  EXPECT_GT(liar.admissions.load(), 0);
  sockaddr_in from{};
  len = sizeof(from);
  EXPECT_LT(::accept(trap, reinterpret_cast<sockaddr*>(&from), &len), 0)
      << "a prefill worker connected to the attacker's address";
  stop = true;
  heartbeats.join();
  ::close(trap);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

// ---- Rows 28, 29: forged, replayed and oversized KV chunks -------------------------------

TEST(AttackTest, Row28_ForgedKvChunksAreRefusedAndOutputsStayExact) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::string kv = DecodeKvEndpoint(c);
  ASSERT_TRUE(absl::StartsWith(kv, "tcp://")) << kv;
  // Without the secret the receiver says nothing but its hello and hangs up.
  {
    const int fd = Connect(kv.substr(6));
    ASSERT_GE(fd, 0);
    KvChunkHeader h;
    h.lease_id = 1;
    h.generation = 1;
    h.token_count = 1;
    h.width = 16;
    const std::string frame = EncodeKvDataFrame(1, h, std::string(2 * 16 * 4, '\0'));
    std::string junk(72, 'x');
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 5000) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, n);
    }
    ::close(fd);
    EXPECT_EQ(got.size(), 40u) << "only the hello, no ACK";
  }
  // With the secret, chunks for guessed leases (ids 1..64, every generation up to 64, no or a
  // random capability) while greedy requests run: all refused, one answer for all.
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, accepted{0};
  std::set<std::string> answers;
  std::mutex answers_mu;
  std::thread forger([&] {
    auto sock = KvConnection(kv, testing::TestClusterSecret());
    if (sock == nullptr) return;
    std::atomic<bool> never{false};
    uint64_t seq = 1;
    while (!stop.load()) {
      for (uint64_t id = 1; id <= 64 && !stop.load(); ++id) {
        KvChunkHeader h;
        h.lease_id = id;
        h.generation = static_cast<uint32_t>(seq % 64 + 1);
        h.capability = seq % 2 ? std::string() : RandomBytes(kKvCapabilityBytes);
        h.layer = 0;
        h.token_start = 0;
        h.token_count = 1;
        h.width = 16;
        const std::string frame = EncodeKvDataFrame(seq++, h, std::string(2 * 16 * 4, '\7'));
        if (!sock->WriteAll(frame, {}, never, absl::Seconds(5)).ok()) return;
        ++sent;
        char hdr[kKvFrameHeaderBytes];
        if (!sock->ReadFull(hdr, sizeof(hdr), never, absl::Now() + absl::Seconds(5),
                            absl::Seconds(5))
                 .ok()) {
          return;
        }
        absl::StatusOr<KvFrameHeader> ack = DecodeKvFrameHeader(std::string_view(hdr, sizeof(hdr)));
        if (!ack.ok()) return;
        std::string message(ack->payload_length, '\0');
        sock->ReadFull(message.data(), message.size(), never, absl::Now() + absl::Seconds(5),
                       absl::Seconds(5))
            .IgnoreError();
        if (ack->status == absl::StatusCode::kOk) {
          ++accepted;
        } else {
          std::lock_guard<std::mutex> lock(answers_mu);
          answers.insert(absl::StrCat(static_cast<int>(ack->status), ": ", message));
        }
      }
    }
  });
  const int wrong = WrongOutputs(c, 4);
  stop = true;
  forger.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(sent.load(), 100);
  EXPECT_EQ(accepted.load(), 0);
  EXPECT_EQ(answers.size(), 1u) << "refusals must not tell leases apart";
  for (const std::string& a : answers) EXPECT_TRUE(absl::StrContains(a, "no live lease")) << a;
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST(AttackTest, Row29_OversizedKvHeadersAllocateNothing) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::string kv = DecodeKvEndpoint(c);
  const pid_t decode_pid = c.pids().back();
  const int64_t rss0 = RssKb(decode_pid);
  // Four connections, each announcing a 256 MiB chunk (the frame limit) and sending nothing
  // more: before the payload comes, the lease check refuses it, so no buffer grows.
  std::vector<std::unique_ptr<SecureSocket>> socks;
  std::atomic<bool> never{false};
  for (int i = 0; i < 4; ++i) {
    auto sock = KvConnection(kv, testing::TestClusterSecret());
    ASSERT_NE(sock, nullptr);
    KvChunkHeader h;
    h.lease_id = 12345 + i;
    h.generation = 1;
    h.token_count = 1 << 16;
    h.width = 512;  // 2 * 65536 * 512 * 4 bytes = 256 MiB
    KvFrameHeader fh;
    fh.kind = KvFrameKind::kData;
    fh.seq = 1;
    fh.chunk = h;
    fh.payload_length = uint64_t{2} * h.token_count * h.width * 4;
    char hdr[kKvFrameHeaderBytes];
    EncodeKvFrameHeader(fh, hdr);
    ASSERT_TRUE(
        sock->WriteAll(std::string_view(hdr, sizeof(hdr)), {}, never, absl::Seconds(5)).ok());
    socks.push_back(std::move(sock));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t rss1 = RssKb(decode_pid);
  EXPECT_LT(rss1 - rss0, 64 * 1024) << "RSS grew from " << rss0 << " to " << rss1 << " kB";
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  socks.clear();
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 30: connection floods and slow clients -------------------------------------------

TEST(AttackTest, Row30_IdleKvConnectionFloodIsCapped) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::string kv = DecodeKvEndpoint(c);
  const pid_t decode_pid = c.pids().back();
  // The baseline with the cluster's own connections and threads up (a request has run).
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  const int64_t threads0 = Threads(decode_pid);
  std::vector<int> fds;
  for (int i = 0; i < 600; ++i) {
    const int fd = Connect(kv.substr(6));
    if (fd >= 0) fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t threads1 = Threads(decode_pid);
  // 256 connections at most (KvReceiverOptions), one thread each.
  EXPECT_LE(threads1 - threads0, 260) << threads0 << " -> " << threads1;
  // The cluster's own prefill worker still gets its KV through: the strangers that have not
  // proved anything make room for it.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  for (int fd : fds) ::close(fd);
  // Past the handshake deadline (5 s) every stranger is gone.
  EXPECT_TRUE(WaitFor([&] { return Threads(decode_pid) <= threads0 + 2; }, 10000))
      << Threads(decode_pid) << " threads, " << threads0 << " at the start";
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST(AttackTest, Row30_SlowAndIdleHttpClientsDoNotStarveOthers) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const pid_t router_pid = c.pids().front();
  const int64_t threads0 = Threads(router_pid);
  // 300 idle connections and 100 that send a header byte every 200 ms, from one address.
  std::vector<int> idle, slow;
  for (int i = 0; i < 300; ++i) idle.push_back(Connect(c.http()));
  for (int i = 0; i < 100; ++i) slow.push_back(Connect(c.http()));
  std::atomic<bool> stop{false};
  std::thread drip([&] {
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
    for (size_t i = 0; !stop.load(); i = (i + 1) % request.size()) {
      for (int fd : slow) ::send(fd, &request[i], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // A legitimate client, from the same address and from another, is answered within a second.
  for (const char* source : {"127.0.0.1", "127.0.0.2"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = Connect(c.http(), source);
    ASSERT_GE(fd, 0);
    const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4})";
    const std::string req = absl::StrFormat(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
        body.size(), body);
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 5000) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, n);
    }
    ::close(fd);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200")) << source << ": " << got;
    EXPECT_LT(seconds, 1.0) << source;
  }
  // No thread per connection: the router's thread count barely moved.
  EXPECT_LT(Threads(router_pid) - threads0, 16);
  stop = true;
  drip.join();
  for (int fd : idle) ::close(fd);
  for (int fd : slow) ::close(fd);
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 31: hostile JSON ---------------------------------------------------------------

TEST(AttackTest, Row31_DeepJsonAndHugeNumbersAre400NamingTheProblem) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::string deep =
      R"({"prompt": "a", "extra": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  testing::HttpReply r = testing::Curl(c.http(), "/v1/completions", deep);
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_TRUE(absl::StrContains(r.body, "nested deeper than")) << r.body.substr(0, 300);
  EXPECT_TRUE(absl::StrContains(r.body, "extra")) << r.body.substr(0, 300);
  for (const char* field : {"temperature", "max_tokens", "top_p", "seed"}) {
    r = testing::Curl(c.http(), "/v1/completions",
                      absl::StrFormat(R"({"prompt": "a", "%s": 1e400})", field));
    EXPECT_EQ(r.status, 400) << field << ": " << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, field)) << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, "out of range")) << r.body;
  }
  r = testing::Curl(c.http(), "/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": -1e999})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "logprobs")) << r.body;
  // The server is unaffected.
  EXPECT_EQ(testing::Curl(c.http(), "/health").status, 200);
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  EXPECT_TRUE(c.AllBlocksFree());
}

}  // namespace
}  // namespace tandem
