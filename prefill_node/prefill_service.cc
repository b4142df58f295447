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
  // Without a client deadline, the transfer still may not hang forever (the router's calls
  // carry the request's deadline, and compute_timeout_ms bounds the compute itself).
  const absl::Time deadline = std::min(absl::Now() + absl::Minutes(10), DeadlineOf(ctx));
  auto r = engine_->Prefill(
      next_id_++, {req->prompt_ids().begin(), req->prompt_ids().end()}, FromProto(req->sampling()),
      FromProto(req->kv_target()), deadline, [ctx] { return ctx->IsCancelled(); },
      req->output_tokens(),
      req->compute_timeout_ms() > 0 ? absl::Milliseconds(req->compute_timeout_ms())
                                    : absl::InfiniteDuration());
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
  auto scored = engine_->Score(ids, req->top_logprobs(), DeadlineOf(ctx),
                               [ctx] { return ctx->IsCancelled(); });
  if (!scored.ok()) return ToGrpc(scored.status());
  for (const ScoredToken& t : *scored) {
    resp->add_logprobs(t.logprob);
    resp->add_ranks(t.rank);
    if (req->top_logprobs() > 0) {
      v1::TokenLogprobs* top = resp->add_top_logprobs();
      top->set_logprob(t.logprob);
      for (const auto& [id, logprob] : t.top) {
        v1::TopLogprob* x = top->add_top();
        x->set_token_id(id);
        x->set_logprob(logprob);
      }
    }
  }
  return grpc::Status::OK;
}

}  // namespace tandem
