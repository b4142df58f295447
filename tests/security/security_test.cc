// TLS, mutual TLS, API keys and message size limits with real processes on loopback. A
// throwaway CA and certificates (SAN IP:127.0.0.1, DNS:localhost) are made with the openssl
// CLI in a temporary directory. Every test ends with the leak check: all KV blocks free.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "kv_transfer/kv_auth.h"
#include "rpc/tls.h"
#include "security/secure_socket.h"
#include "tests/serving/cluster.h"
#include "tools/remote.h"

namespace tandem {
namespace {

using testing::Cluster;
using testing::ClusterSecurity;
using testing::Streamed;

// Runs `command` through the shell; returns its exit status and its stdout and stderr.
std::pair<int, std::string> RunShell(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A CA, a certificate it signed for 127.0.0.1 naming every cluster role (used by every process,
// as server and client), a certificate without a role (a client of the public API), and a
// second CA with a role certificate of its own (a stranger's, for the refusals).
class Pki {
 public:
  Pki() {
    const std::string d = dir_.path();
    std::ofstream(d + "/ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost,"
                                     "URI:urn:tandem:role:router,URI:urn:tandem:role:prefill,"
                                     "URI:urn:tandem:role:decode\n"
                                     "extendedKeyUsage=serverAuth,clientAuth\n";
    std::ofstream(d + "/client.cnf") << "subjectAltName=DNS:client.example\n"
                                        "extendedKeyUsage=clientAuth\n";
    ok_ = MakeCa("ca") && MakeLeaf("node", "ca") && MakeLeaf("client", "ca", "client.cnf") &&
          MakeCa("rogue_ca") && MakeLeaf("rogue", "rogue_ca");
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }
  std::string ca() const { return Path("ca.pem"); }
  std::string cert() const { return Path("node.pem"); }
  std::string key() const { return Path("node.key"); }

  // Server flags: TLS, or mutual TLS.
  std::vector<std::string> TlsFlags() const { return {"--tls-cert", cert(), "--tls-key", key()}; }
  std::vector<std::string> MtlsFlags() const {
    return {"--tls-cert", cert(), "--tls-key", key(), "--tls-ca", ca()};
  }

 private:
  bool Sh(const std::string& cmd) {
    auto [rc, out] = RunShell("cd " + dir_.path() + " && " + cmd);
    if (rc != 0) error_ += cmd + ": " + out + "\n";
    return rc == 0;
  }
  bool MakeCa(const std::string& name) {
    return Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
              name + ".key -out " + name + ".pem -days 2 -subj '/CN=Tandem test " + name + "'");
  }
  bool MakeLeaf(const std::string& name, const std::string& ca,
                const std::string& ext = "ext.cnf") {
    return Sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
              name + ".key -out " + name + ".csr -subj /CN=" + name) &&
           Sh("openssl x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca +
              ".key -CAcreateserial -out " + name + ".pem -days 2 -extfile " + ext);
  }

  testing::TempDir dir_;
  bool ok_ = false;
  std::string error_;
};

std::shared_ptr<grpc::ChannelCredentials> Client(const TlsFlags& flags) {
  auto c = ClientChannelCredentials(flags);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

v1::GenerateRequest Greedy(int max_tokens = 24) {
  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

// One Generate call on a fresh channel with `credentials` and, when given, an API key.
Streamed GenerateWith(const std::string& router,
                      std::shared_ptr<grpc::ChannelCredentials> credentials,
                      const v1::GenerateRequest& req, const std::string& api_key = "") {
  auto channel = grpc::CreateChannel(router, credentials);
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  AddApiKey(api_key, &ctx);
  auto reader = stub->Generate(&ctx, req);
  Streamed out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    ++out.messages;
    out.tokens.insert(out.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    if (resp.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.finish = resp.finish_reason();
  }
  out.status = reader->Finish();
  return out;
}

// Sets an environment variable for the processes started while this lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(pki_.ok()) << pki_.error(); }
  Pki pki_;
};

// A TLS cluster gives the greedy tokens of a plaintext one; a plaintext client, or one that
// does not trust the server's CA, cannot connect.
TEST_F(SecurityTest, TlsClusterMatchesPlaintextAndRefusesPlaintextClients) {
  std::vector<int> plain_tokens;
  {
    Cluster plain(1, 1);
    ASSERT_TRUE(plain.ready());
    Streamed s = testing::Generate(plain.generation(), Greedy());
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    plain_tokens = s.tokens;
    EXPECT_TRUE(plain.AllBlocksFree());
  }
  ASSERT_EQ(plain_tokens.size(), 24u);

  // TLS without a CA flag: the processes' own calls to each other verify against gRPC's
  // default roots, pointed at the test CA here.
  ScopedEnv roots("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", pki_.ca());
  ClusterSecurity sec;
  sec.all_flags = pki_.TlsFlags();
  sec.credentials = Client(TlsFlags{"", "", pki_.ca()});
  Cluster tls(1, 1, {}, sec);
  ASSERT_TRUE(tls.ready());
  Streamed s = testing::Generate(tls.generation(), Greedy());
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens, plain_tokens);

  Streamed plaintext = GenerateWith(tls.router(), grpc::InsecureChannelCredentials(), Greedy());
  EXPECT_EQ(plaintext.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << plaintext.status.error_message();
  EXPECT_TRUE(plaintext.tokens.empty());
  Streamed untrusted =
      GenerateWith(tls.router(), Client(TlsFlags{"", "", pki_.Path("rogue_ca.pem")}), Greedy());
  EXPECT_EQ(untrusted.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << untrusted.status.error_message();

  // The CLI's client path (tandem generate --router --tls-ca).
  RemoteGenerateRequest r;
  r.router = tls.router();
  r.prompt = "Once upon a time";
  r.max_tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.security.tls.ca = pki_.ca();
  auto remote = RemoteGenerate(r, nullptr);
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->tokens, plain_tokens);
  r.security.tls = {};
  EXPECT_EQ(RemoteGenerate(r, nullptr).status().code(), absl::StatusCode::kUnavailable);

  // The OpenAI-compatible HTTP port serves HTTPS with the same certificate: a client trusting
  // the CA gets the greedy tokens; plain HTTP and an untrusting client get nothing.
  const std::string body =
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":24,"temperature":0,)"
      R"("ignore_eos":true})";
  auto [https_rc, https_out] =
      RunShell("curl -sS --max-time 20 --cacert " + pki_.ca() + " https://" + tls.http() +
               "/v1/completions -H 'Content-Type: application/json' -d '" + body + "'");
  EXPECT_EQ(https_rc, 0) << https_out;
  EXPECT_NE(https_out.find("\"text\""), std::string::npos) << https_out;
  auto [plain_rc, plain_out] = RunShell("curl -sS --max-time 5 http://" + tls.http() + "/health");
  EXPECT_TRUE(plain_rc != 0 || plain_out.find("\"ok\"") == std::string::npos) << plain_out;
  auto [rogue_rc, rogue_out] =
      RunShell("curl -sS --max-time 5 --cacert " + pki_.Path("rogue_ca.pem") + " https://" +
               tls.http() + "/health");
  EXPECT_NE(rogue_rc, 0) << rogue_out;

  EXPECT_TRUE(tls.AllBlocksFree());
}

// Mutual TLS on every port: the cluster works end to end with certificates; a client without
// one is refused at the handshake (gRPC reports UNAVAILABLE), and so is a worker, which never
// gets into the router's registry.
TEST_F(SecurityTest, MutualTlsRefusesPeersWithoutAClientCertificate) {
  ClusterSecurity sec;
  sec.all_flags = pki_.MtlsFlags();
  sec.credentials = Client({.cert = pki_.cert(), .key = pki_.key(), .ca = pki_.ca()});
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());
  Streamed ok = testing::Generate(c.generation(), Greedy());
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 24u);
  // HTTPS under mutual TLS: a client certificate the CA signed is required there too.
  const std::string https =
      "curl -sS --max-time 10 --cacert " + pki_.ca() + " https://" + c.http() + "/health";
  auto [with_rc, with_out] = RunShell(https + " --cert " + pki_.cert() + " --key " + pki_.key());
  EXPECT_EQ(with_rc, 0) << with_out;
  EXPECT_NE(with_out.find("\"ok\""), std::string::npos) << with_out;
  auto [without_rc, without_out] = RunShell(https);
  EXPECT_TRUE(without_rc != 0 || without_out.find("\"ok\"") == std::string::npos) << without_out;

  Streamed no_cert = GenerateWith(c.router(), Client(TlsFlags{"", "", pki_.ca()}), Greedy());
  EXPECT_EQ(no_cert.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << no_cert.status.error_message();
  EXPECT_TRUE(no_cert.tokens.empty());
  Streamed plaintext = GenerateWith(c.router(), grpc::InsecureChannelCredentials(), Greedy());
  EXPECT_EQ(plaintext.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  Streamed stranger = GenerateWith(
      c.router(),
      Client({.cert = pki_.Path("rogue.pem"), .key = pki_.Path("rogue.key"), .ca = pki_.ca()}),
      Greedy());
  EXPECT_EQ(stranger.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  // Workers that try to register: plaintext; TLS trusting the router but with no client
  // certificate; a certificate from another CA. And one with the right certificate, so the
  // wait below is known to be long enough for a registration to happen.
  ScopedEnv roots("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", pki_.ca());
  const std::vector<std::string> base = {"--role=decode",
                                         "--router",
                                         c.router_internal(),
                                         "--model",
                                         testing::Stories260K(),
                                         "--tokenizer",
                                         testing::Tok512(),
                                         "--cluster-secret-file",
                                         testing::TestClusterSecretFile()};
  const std::vector<std::pair<std::string, std::vector<std::string>>> workers = {
      {"rogue-plaintext", {}},
      {"rogue-no-client-cert", pki_.TlsFlags()},
      {"rogue-other-ca",
       {"--tls-cert", pki_.Path("rogue.pem"), "--tls-key", pki_.Path("rogue.key"), "--tls-ca",
        pki_.ca()}},
      {"good-extra", pki_.MtlsFlags()},
  };
  for (const auto& [id, flags] : workers) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), {"--worker-id", id});
    argv.insert(argv.end(), flags.begin(), flags.end());
    const ServerProcess p = StartServerProcess(testing::BinDir() + "/tandem-server", argv);
    if (p.pid > 0) c.pids().push_back(p.pid);
    ASSERT_FALSE(p.address.empty()) << id << " did not start";
  }
  auto listed = [&] {
    std::set<std::string> ids;
    const v1::ListWorkersResponse resp = c.Workers();
    for (const auto& w : resp.workers()) ids.insert(w.worker_id());
    return ids;
  };
  bool good_listed = false;
  for (int i = 0; i < 200 && !good_listed; ++i) {
    good_listed = listed().count("good-extra") > 0;
    if (!good_listed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(good_listed);
  // The refused workers started with it and tried then; gRPC reconnects after a back-off of
  // about a second, so one more second covers another try each.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::set<std::string> ids = listed();
  EXPECT_EQ(ids.size(), 3u);
  for (const std::string& id : ids) EXPECT_FALSE(absl::StartsWith(id, "rogue")) << id;

  EXPECT_TRUE(c.AllBlocksFree());
}

// Under mutual TLS the internal surfaces need a certificate naming a role that may make the
// call: a certificate the cluster's CA signed for a client of the public API (no role) reaches
// Generation but neither the registry nor a decode worker's KV port, even with the secret; a
// router certificate cannot open a KV connection (only prefill workers send KV).
TEST_F(SecurityTest, MutualTlsRolesGuardTheInternalSurfaces) {
  ClusterSecurity sec;
  sec.all_flags = pki_.MtlsFlags();
  sec.credentials = Client({.cert = pki_.cert(), .key = pki_.key(), .ca = pki_.ca()});
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());
  const TlsFlags client_flags{pki_.Path("client.pem"), pki_.Path("client.key"), pki_.ca()};
  Streamed public_api = GenerateWith(c.router(), Client(client_flags), Greedy());
  ASSERT_TRUE(public_api.status.ok()) << public_api.status.error_message();

  auto registry =
      v1::Registry::NewStub(grpc::CreateChannel(c.router_internal(), Client(client_flags)));
  v1::RegisterRequest fake;
  fake.set_worker_id("client-cert-worker");
  fake.set_role(v1::WORKER_ROLE_DECODE);
  fake.set_address("127.0.0.1:9");
  v1::RegisterResponse rr;
  grpc::ClientContext ctx;
  testing::ProveCluster(&ctx, internal_method::kRegister, c.router_internal(), fake,
                        PeerRole::kDecode);
  const grpc::Status refused = registry->Register(&ctx, fake, &rr);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "names no role"))
      << refused.error_message();
  EXPECT_EQ(c.Workers().workers_size(), 2);

  // KV over TLS: the role certificates decide who may connect.
  std::string kv;
  const v1::ListWorkersResponse workers = c.Workers();
  for (const auto& w : workers.workers()) {
    if (w.role() == v1::WORKER_ROLE_DECODE) kv = w.kv_endpoint();
  }
  ASSERT_TRUE(absl::StartsWith(kv, "tcp://")) << kv;
  auto connect = [&](const TlsFlags& flags) {
    auto tls = LoadClientTls(flags);
    EXPECT_TRUE(tls.ok()) << tls.status();
    auto auth = MakeKvAuth(testing::TestClusterSecret(), *tls, /*receiver=*/false);
    EXPECT_TRUE(auth.ok()) << auth.status();
    const std::string hp = kv.substr(6);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(hp.substr(hp.rfind(':') + 1))));
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      ::close(fd);
      return absl::Status(absl::UnavailableError("connect"));
    }
    SecureSocket sock(fd, auth->tls, /*server=*/false);
    std::atomic<bool> stop{false};
    return AuthenticateKvConnection(sock, *auth, /*receiver=*/false, stop,
                                    absl::Now() + absl::Seconds(5))
        .status();
  };
  EXPECT_TRUE(connect({pki_.cert(), pki_.key(), pki_.ca()}).ok());
  EXPECT_FALSE(connect(client_flags).ok());
  EXPECT_FALSE(
      connect({pki_.Path("rogue.pem"), pki_.Path("rogue.key"), pki_.ca()}).ok());  // other CA
  EXPECT_TRUE(c.AllBlocksFree());
}

// API keys on the public API: none or a wrong one is UNAUTHENTICATED naming the header; the
// right one works, from the CLI's client too (flag or $TANDEM_API_KEY).
// tandem-health, the container probe, speaks grpc.health.v1 in plaintext and with the cluster's
// TLS files: SERVING is exit 0; unreachable, refused at the handshake or bad flags are not.
TEST_F(SecurityTest, HealthProbeSpeaksTheClustersTls) {
  const std::string probe = testing::BinDir() + "/tandem-health --timeout-ms 5000 --address ";
  {
    Cluster plain(1, 1);
    ASSERT_TRUE(plain.ready());
    auto [rc, out] = RunShell(probe + plain.router());
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  }
  EXPECT_EQ(RunShell(probe + "127.0.0.1:1 --timeout-ms 500").first, 1);
  EXPECT_EQ(RunShell(probe + "127.0.0.1:1 --colour red").first, 2);
  EXPECT_EQ(RunShell(probe + "127.0.0.1:1 --tls-cert " + pki_.cert()).first, 2);  // no key

  ClusterSecurity sec;
  sec.all_flags = pki_.MtlsFlags();
  sec.credentials = Client({.cert = pki_.cert(), .key = pki_.key(), .ca = pki_.ca()});
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());
  EXPECT_EQ(RunShell(probe + c.router()).first, 1);                             // plaintext
  EXPECT_EQ(RunShell(probe + c.router() + " --tls-ca " + pki_.ca()).first, 1);  // no client cert
  auto [rc, out] = RunShell(probe + c.router() + " --tls-ca " + pki_.ca() + " --tls-cert " +
                            pki_.cert() + " --tls-key " + pki_.key());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
}

TEST_F(SecurityTest, ApiKeysAreRequired) {
  const std::string key = "tandem-test-key-0123456789abcdef";
  const std::string keys_file = pki_.Path("keys.txt");
  std::ofstream(keys_file) << "# test keys\n" << key << "\n";
  ClusterSecurity sec;
  sec.router_flags = {"--api-keys-file", keys_file};
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());
  const auto plain = grpc::InsecureChannelCredentials();

  Streamed missing = GenerateWith(c.router(), plain, Greedy());
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(missing.status.error_message(), "authorization"))
      << missing.status.error_message();
  Streamed wrong = GenerateWith(c.router(), plain, Greedy(), "tandem-test-key-wrong-0000000000");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(wrong.status.error_message(), "authorization"))
      << wrong.status.error_message();
  Streamed right = GenerateWith(c.router(), plain, Greedy(), key);
  ASSERT_TRUE(right.status.ok()) << right.status.error_message();
  EXPECT_EQ(right.tokens.size(), 24u);

  RemoteGenerateRequest r;
  r.router = c.router();
  r.prompt = "Once upon a time";
  r.max_tokens = 8;
  r.sampling.temperature = 0;
  EXPECT_EQ(RemoteGenerate(r, nullptr).status().code(), absl::StatusCode::kUnauthenticated);
  r.security.api_key = key;
  EXPECT_TRUE(RemoteGenerate(r, nullptr).ok());
  {
    ScopedEnv env("TANDEM_API_KEY", key);
    EXPECT_EQ(ApiKeyFromFlagOrEnv(""), key);
    EXPECT_EQ(ApiKeyFromFlagOrEnv("from-flag"), "from-flag");
  }
  EXPECT_EQ(ApiKeyFromFlagOrEnv(""), "");

  EXPECT_TRUE(c.AllBlocksFree());
}

// Keys and mutual TLS together: each is needed.
TEST_F(SecurityTest, ApiKeysWithMutualTls) {
  const std::string key = "tandem-test-key-fedcba9876543210";
  const std::string keys_file = pki_.Path("keys.txt");
  std::ofstream(keys_file) << key << "\n";
  ClusterSecurity sec;
  sec.all_flags = pki_.MtlsFlags();
  sec.router_flags = {"--api-keys-file", keys_file};
  sec.credentials = Client({.cert = pki_.cert(), .key = pki_.key(), .ca = pki_.ca()});
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());

  RemoteGenerateRequest r;
  r.router = c.router();
  r.prompt = "Once upon a time";
  r.max_tokens = 16;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.security.tls = {.cert = pki_.cert(), .key = pki_.key(), .ca = pki_.ca()};
  EXPECT_EQ(RemoteGenerate(r, nullptr).status().code(), absl::StatusCode::kUnauthenticated);
  r.security.api_key = key;
  auto ok = RemoteGenerate(r, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tokens.size(), 16u);
  r.security.tls = TlsFlags{"", "", pki_.ca()};  // the key without a client certificate
  EXPECT_EQ(RemoteGenerate(r, nullptr).status().code(), absl::StatusCode::kUnavailable);

  EXPECT_TRUE(c.AllBlocksFree());
}

// A request over the router's receive limit is RESOURCE_EXHAUSTED and the router keeps serving.
TEST_F(SecurityTest, OversizedRequestIsResourceExhausted) {
  ClusterSecurity sec;
  sec.router_flags = {"--max-message-bytes", "4096"};
  Cluster c(1, 1, {}, sec);
  ASSERT_TRUE(c.ready());
  v1::GenerateRequest big = Greedy();
  big.set_text(std::string(8000, 'a'));
  Streamed s = testing::Generate(c.generation(), big);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.status.error_message();
  EXPECT_TRUE(s.tokens.empty());
  for (int i = 0; i < 3; ++i) {
    Streamed ok = testing::Generate(c.generation(), Greedy());
    ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
    EXPECT_EQ(ok.tokens.size(), 24u);
  }
  EXPECT_TRUE(c.AllBlocksFree());
}

// Bad flags stop the server before it serves, with a message naming the flag.
TEST_F(SecurityTest, BadFlagsAreNamed) {
  const std::string server = testing::BinDir() + "/tandem-server --role=router --model " +
                             testing::Stories260K() + " --tokenizer " + testing::Tok512();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --tls-cert " + pki_.cert(), "--tls-key is required with --tls-cert"},
      {" --tls-key " + pki_.key(), "--tls-cert is required with --tls-key"},
      {" --tls-ca " + pki_.ca(), "--tls-ca needs --tls-cert and --tls-key"},
      {" --tls-cert " + pki_.Path("missing.pem") + " --tls-key " + pki_.key(),
       "--tls-cert: cannot read"},
      {" --tls-cert " + pki_.key() + " --tls-key " + pki_.key(), "--tls-cert: "},
      {" --tls-cert " + pki_.cert() + " --tls-key " + pki_.cert(), "--tls-key: "},
      {" --tls-cert " + pki_.cert() + " --tls-key " + pki_.key() + " --tls-ca " + pki_.key(),
       "--tls-ca: "},
      {" --tls-cert " + pki_.cert() + " --tls-key " + pki_.Path("rogue.key"),
       "--tls-key: " + pki_.Path("rogue.key") + " is not the private key of the certificate"},
      {" --max-message-bytes 10", "--max-message-bytes"},
      {" --max-message-bytes lots", "--max-message-bytes"},
      {" --http-max-buffered-bytes 1000", "--http-max-buffered-bytes must be in [16842752, "},
      // Internal surfaces are never open: a secret or role certificates are required.
      {"", "--cluster-secret-file is required"},
      {" --cluster-secret-file " + pki_.Path("missing.secret"),
       "--cluster-secret-file: cannot read"},
      {" --cluster-secret-file " + pki_.Path("short.secret"), "at least 32"},
      {" --tls-cert " + pki_.Path("client.pem") + " --tls-key " + pki_.Path("client.key") +
           " --tls-ca " + pki_.ca(),
       "must name this process's role router"},
  };
  std::ofstream(pki_.Path("short.secret")) << "too-short\n";
  for (const auto& [flags, message] : cases) {
    auto [rc, out] = RunShell(server + flags);
    EXPECT_EQ(rc, 2) << flags << ": " << out;
    EXPECT_TRUE(absl::StrContains(out, message)) << flags << ": " << out;
  }
}

}  // namespace
}  // namespace tandem
