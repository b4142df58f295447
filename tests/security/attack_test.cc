// The attacks of docs/reliability.md rows 24-31 and 34-39, by a hostile client written for the
// test, against real processes on loopback: reaching the internal surfaces without the cluster's
// credentials (or with the wrong ones), replaying recorded proofs at other processes, restarted
// ones or under other messages, taking over a worker id, inflating load claims, steering a
// prefill's KV to an address of the attacker's choosing through a decode worker that lies about
// its endpoint, relaying a KV session to take it over after its handshake, forging and
// oversizing KV chunks, flooding the KV and HTTP ports with idle and slow connections, hostile
// JSON (deep, huge numbers, objects of 100k keys), large HTTP bodies held unfinished with and
// without an API key, squatting request ids, and schemas no finite value satisfies. Every test
// checks that legitimate requests are served exactly meanwhile, and ends with the leak check.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
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
#include "structured/json_matcher.h"
#include "structured/json_schema.h"
#include "tests/cluster_auth.h"
#include "tests/http/http_client.h"
#include "tests/kv_transfer/kv_relay.h"
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
// gone rogue, or one that learned the secret), with its session: what it may still not do is
// the point.
struct KvClient {
  std::unique_ptr<SecureSocket> sock;
  std::unique_ptr<KvSession> session;
  explicit operator bool() const { return sock != nullptr; }

  // Writes a frame, sealed.
  bool Send(std::string_view frame) {
    std::atomic<bool> never{false};
    return sock->WriteAll(SealKvFrame(*session, frame), {}, never, absl::Seconds(5)).ok();
  }
  // Reads an ACK and checks its seals: the header and the status message.
  absl::StatusOr<std::pair<KvFrameHeader, std::string>> ReadAck() {
    std::atomic<bool> never{false};
    auto read = [&](size_t n) -> absl::StatusOr<std::string> {
      std::string out(n, '\0');
      if (absl::Status s = sock->ReadFull(out.data(), n, never, absl::Now() + absl::Seconds(5),
                                          absl::Seconds(5));
          !s.ok()) {
        return s;
      }
      return out;
    };
    absl::StatusOr<std::string> hdr = read(kKvFrameHeaderBytes + kKvFrameTagBytes);
    if (!hdr.ok()) return hdr.status();
    if (!session->Open(hdr->substr(0, kKvFrameHeaderBytes), hdr->substr(kKvFrameHeaderBytes))) {
      return absl::UnauthenticatedError("the ACK's header seal is wrong");
    }
    absl::StatusOr<KvFrameHeader> ack = DecodeKvFrameHeader(hdr->substr(0, kKvFrameHeaderBytes));
    if (!ack.ok()) return ack.status();
    absl::StatusOr<std::string> msg = read(ack->payload_length + kKvFrameTagBytes);
    if (!msg.ok()) return msg.status();
    if (!session->Open(msg->substr(0, ack->payload_length), msg->substr(ack->payload_length))) {
      return absl::UnauthenticatedError("the ACK's message seal is wrong");
    }
    return std::make_pair(*ack, msg->substr(0, ack->payload_length));
  }
};

KvClient KvConnection(const std::string& endpoint, const ClusterSecret& secret) {
  const int fd = Connect(endpoint.substr(std::string("tcp://").size()));
  if (fd < 0) return {};
  auto sock = std::make_unique<SecureSocket>(fd, nullptr, /*server=*/false);
  KvAuth auth;
  auth.secret = secret;
  std::atomic<bool> stop{false};
  absl::StatusOr<std::unique_ptr<KvSession>> session = AuthenticateKvConnection(
      *sock, auth, /*receiver=*/false, stop, absl::Now() + absl::Seconds(5));
  if (!session.ok()) return {};
  return KvClient{std::move(sock), *std::move(session)};
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
    WrongSecret()->SetAudience(
        c.router_internal(),
        testing::ProbeInstance(c.router_internal(), internal_method::kRegister));
    WrongSecret()->Attach(&ctx, internal_method::kRegister, PeerRole::kDecode, c.router_internal(),
                          fake);
    EXPECT_EQ(registry->Register(Deadline(&ctx), fake, &rr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // A proof seen on the wire, used again: it worked once.
    const std::string proof = testing::TestInternalAuth()->Proof(
        internal_method::kListWorkers, PeerRole::kRouter,
        testing::ProbeInstance(c.router_internal(), internal_method::kListWorkers),
        v1::ListWorkersRequest());
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
    testing::ProveCluster(&ctx, internal_method::kListWorkers, c.router_internal(), fake,
                          PeerRole::kDecode);
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
      WrongSecret()->SetAudience(w.address(),
                                 testing::ProbeInstance(w.address(), internal_method::kPrefill));
      WrongSecret()->Attach(&wrong, internal_method::kPrefill, PeerRole::kRouter, w.address(), req);
      EXPECT_EQ(prefill->Prefill(Deadline(&wrong), req, &resp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      // A cluster member that is not a router (a decode worker's proof) may not either.
      grpc::ClientContext decode_role;
      testing::ProveCluster(&decode_role, internal_method::kPrefill, w.address(), req,
                            PeerRole::kDecode);
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
    testing::ProveCluster(&ctx, internal_method::kRegister, c.router_internal(), hijack,
                          PeerRole::kDecode);
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
  testing::ProveCluster(&hctx, internal_method::kHeartbeat, c.router_internal(), hb,
                        PeerRole::kDecode);
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

// A decode worker of the attacker's, registered with the router and kept alive by heartbeats
// until destroyed. It registers with a genuine proof (more than an attacker can get, Row 34), to
// show what holds even against a member gone rogue; it claims more room than the real worker,
// so routing picks it first.
class RogueRegistration {
 public:
  RogueRegistration(const std::string& router_internal, const std::string& id, int port,
                    const std::string& kv_endpoint)
      : thread_([this, router_internal, id, port, kv_endpoint] {
          auto registry = v1::Registry::NewStub(Plain(router_internal));
          v1::RegisterRequest reg;
          reg.set_worker_id(id);
          reg.set_role(v1::WORKER_ROLE_DECODE);
          reg.set_address(absl::StrCat("127.0.0.1:", port));
          reg.set_kv_endpoint(kv_endpoint);
          reg.mutable_load()->set_total_kv_blocks(1 << 20);
          reg.mutable_load()->set_free_kv_blocks(1 << 20);
          reg.mutable_load()->set_block_size(16);
          bool registered = false;
          while (!stop_.load()) {
            grpc::ClientContext ctx;
            if (!registered) {
              testing::ProveCluster(&ctx, internal_method::kRegister, router_internal, reg,
                                    PeerRole::kDecode);
              v1::RegisterResponse rr;
              registered = registry->Register(Deadline(&ctx), reg, &rr).ok();
            } else {
              v1::HeartbeatRequest hb;
              hb.set_worker_id(id);
              hb.set_serving(true);
              *hb.mutable_load() = reg.load();
              testing::ProveCluster(&ctx, internal_method::kHeartbeat, router_internal, hb,
                                    PeerRole::kDecode);
              v1::HeartbeatResponse hr;
              registry->Heartbeat(Deadline(&ctx), hb, &hr);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }) {}
  ~RogueRegistration() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts once the rest is built
};

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
  std::optional<RogueRegistration> rogue;
  rogue.emplace(c.router_internal(), "liar", port,
                "tcp://127.0.0.1:1");  // not where its admissions point
  ASSERT_TRUE(WaitFor([&] { return c.Workers().workers_size() == 3; }));
  // ...but its admissions are refused, it is reported as failing, and every request is served
  // exactly by the real decode worker.
  EXPECT_EQ(WrongOutputs(c, 2), 0);
  EXPECT_GT(liar.admissions.load(), 0);
  sockaddr_in from{};
  len = sizeof(from);
  EXPECT_LT(::accept(trap, reinterpret_cast<sockaddr*>(&from), &len), 0)
      << "a prefill worker connected to the attacker's address";
  rogue.reset();
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
    KvClient kvc = KvConnection(kv, testing::TestClusterSecret());
    if (!kvc) return;
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
        if (!kvc.Send(frame)) return;
        ++sent;
        auto ack = kvc.ReadAck();
        if (!ack.ok()) return;
        if (ack->first.status == absl::StatusCode::kOk) {
          ++accepted;
        } else {
          std::lock_guard<std::mutex> lock(answers_mu);
          answers.insert(absl::StrCat(static_cast<int>(ack->first.status), ": ", ack->second));
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
  std::vector<KvClient> socks;
  std::atomic<bool> never{false};
  for (int i = 0; i < 4; ++i) {
    KvClient sock = KvConnection(kv, testing::TestClusterSecret());
    ASSERT_TRUE(sock);
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
    std::string head(hdr, sizeof(hdr));
    head += sock.session->Tag(head);
    ASSERT_TRUE(sock.sock->WriteAll(head, {}, never, absl::Seconds(5)).ok());
    socks.push_back(std::move(sock));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t rss1 = RssKb(decode_pid);
  EXPECT_LT(rss1 - rss0, 64 * 1024) << "RSS grew from " << rss0 << " to " << rss1 << " kB";
  EXPECT_EQ(WrongOutputs(c, 1), 0);
  socks.clear();
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 34: recorded proofs are good once, at one process --------------------------------

// A tandem-server --role=router of the test cluster's secret; `extra` adds flags.
ServerProcess StartRouter(std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {"--role=router",
                                   "--model",
                                   testing::Stories260K(),
                                   "--tokenizer",
                                   testing::Tok512(),
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   "0",
                                   "--cluster-secret-file",
                                   testing::TestClusterSecretFile()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return StartServerProcess(testing::BinDir() + "/tandem-server", argv);
}

// A call with exactly the proof (metadata value) and message an observer recorded.
grpc::Status ReplayRegister(const std::string& internal, const std::string& proof,
                            const v1::RegisterRequest& req) {
  grpc::ClientContext ctx;
  ctx.AddMetadata(kClusterAuthMetadata, proof);
  v1::RegisterResponse resp;
  return v1::Registry::NewStub(Plain(internal))->Register(Deadline(&ctx), req, &resp);
}

// Opens a Decode stream with `proof` and `admit`: the kv_target when admitted, else the status.
absl::StatusOr<v1::KvTarget> ReplayDecode(const std::string& address, const std::string& proof,
                                          const v1::DecodeClientMessage& admit) {
  grpc::ClientContext ctx;
  ctx.AddMetadata(kClusterAuthMetadata, proof);
  auto stream = v1::DecodeWorker::NewStub(Plain(address))->Decode(Deadline(&ctx));
  stream->Write(admit);
  v1::DecodeServerMessage reply;
  if (stream->Read(&reply) && reply.has_admitted()) {
    ctx.TryCancel();  // the lease is given back when the stream ends
    stream->Finish();
    return reply.admitted().kv_target();
  }
  stream->WritesDone();
  return FromGrpc(stream->Finish());
}

TEST(AttackTest, Row34_RecordedProofsWorkOnceAtOneProcessOnly) {
  Cluster c(1, 2);
  ASSERT_TRUE(c.ready());
  // Router B shares the cluster's secret; A is the cluster's router, serving the victims.
  ServerProcess b = StartRouter();
  ASSERT_FALSE(b.internal.empty());
  const std::string b_internal_port = b.internal.substr(b.internal.rfind(':') + 1);

  // A worker registers with B; an observer records the call: proof and message.
  v1::RegisterRequest reg;
  reg.set_worker_id("observed-decode");
  reg.set_role(v1::WORKER_ROLE_DECODE);
  reg.set_address("127.0.0.1:9");
  reg.mutable_load()->set_total_kv_blocks(1 << 20);
  reg.mutable_load()->set_free_kv_blocks(1 << 20);
  reg.mutable_load()->set_block_size(16);
  const std::string proof = testing::TestInternalAuth()->Proof(
      internal_method::kRegister, PeerRole::kDecode,
      testing::ProbeInstance(b.internal, internal_method::kRegister), reg);
  ASSERT_TRUE(ReplayRegister(b.internal, proof, reg).ok()) << "the genuine call";
  const size_t workers_before = c.Workers().workers_size();

  // Replayed at another router of the cluster: the proof names B.
  grpc::Status s = ReplayRegister(c.router_internal(), proof, reg);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "not this process")) << s.error_message();
  // Replayed at B: already used.
  s = ReplayRegister(b.internal, proof, reg);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "replayed")) << s.error_message();
  // Replayed at B restarted on the same port a second later: a new process, a new instance.
  StopProcesses({b.pid});
  b = StartRouter({"--internal-port", b_internal_port});
  ASSERT_EQ(b.internal.substr(b.internal.rfind(':') + 1), b_internal_port);
  s = ReplayRegister(b.internal, proof, reg);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "not this process")) << s.error_message();
  // A fresh proof for B with another message under it (the worker's address changed on the way).
  v1::RegisterRequest altered = reg;
  const std::string fresh = testing::TestInternalAuth()->Proof(
      internal_method::kRegister, PeerRole::kDecode,
      testing::ProbeInstance(b.internal, internal_method::kRegister), reg);
  altered.set_address("127.0.0.1:10");
  s = ReplayRegister(b.internal, fresh, altered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "another message")) << s.error_message();
  EXPECT_EQ(static_cast<size_t>(c.Workers().workers_size()), workers_before);

  // The router's Decode call to one decode worker, recorded and replayed at the other: no lease.
  std::vector<std::string> decoders;
  const v1::ListWorkersResponse listed = c.Workers();
  for (const auto& w : listed.workers()) {
    if (w.role() == v1::WORKER_ROLE_DECODE) decoders.push_back(w.address());
  }
  ASSERT_EQ(decoders.size(), 2u);
  v1::DecodeClientMessage admit;
  admit.mutable_admit()->set_request_id("recorded");
  admit.mutable_admit()->add_prompt_ids(1);
  admit.mutable_admit()->add_prompt_ids(2);
  admit.mutable_admit()->set_max_tokens(8);
  const std::string decode_proof = testing::TestInternalAuth()->Proof(
      internal_method::kDecode, PeerRole::kRouter,
      testing::ProbeInstance(decoders[0], internal_method::kDecode), admit);
  absl::StatusOr<v1::KvTarget> lease = ReplayDecode(decoders[0], decode_proof, admit);
  ASSERT_TRUE(lease.ok()) << "the genuine call: " << lease.status();
  lease = ReplayDecode(decoders[1], decode_proof, admit);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnauthenticated) << lease.status();
  EXPECT_TRUE(absl::StrContains(lease.status().message(), "not this process")) << lease.status();
  lease = ReplayDecode(decoders[0], decode_proof, admit);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnauthenticated) << lease.status();
  // A fresh Decode proof with another admission under it.
  v1::DecodeClientMessage bigger = admit;
  bigger.mutable_admit()->set_max_tokens(4096);
  lease = ReplayDecode(decoders[0],
                       testing::TestInternalAuth()->Proof(
                           internal_method::kDecode, PeerRole::kRouter,
                           testing::ProbeInstance(decoders[0], internal_method::kDecode), admit),
                       bigger);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnauthenticated) << lease.status();
  EXPECT_TRUE(absl::StrContains(lease.status().message(), "another message")) << lease.status();

  EXPECT_EQ(WrongOutputs(c, 2), 0);
  StopProcesses({b.pid});
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 35: a relay cannot take a KV session over after its handshake ---------------------

// A decode worker the attacker runs: it admits every request with a lease on its own KV
// endpoint (a relay to the real decode worker's KV port) and, once started, streams text of its
// own.
class ImpostorDecode final : public v1::DecodeWorker::Service {
 public:
  explicit ImpostorDecode(std::string endpoint) : endpoint_(std::move(endpoint)) {}
  grpc::Status Decode(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::DecodeServerMessage, v1::DecodeClientMessage>* stream) override {
    ++admissions;
    v1::DecodeClientMessage m;
    if (!stream->Read(&m)) return grpc::Status::CANCELLED;
    v1::DecodeServerMessage out;
    v1::KvTarget* t = out.mutable_admitted()->mutable_kv_target();
    t->set_endpoint(endpoint_);
    t->set_lease_id(admissions.load());
    t->set_generation(1);
    t->set_capability(RandomBytes(kKvCapabilityBytes));
    stream->Write(out);
    if (!stream->Read(&m) || !m.has_start()) return grpc::Status::CANCELLED;
    ++started;
    v1::DecodeServerMessage tokens;
    for (int i = 0; i < 8; ++i) tokens.mutable_tokens()->add_ids(300 + i);
    stream->Write(tokens);
    v1::DecodeServerMessage done;
    done.mutable_finished()->set_reason(v1::FINISH_REASON_LENGTH);
    stream->Write(done);
    return grpc::Status::OK;
  }
  std::atomic<int> admissions{0}, started{0};

 private:
  std::string endpoint_;
};

TEST(AttackTest, Row35_ARelayCannotTakeOverAKvSessionAfterItsHandshake) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  (void)Reference();
  // The relay passes the KV handshake through to the real decode worker's KV port, so the
  // prefill worker and the decode worker prove the secret to each other; then it keeps the
  // prompt's KV and answers every chunk itself.
  testing::KvRelay relay(DecodeKvEndpoint(c), testing::KvRelay::Mode::kAnswerItself);
  ImpostorDecode impostor(relay.endpoint());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&impostor);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::optional<RogueRegistration> rogue;
  rogue.emplace(c.router_internal(), "impostor", port, relay.endpoint());
  ASSERT_TRUE(WaitFor([&] { return c.Workers().workers_size() == 3; }));
  // 20 victims: the prefill worker believes none of the relay's answers, so no request is ever
  // started on the impostor; each is served exactly by the real decode worker.
  EXPECT_EQ(WrongOutputs(c, 5), 0);
  EXPECT_GT(impostor.admissions.load(), 0);
  EXPECT_GE(relay.handshakes(), 1) << "the prefill worker never reached the relay";
  EXPECT_GT(relay.forged_acks(), 0);
  EXPECT_EQ(impostor.started.load(), 0) << "a request was started on the impostor";
  rogue.reset();
  server->Shutdown();
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

// ---- Rows 36, 37: JSON key-count bombs, request bodies held before authentication ----------

// One HTTP POST on a raw socket, read until the server closes: its status (0: none), body and
// how long it took.
struct HttpExchange {
  int status = 0;
  std::string body;
  double seconds = 0;
};
HttpExchange HttpPost(const std::string& http, const std::string& path, std::string_view body,
                      const std::string& headers = "") {
  const auto t0 = std::chrono::steady_clock::now();
  HttpExchange out;
  const int fd = Connect(http);
  if (fd < 0) return out;
  std::string request = absl::StrFormat(
      "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n"
      "Connection: close\r\n\r\n",
      path, headers, body.size());
  request.append(body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string got;
  char buf[16384];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 30000) > 0) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (absl::StartsWith(got, "HTTP/1.1 ")) out.status = std::atoi(got.c_str() + 9);
  if (const size_t end = got.find("\r\n\r\n"); end != std::string::npos) {
    out.body = got.substr(end + 4);
  }
  return out;
}

// What the server has sent on `fd` so far, without waiting.
std::string ReadNow(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
}

// User plus system CPU seconds of `pid` so far.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrFormat("/proc/%d/stat", pid));
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // from the 3rd field, state
  std::vector<std::string> f;
  for (std::string x; fields >> x;) f.push_back(x);
  if (f.size() < 13) return -1;
  return (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A legitimate HTTP client beside an attack: a greedy completion every 20 ms, each timed and
// compared with the same request's answer on the quiet cluster (taken when it is made).
class HttpVictim {
 public:
  explicit HttpVictim(std::string http, std::string headers = "")
      : http_(std::move(http)), headers_(std::move(headers)), quiet_(Text(Ask())) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const HttpExchange r = Ask();
        {
          std::lock_guard<std::mutex> lock(mu_);
          seconds_.push_back(r.seconds);
          if (quiet_.empty() || Text(r) != quiet_) ++wrong_;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~HttpVictim() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const std::string& quiet() const { return quiet_; }
  // After Stop.
  size_t requests() const { return seconds_.size(); }
  int wrong() const { return wrong_; }
  double Percentile(double q) {
    if (seconds_.empty()) return -1;
    std::sort(seconds_.begin(), seconds_.end());
    return seconds_[std::min(seconds_.size() - 1, static_cast<size_t>(q * seconds_.size()))];
  }

 private:
  HttpExchange Ask() const {
    return HttpPost(http_, "/v1/completions",
                    R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                        "ignore_eos": true})",
                    headers_);
  }
  static std::string Text(const HttpExchange& r) {
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || !j["choices"].is_array()) return "";
    return j["choices"][0].value("text", "");
  }

  const std::string http_, headers_, quiet_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<double> seconds_;
  int wrong_ = 0;
  std::thread thread_;
};

// A JSON object of `keys` keys ("0": 1, "1": 1, ...): a logit_bias, a tool's properties, or
// a field Tandem does not know.
std::string KeysObject(size_t keys) {
  std::string out = "{";
  for (size_t i = 0; i < keys; ++i) absl::StrAppend(&out, i ? ", \"" : "\"", i, "\": 1");
  return out + "}";
}

TEST(AttackTest, Row36_JsonKeyCountBombsAreRefusedAtOnceAndVictimsStayFast) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const pid_t router = c.pids().front();
  // The bombs (each 1.3 to 2 MB): 100k logit_bias entries, 150k keys in a field Tandem does not
  // know, a tool whose parameters have 100k properties. Before the limits each cost seconds of
  // quadratic parsing (150k keys: about 50 s), after their clients had gone too.
  struct Bomb {
    const char* path;
    std::string body;
    std::string error;
  };
  const std::vector<Bomb> bombs = {
      {"/v1/completions",
       absl::StrCat(R"({"prompt": "a", "max_tokens": 4, "logit_bias": )", KeysObject(100000), "}"),
       "logit_bias: a JSON object with more than 4096 keys"},
      {"/v1/completions",
       absl::StrCat(R"({"prompt": "a", "frobnicate": )", KeysObject(150000), "}"),
       "frobnicate: a JSON object with more than 4096 keys"},
      {"/v1/chat/completions",
       absl::StrCat(R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type":
           "function", "function": {"name": "f", "parameters": {"type": "object", "properties": )",
                    KeysObject(100000), "}}}]}"),
       "tools[0].function.parameters.properties: a JSON object with more than 4096 keys"},
  };
  for (const Bomb& b : bombs) {
    const HttpExchange r = HttpPost(c.http(), b.path, b.body);
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(r.body, b.error)) << r.body.substr(0, 300);
  }
  // Within the limits, as wide as they allow: 60 objects of 4096 keys (2.6 MB) parse linearly.
  std::string wide = R"({"prompt": "Once upon a time", "max_tokens": 2, "frobnicate": [)";
  for (int i = 0; i < 60; ++i) absl::StrAppend(&wide, i ? ", " : "", KeysObject(4096));
  wide += "]}";
  EXPECT_EQ(HttpPost(c.http(), "/v1/completions", wide).status, 200);

  // 66 bombs, 6 at a time, and the wide body 6 times, beside an HTTP victim and gRPC ones.
  HttpVictim victim(c.http());
  ASSERT_FALSE(victim.quiet().empty());
  std::atomic<int> refused{0}, wide_ok{0};
  std::vector<std::thread> attackers;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < 6; ++t) {
    attackers.emplace_back([&, t] {
      for (int i = t; i < 66; i += 6) {
        const Bomb& b = bombs[i % bombs.size()];
        const HttpExchange r = HttpPost(c.http(), b.path, b.body);
        if (r.status == 400 && absl::StrContains(r.body, b.error)) ++refused;
      }
      if (HttpPost(c.http(), "/v1/completions", wide).status == 200) ++wide_ok;
    });
  }
  const int wrong = WrongOutputs(c, 2);
  for (auto& t : attackers) t.join();
  const double attack_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  victim.Stop();
  EXPECT_EQ(refused.load(), 66);
  EXPECT_EQ(wide_ok.load(), 6);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(victim.wrong(), 0);
  EXPECT_GE(victim.requests(), 5u);
  const double p50 = victim.Percentile(0.5), p99 = victim.Percentile(0.99);
  EXPECT_LT(p99, 1.0) << "victim p50 " << p50 << " s";

  // Four clients send 150k keys each and leave at once: nothing goes on after them.
  const double cpu0 = CpuSeconds(router);
  for (int i = 0; i < 4; ++i) {
    const int fd = Connect(c.http());
    ASSERT_GE(fd, 0);
    const std::string req =
        absl::StrFormat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s",
                        bombs[1].body.size(), bombs[1].body);
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu_after = CpuSeconds(router) - cpu0;
  EXPECT_LT(cpu_after, 0.5) << "the router's CPU seconds in the 2 s after the clients left";
  std::printf(
      "[row 36] 66 bombs refused in %.2f s; victim: %zu requests, p50 %.3f s, p99 %.3f s; "
      "router CPU after 4 clients left: %.2f s\n",
      attack_seconds, victim.requests(), p50, p99, cpu_after);
  EXPECT_EQ(testing::Curl(c.http(), "/health").status, 200);
  EXPECT_TRUE(c.AllBlocksFree());
}

// `n` clients each announce a body of `announced` bytes (at most 15 MiB) and send all of it but
// the last KiB, without an API key, at once; their sockets once each has sent or been cut off.
std::vector<int> HoldBodies(const std::string& http, int n, size_t announced) {
  static const std::string* const kBody = new std::string(std::string(15 << 20, ' '));
  std::vector<int> fds(n, -1);
  std::vector<std::thread> senders;
  for (int i = 0; i < n; ++i) {
    senders.emplace_back([&, i] {
      fds[i] = Connect(http);
      const std::string head = absl::StrFormat(
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Content-Length: %d\r\n\r\n",
          announced);
      ::send(fds[i], head.data(), head.size(), MSG_NOSIGNAL);
      const size_t part = std::min(announced - 1024, kBody->size());
      for (size_t sent = 0; sent < part;) {
        const ssize_t m = ::send(fds[i], kBody->data() + sent, part - sent, MSG_NOSIGNAL);
        if (m <= 0) break;  // the server refused the request and closed
        sent += static_cast<size_t>(m);
      }
    });
  }
  for (auto& t : senders) t.join();
  return fds;
}

TEST(AttackTest, Row37_RequestBytesAreBoundedBeforeAuthenticationAndMemoryReturns) {
  testing::TempDir dir;
  const std::string key = "sk-tandem-row37-0123456789abcdef";
  const std::string keys = dir.path() + "/keys.txt";
  std::ofstream(keys) << key << "\n";
  for (const bool with_keys : {false, true}) {
    SCOPED_TRACE(with_keys ? "--api-keys-file" : "no API keys");
    std::vector<std::string> router_flags;
    if (with_keys) router_flags = {"--api-keys-file", keys};
    Cluster c(1, 1, {}, router_flags);
    ASSERT_TRUE(c.ready());
    const pid_t router = c.pids().front();
    HttpVictim victim(c.http(), with_keys ? "Authorization: Bearer " + key + "\r\n" : "");
    ASSERT_FALSE(victim.quiet().empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int64_t idle_kb = RssKb(router);
    std::atomic<int64_t> peak_kb{idle_kb};
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      while (sampling.load()) {
        peak_kb = std::max(peak_kb.load(), RssKb(router));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    // 100 clients announce 15 MiB each, send all but the last KiB, and hold on (no key).
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int> fds = HoldBodies(c.http(), 100, 15 << 20);
    const double flood_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int wrong = with_keys ? 0 : WrongOutputs(c, 1);  // gRPC victims (without a key)
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    int busy = 0, unauthorized = 0, held = 0;
    for (int fd : fds) {
      const std::string got = ReadNow(fd);
      if (absl::StartsWith(got, "HTTP/1.1 503") && absl::StrContains(got, "Retry-After: 1\r\n")) {
        ++busy;
      } else if (absl::StartsWith(got, "HTTP/1.1 401")) {
        ++unauthorized;
      } else if (got.empty()) {
        ++held;
      }
    }
    const int64_t flood_peak_kb = peak_kb.load();
    for (int fd : fds) ::close(fd);
    if (with_keys) {
      EXPECT_EQ(unauthorized, 100) << busy << " busy, " << held << " held";
    } else {
      // 128 MiB (--http-max-buffered-bytes) holds 8 of them at most; every other was told.
      EXPECT_EQ(busy + held, 100) << unauthorized << " unauthorized";
      EXPECT_LE(held, 8);
      // 60 whole 15 MB requests refused after they were read (prompt: a number): their memory
      // goes back too.
      std::string bad = R"({"prompt": 5, "pad": ")" + std::string(15 << 20, 'x') + "\"}";
      std::atomic<int> refused{0};
      std::vector<std::thread> clients;
      for (int t = 0; t < 4; ++t) {
        clients.emplace_back([&] {
          for (int i = 0; i < 15; ++i) {
            refused += HttpPost(c.http(), "/v1/completions", bad).status == 400;
          }
        });
      }
      for (auto& t : clients) t.join();
      EXPECT_EQ(refused.load(), 60);
    }
    victim.Stop();
    sampling = false;
    sampler.join();
    EXPECT_LT(flood_peak_kb, 300 * 1024) << "router RSS peak during the flood (kB)";
    // After the load, the router gives its memory back: within 100 MB of idle.
    int64_t after_kb = 0;
    EXPECT_TRUE(WaitFor([&] { return (after_kb = RssKb(router)) < idle_kb + 100 * 1024; }, 10000))
        << "RSS " << after_kb << " kB, idle " << idle_kb << " kB";
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const int64_t settled_kb = RssKb(router);
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(victim.wrong(), 0);
    EXPECT_GE(victim.requests(), 5u);
    const double p50 = victim.Percentile(0.5), p99 = victim.Percentile(0.99);
    EXPECT_LT(p99, 1.0) << "victim p50 " << p50 << " s";
    std::printf(
        "[row 37%s] flood of 100 x 15 MiB sent in %.2f s: %d busy (503), %d unauthorized "
        "(401), %d held; router RSS idle %.0f MB, peak %.0f MB during the flood, %.0f MB "
        "overall, %.0f MB after (%.0f MB a second later); victim: %zu requests, p50 %.3f s, "
        "p99 %.3f s\n",
        with_keys ? ", API keys" : "", flood_seconds, busy, unauthorized, held, idle_kb / 1024.0,
        flood_peak_kb / 1024.0, peak_kb.load() / 1024.0, after_kb / 1024.0, settled_kb / 1024.0,
        victim.requests(), p50, p99);
    EXPECT_TRUE(c.AllBlocksFree());
  }
}

// ---- Row 38: request ids claimed in advance ------------------------------------------------

// A channel on a connection of its own: another client, as the router sees it.
std::shared_ptr<grpc::Channel> OwnConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Long greedy streams a squatter holds open under ids of its choosing: each has sent its first
// message (it is in flight) and is not read further until Release.
class HeldStreams {
 public:
  explicit HeldStreams(std::shared_ptr<grpc::Channel> channel, std::string key = "")
      : stub_(v1::Generation::NewStub(std::move(channel))), key_(std::move(key)) {}
  ~HeldStreams() { Release(); }

  // OK once the stream under `id` is in flight; the status it ended with otherwise.
  grpc::Status Hold(const std::string& id) {
    Held h{std::make_unique<grpc::ClientContext>(), nullptr};
    if (!key_.empty()) h.ctx->AddMetadata("authorization", "Bearer " + key_);
    v1::GenerateRequest r = Greedy("Once upon a time", 480);
    r.set_request_id(id);
    h.reader = stub_->Generate(h.ctx.get(), r);
    v1::GenerateResponse first;
    if (!h.reader->Read(&first)) return h.reader->Finish();
    held_.push_back(std::move(h));
    return grpc::Status::OK;
  }

  // Cancels every stream; returns how many were still in flight (they end CANCELLED).
  int Release() {
    for (Held& h : held_) h.ctx->TryCancel();
    int in_flight = 0;
    for (Held& h : held_) {
      v1::GenerateResponse m;
      while (h.reader->Read(&m)) {
      }
      in_flight += h.reader->Finish().error_code() == grpc::StatusCode::CANCELLED ? 1 : 0;
    }
    held_.clear();
    return in_flight;
  }

 private:
  struct Held {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  };
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::string key_;
  std::vector<Held> held_;
};

// One greedy Generate of Prompts()[p] under `id` (empty: the router assigns one), with API key
// `key` (empty: none). Adds a failure and returns false unless it gives the quiet run's tokens
// and echoes `id` (or an unguessable id of the router's).
bool GrpcVictim(v1::Generation::Stub* stub, size_t p, const std::string& id,
                const std::string& key = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  v1::GenerateRequest r = Greedy(Prompts()[p]);
  r.set_request_id(id);
  auto reader = stub->Generate(&ctx, r);
  std::vector<int> tokens;
  std::set<std::string> echoed;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
    echoed.insert(m.request_id());
  }
  const grpc::Status s = reader->Finish();
  const std::string got = echoed.size() == 1 ? *echoed.begin() : "";
  const bool id_ok = id.empty() ? got.size() == 36 && absl::StartsWith(got, "req-") : got == id;
  const bool ok = s.ok() && tokens == Reference()[p] && id_ok;
  EXPECT_TRUE(ok) << "id \"" << id.substr(0, 40) << "\": " << s.error_code() << " "
                  << s.error_message() << "; echoed " << got.substr(0, 40)
                  << (tokens == Reference()[p] ? "" : "; tokens differ");
  return ok;
}

// A squatter holds 60 streams under the ids a sequential router would hand out next (req-1 ...
// req-50) and under the ids victims choose (job-0 ... job-9). 20 gRPC victims with ids the
// router assigns, 10 choosing those job ids (on their own connection), one with a 256-byte id,
// and 10 HTTP victims all succeed with the quiet run's greedy output.
TEST(AttackTest, Row38_SquattedRequestIdsFailNoOtherClient) {
  // Slow steps keep the squatter's streams (480 tokens) in flight while the victims (24) run.
  Cluster c(1, 1, {"--fault", "step_delay_ms=40"});
  ASSERT_TRUE(c.ready());
  std::vector<std::string> texts;  // the quiet run's text of each prompt, for the HTTP victims
  for (size_t p = 0; p < Prompts().size(); ++p) {
    const Streamed s = testing::Generate(c.generation(), Greedy(Prompts()[p]));
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    ASSERT_EQ(s.tokens, Reference()[p]);
    texts.push_back(s.text);
  }
  HeldStreams squatter(OwnConnection(c.router()));
  for (int i = 1; i <= 50; ++i) ASSERT_TRUE(squatter.Hold(absl::StrCat("req-", i)).ok()) << i;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(squatter.Hold(absl::StrCat("job-", i)).ok()) << i;
  // Within one caller's namespace an id in flight is still taken.
  EXPECT_EQ(squatter.Hold("job-0").error_code(), grpc::StatusCode::ALREADY_EXISTS);

  std::atomic<int> wrong{0};
  std::vector<std::thread> victims;
  for (int v = 0; v < 20; ++v) {
    victims.emplace_back([&, v] { wrong += !GrpcVictim(c.generation(), v % 4, ""); });
  }
  for (int v = 0; v < 10; ++v) {
    victims.emplace_back(
        [&, v] { wrong += !GrpcVictim(c.generation(), v % 4, absl::StrCat("job-", v)); });
  }
  victims.emplace_back([&] { wrong += !GrpcVictim(c.generation(), 0, std::string(256, 'x')); });
  for (int v = 0; v < 10; ++v) {
    victims.emplace_back([&, v] {
      const size_t p = v % 4;
      const testing::HttpReply r =
          testing::Curl(c.http(), "/v1/completions",
                        absl::StrFormat(R"({"prompt": "%s", "max_tokens": 24, "temperature": 0,
                              "ignore_eos": true})",
                                        Prompts()[p]));
      const nlohmann::json j = r.Json();
      const bool ok = r.status == 200 && j["choices"][0]["text"] == texts[p] &&
                      j["id"].get<std::string>().size() == 5 + 36;  // cmpl-req-<32 hex>
      EXPECT_TRUE(ok) << r.status << " " << r.body.substr(0, 300);
      wrong += !ok;
    });
  }
  for (std::thread& t : victims) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(squatter.Release(), 60) << "the squatter's streams ended before the victims' did";
  EXPECT_TRUE(c.AllBlocksFree());
}

// With API keys, a caller's ids live in its key's namespace: the same on every connection that
// presents the key, apart from every other key's.
TEST(AttackTest, Row38_ClientIdsAreScopedToTheirApiKey) {
  testing::TempDir dir;
  const std::string alice(24, 'a'), mallory(24, 'm');
  const std::string keys = dir.path() + "/keys.txt";
  std::ofstream(keys) << alice << "\n" << mallory << "\n";
  Cluster c(1, 1, {"--fault", "step_delay_ms=40"}, {"--api-keys-file", keys});
  ASSERT_TRUE(c.ready());
  HeldStreams squatter(OwnConnection(c.router()), mallory);
  for (const char* id : {"report", "req-1", "req-2", "req-3"}) {
    ASSERT_TRUE(squatter.Hold(id).ok()) << id;
  }
  // Mallory's key on another connection: the same namespace, so the id is taken.
  HeldStreams again(OwnConnection(c.router()), mallory);
  EXPECT_EQ(again.Hold("report").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  // Alice, on connections of her own and with ids the router assigns: untouched.
  auto stub = v1::Generation::NewStub(OwnConnection(c.router()));
  std::vector<std::thread> victims;
  std::atomic<int> wrong{0};
  for (int v = 0; v < 8; ++v) {
    victims.emplace_back([&, v] {
      wrong +=
          !GrpcVictim(stub.get(), v % 4, v % 2 == 0 ? "report" + std::to_string(v / 2) : "", alice);
    });
  }
  victims.emplace_back([&] { wrong += !GrpcVictim(stub.get(), 1, "report", alice); });
  for (std::thread& t : victims) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(squatter.Release(), 4);
  EXPECT_TRUE(c.AllBlocksFree());
}

// ---- Row 39: schemas no output can satisfy -------------------------------------------------

// A request for /v1/completions with `extra` fields.
testing::HttpReply Completion(Cluster& c, const std::string& extra, int max_tokens = 40) {
  return testing::Curl(
      c.http(), "/v1/completions",
      absl::StrFormat(R"({"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0, %s})",
                      max_tokens, extra));
}

std::string SchemaFormat(const std::string& schema) {
  return R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )" +
         schema + "}}";
}

// Whether `text` is the one whole value `schema` asks for.
bool Validates(const std::string& schema, const std::string& text) {
  auto compiled = structured::JsonSchema::Compile(schema);
  if (!compiled.ok()) return false;
  structured::JsonMatcher m(**compiled);
  return m.Feed(text) && m.Complete() && nlohmann::json::accept(text);
}

// Schemas satisfiable only by endless nesting, and $ref cycles with no schema in them, are 400
// naming the field (they returned invalid JSON as "stop", and were taken for "any value");
// functions on /v1/completions and stop strings beside a schema are 400 too. Recursion that can
// end still answers, and an output ending as "stop" is one whole valid value; one cut by
// max_tokens or the context ends as "length".
TEST(AttackTest, Row39_UnsatisfiableSchemasAreRefusedAndNoInvalidOutputEndsAsStop) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::string endless = R"({"type": "array", "items": {"$ref": "#"}, "minItems": 1})";
  const struct {
    std::string extra, param, words;
  } refused[] = {
      {SchemaFormat(endless), "response_format", "at /items/$ref: no finite value"},
      {SchemaFormat(R"({"type": "object", "properties": {"next": {"$ref": "#"}},
                        "required": ["next"]})"),
       "response_format", "no finite value"},
      {SchemaFormat(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                        "$ref": "#/$defs/a"})"),
       "response_format", "never reaches a schema"},
      {R"("functions": [{"name": "f", "parameters": {"type": "object"}}])", "functions",
       "not supported"},
      {SchemaFormat(R"({"type": "object"})") + R"(, "stop": ["}"])", "stop", "json_schema"},
  };
  for (const auto& x : refused) {
    const testing::HttpReply r = Completion(c, x.extra);
    EXPECT_EQ(r.status, 400) << x.extra << ": " << r.body;
    EXPECT_EQ(r.Json()["error"]["param"], x.param) << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, x.words)) << r.body;
  }
  v1::GenerateRequest g = Greedy("Once upon a time", 40);
  g.set_ignore_eos(false);
  g.mutable_sampling()->set_json_schema(endless);
  Streamed s = testing::Generate(c.generation(), g);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.status.error_message(), "sampling.json_schema: at /items/$ref"))
      << s.status.error_message();

  // Recursion that can end: "stop" only with a whole valid value.
  for (const std::string schema :
       {R"({"type": "array", "items": {"$ref": "#"}})",
        R"({"$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
            "required": ["value", "next"]}}, "$ref": "#/$defs/Node"})"}) {
    const testing::HttpReply r = Completion(c, SchemaFormat(schema), 300);
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string text = r.Json()["choices"][0]["text"];
    const std::string finish = r.Json()["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "length" || Validates(schema, text)) << finish << ": " << text;
    g.mutable_sampling()->set_json_schema(schema);
    g.set_max_tokens(300);
    s = testing::Generate(c.generation(), g);
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_TRUE(s.finish != v1::FINISH_REASON_STOP || Validates(schema, s.text)) << s.text;
  }
  // Cut mid-value by max_tokens, and by the end of the context: "length", never "stop".
  const std::string long_array =
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 60})";
  const testing::HttpReply cut = Completion(c, SchemaFormat(long_array), 6);
  ASSERT_EQ(cut.status, 200) << cut.body;
  EXPECT_EQ(cut.Json()["choices"][0]["finish_reason"], "length");
  g.mutable_sampling()->set_json_schema(long_array);
  g.set_max_tokens(6);
  EXPECT_EQ(testing::Generate(c.generation(), g).finish, v1::FINISH_REASON_LENGTH);
  grpc::ClientContext ictx;
  v1::ModelInfo info;
  ASSERT_TRUE(c.generation()->GetModelInfo(&ictx, {}, &info).ok());
  v1::GenerateRequest near_end = g;
  near_end.mutable_tokens()->add_ids(info.bos_token_id());
  for (int i = 0; i < info.max_context() - 8; ++i) near_end.mutable_tokens()->add_ids(403);
  near_end.set_max_tokens(100);
  s = testing::Generate(c.generation(), near_end);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.finish, v1::FINISH_REASON_CONTEXT);
  EXPECT_FALSE(Validates(long_array, s.text)) << s.text;

  EXPECT_EQ(WrongOutputs(c, 1), 0);
  EXPECT_TRUE(c.AllBlocksFree());
}

}  // namespace
}  // namespace tandem
