#include "router/router_services.h"

#include <string>
#include <string_view>

#include "router/router.h"
#include "rpc/internal_auth.h"

namespace tandem {
namespace {

// The public API; every call passes the API keys first. Generate is on gRPC's callback API (a
// stream holds no thread); the short unary calls are served by the synchronous pool.
class GenerationAdaptor final
    : public v1::Generation::WithCallbackMethod_Generate<v1::Generation::Service> {
 public:
  explicit GenerationAdaptor(Router* r) : r_(r) {}
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req) override {
    return r_->Generate(ctx, req, Auth(ctx, /*generation=*/true));
  }
  grpc::Status Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                     v1::ScoreResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Score(ctx, req, resp);
  }
  grpc::Status Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                        v1::TokenizeResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Tokenize(req, resp);
  }
  grpc::Status Detokenize(grpc::ServerContext* ctx, const v1::DetokenizeRequest* req,
                          v1::DetokenizeResponse* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->Detokenize(req, resp);
  }
  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* resp) override {
    if (grpc::Status s = Auth(ctx, /*generation=*/false); !s.ok()) return s;
    return r_->GetModelInfo(resp);
  }

 private:
  grpc::Status Auth(grpc::ServerContextBase* ctx, bool generation) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string_view value = it == md.end()
                                       ? std::string_view()
                                       : std::string_view(it->second.data(), it->second.size());
    return r_->Authorize(value, generation);
  }
  Router* r_;
};

// The registry on the internal port: every call proves the cluster's credentials first.
class RegistryAdaptor final : public v1::Registry::Service {
 public:
  RegistryAdaptor(Router* r, InternalAuth* auth) : r_(r), auth_(auth) {}
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    std::string identity;
    const RoleSet allowed = req->role() == v1::WORKER_ROLE_PREFILL ? RoleSet(PeerRole::kPrefill)
                            : req->role() == v1::WORKER_ROLE_DECODE
                                ? RoleSet(PeerRole::kDecode)
                                : PeerRole::kPrefill | PeerRole::kDecode;
    if (grpc::Status s = Check(ctx, internal_method::kRegister, allowed, req, &identity); !s.ok()) {
      return s;
    }
    return r_->Register(req, identity, resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::string identity;
    if (grpc::Status s = Check(ctx, internal_method::kHeartbeat,
                               PeerRole::kPrefill | PeerRole::kDecode, req, &identity);
        !s.ok()) {
      return s;
    }
    return r_->Heartbeat(req, identity, resp);
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override {
    if (grpc::Status s =
            Check(ctx, internal_method::kListWorkers,
                  PeerRole::kRouter | PeerRole::kPrefill | PeerRole::kDecode, req, nullptr);
        !s.ok()) {
      return s;
    }
    return r_->ListWorkers(resp);
  }

 private:
  grpc::Status Check(grpc::ServerContext* ctx, const char* method, RoleSet allowed,
                     const google::protobuf::MessageLite* request, std::string* identity) {
    if (auth_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the router has no cluster credentials");
    }
    return auth_->Check(ctx, method, allowed, request, identity);
  }
  Router* r_;
  InternalAuth* auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeGenerationService(Router* router) {
  return std::make_unique<GenerationAdaptor>(router);
}

std::unique_ptr<grpc::Service> MakeRegistryService(Router* router, InternalAuth* auth) {
  return std::make_unique<RegistryAdaptor>(router, auth);
}

}  // namespace tandem
