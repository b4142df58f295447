// The cluster secret's proofs on internal gRPC calls (rpc/internal_auth.h), against registries
// in process: a proof works once, at the instance it names, for the message it was made for;
// callers learn a server's instance from its refusal and try once more.
#include "rpc/internal_auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

// A registry that checks every Register with `auth` (as the router does) and counts what it let
// through.
class CheckingRegistry final : public v1::Registry::Service {
 public:
  explicit CheckingRegistry(InternalAuth* auth) : auth_(auth) {}
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse*) override {
    grpc::Status s = auth_->Check(ctx, internal_method::kRegister, PeerRole::kDecode, req);
    if (s.ok()) ++accepted;
    return s;
  }
  std::atomic<int> accepted{0};

 private:
  InternalAuth* auth_;
};

class Server {
 public:
  explicit Server(const ClusterSecret& secret) : auth(secret, false), registry(&auth) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&registry);
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
    stub = v1::Registry::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  ~Server() { server->Shutdown(); }

  grpc::Status Send(const std::string& proof, const v1::RegisterRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!proof.empty()) ctx.AddMetadata(kClusterAuthMetadata, proof);
    v1::RegisterResponse resp;
    return stub->Register(&ctx, req, &resp);
  }

  InternalAuth auth;
  CheckingRegistry registry;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::unique_ptr<v1::Registry::Stub> stub;
};

v1::RegisterRequest Req(const std::string& id) {
  v1::RegisterRequest r;
  r.set_worker_id(id);
  r.set_role(v1::WORKER_ROLE_DECODE);
  r.set_address("127.0.0.1:9");
  return r;
}

TEST(InternalAuthTest, InstanceIdsAreRandomHex) {
  const ClusterSecret secret = ClusterSecret::Generate();
  InternalAuth a(secret, false), b(secret, false);
  EXPECT_EQ(a.instance_id().size(), 32u);
  EXPECT_NE(a.instance_id(), b.instance_id());
}

TEST(InternalAuthTest, AProofWorksOnceAtTheInstanceAndForTheMessageItNames) {
  const ClusterSecret secret = ClusterSecret::Generate();
  Server one(secret), two(secret);
  InternalAuth client(secret, false);
  const v1::RegisterRequest req = Req("w");
  const std::string proof =
      client.Proof(internal_method::kRegister, PeerRole::kDecode, one.auth.instance_id(), req);
  // At another process of the same cluster: it names someone else.
  grpc::Status s = two.Send(proof, req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("not this process"), std::string::npos) << s.error_message();
  // Under another message.
  s = one.Send(proof, Req("other"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("another message"), std::string::npos) << s.error_message();
  // The call it was made for: once.
  EXPECT_TRUE(one.Send(proof, req).ok());
  s = one.Send(proof, req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("replayed"), std::string::npos) << s.error_message();
  // For another method, another role, or under another secret.
  EXPECT_EQ(one.Send(client.Proof(internal_method::kHeartbeat, PeerRole::kDecode,
                                  one.auth.instance_id(), req),
                     req)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(one.Send(client.Proof(internal_method::kRegister, PeerRole::kRouter,
                                  one.auth.instance_id(), req),
                     req)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  InternalAuth stranger(ClusterSecret::Generate(), false);
  EXPECT_EQ(one.Send(stranger.Proof(internal_method::kRegister, PeerRole::kDecode,
                                    one.auth.instance_id(), req),
                     req)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Malformed, of the old version, or none.
  for (const std::string bad : {std::string("v2.decode"), std::string("v1.decode.1.2.3"),
                                proof.substr(0, proof.size() - 2), std::string()}) {
    s = one.Send(bad, req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << bad;
  }
  EXPECT_EQ(one.registry.accepted.load(), 1);
  EXPECT_EQ(two.registry.accepted.load(), 0);
}

TEST(InternalAuthTest, CallLearnsTheInstanceFromTheRefusalAndAfterARestart) {
  const ClusterSecret secret = ClusterSecret::Generate();
  InternalAuth client(secret, false);
  const v1::RegisterRequest req = Req("w");
  auto call = [&](Server& server, int* attempts) {
    *attempts = 0;
    return client.Call(server.address, internal_method::kRegister, PeerRole::kDecode, req, nullptr,
                       [&](grpc::ClientContext* ctx) {
                         ++*attempts;
                         v1::RegisterResponse resp;
                         return server.stub->Register(ctx, req, &resp);
                       });
  };
  int attempts = 0;
  std::string address;
  {
    Server server(secret);
    address = server.address;
    EXPECT_TRUE(call(server, &attempts).ok());
    EXPECT_EQ(attempts, 2) << "the first call named no instance";
    EXPECT_EQ(client.AudienceAt(server.address), server.auth.instance_id());
    EXPECT_TRUE(call(server, &attempts).ok());
    EXPECT_EQ(attempts, 1);
  }
  // Another process at a known address (a restart): one refusal, then through.
  Server restarted(secret);
  client.SetAudience(restarted.address, InternalAuth(secret, false).instance_id());
  EXPECT_TRUE(call(restarted, &attempts).ok());
  EXPECT_EQ(attempts, 2);
  // A client of another cluster learns the instance too, and is refused again: no loop.
  InternalAuth stranger(ClusterSecret::Generate(), false);
  attempts = 0;
  const grpc::Status s =
      stranger.Call(restarted.address, internal_method::kRegister, PeerRole::kDecode, req, nullptr,
                    [&](grpc::ClientContext* ctx) {
                      ++attempts;
                      v1::RegisterResponse resp;
                      return restarted.stub->Register(ctx, req, &resp);
                    });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(attempts, 2);
}

// Two calls to a new server at once (a colocated process's prefill and decode workers registering
// with its router): the one that learns the instance second is still made again, and passes.
TEST(InternalAuthTest, CallRetriesWhenAnotherCallLearnedTheInstanceMeanwhile) {
  const ClusterSecret secret = ClusterSecret::Generate();
  InternalAuth client(secret, false);
  Server server(secret);
  const v1::RegisterRequest req = Req("w");
  int attempts = 0;
  const grpc::Status s =
      client.Call(server.address, internal_method::kRegister, PeerRole::kDecode, req, nullptr,
                  [&](grpc::ClientContext* ctx) {
                    // This attempt's proof names no instance; the other call learns it now.
                    if (++attempts == 1)
                      client.SetAudience(server.address, server.auth.instance_id());
                    v1::RegisterResponse resp;
                    return server.stub->Register(ctx, req, &resp);
                  });
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(attempts, 2);
}

TEST(InternalAuthTest, MessageDigestIsDeterministicAndSeesEveryField) {
  v1::RegisterRequest a = Req("w");
  v1::RegisterRequest b = Req("w");
  EXPECT_EQ(MessageDigest(a), MessageDigest(b));
  EXPECT_EQ(MessageDigest(a).size(), 32u);
  b.mutable_load()->set_free_kv_blocks(1);
  EXPECT_NE(MessageDigest(a), MessageDigest(b));
}

TEST(HmacSha256Test, MatchesRfc4231AndTheSecretsMac) {
  // RFC 4231, test case 2.
  HmacSha256 mac("Jefe");
  mac.Update("what do ya want ");
  mac.Update("for nothing?");
  EXPECT_EQ(HexEncode(mac.Final()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  mac.Reset();
  mac.Update("what do ya want for nothing?");
  EXPECT_EQ(HexEncode(mac.Final()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const ClusterSecret secret = ClusterSecret::Generate();
  HmacSha256 same(secret.text());
  same.Update(std::string("label") + '\0' + "message");
  EXPECT_EQ(same.Final(), secret.Mac("label", "message"));
  EXPECT_EQ(HexEncode(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace tandem
