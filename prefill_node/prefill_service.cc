#include "prefill_node/prefill_service.h"

#include "rpc/grpc_util.h"

namespace tandem {

grpc::Status PrefillService::Prefill(grpc::ServerContext* ctx, const v1::PrefillRequest* req,
                                     v1::PrefillResponse* resp) {
  if (grpc::Status s = auth_->Check(ctx, internal_method::kPrefill, PeerRole::kRouter, req);
      !s.ok()) {
    return s;
  }
  if (!req->has_kv_target() || req->kv_target().endpoint().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "kv_target: required");
  }
  // Without a client deadline, the transfer still may not hang forever.
  absl::Time deadline = absl::Now() + absl::Minutes(10);
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(ctx->deadline()));
  }
  auto r = engine_->Prefill(
      next_id_++, {req->prompt_ids().begin(), req->prompt_ids().end()}, FromProto(req->sampling()),
      FromProto(req->kv_target()), deadline, [ctx] { return ctx->IsCancelled(); },
      req->output_tokens());
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_first_token(r->first_token);
  resp->set_cached_tokens(r->cached_tokens);
  resp->set_queue_seconds(r->queue_seconds);
  resp->set_compute_seconds(r->compute_seconds);
  resp->set_kv_transfer_seconds(r->transfer_seconds);
  if (r->first_logprobs) *resp->mutable_first_logprobs() = ToProto(*r->first_logprobs);
  return grpc::Status::OK;
}

grpc::Status PrefillService::Score(grpc::ServerContext* ctx, const v1::PrefillScoreRequest* req,
                                   v1::PrefillScoreResponse* resp) {
  if (grpc::Status s = auth_->Check(ctx, internal_method::kPrefillScore, PeerRole::kRouter, req);
      !s.ok()) {
    return s;
  }
  std::vector<int> ids(req->token_ids().begin(), req->token_ids().end());
  auto lp = engine_->Score(ids);
  if (!lp.ok()) return ToGrpc(lp.status());
  resp->mutable_logprobs()->Add(lp->begin(), lp->end());
  return grpc::Status::OK;
}

}  // namespace tandem
