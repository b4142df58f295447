#include "decode_node/decode_service.h"

#include "rpc/grpc_util.h"

namespace tandem {

grpc::Status DecodeService::Decode(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::DecodeServerMessage, v1::DecodeClientMessage>* stream) {
  // The proof is checked twice: before the first message is read (who may call), and against
  // that message (what it was made for).
  if (grpc::Status s = auth_->Check(ctx, internal_method::kDecode, PeerRole::kRouter, nullptr);
      !s.ok()) {
    return s;
  }
  v1::DecodeClientMessage msg;
  if (!stream->Read(&msg) || !msg.has_admit()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "admit: the first message must be Admit");
  }
  if (grpc::Status s = auth_->CheckFirstMessage(*ctx, internal_method::kDecode, msg); !s.ok()) {
    return s;
  }
  const v1::DecodeAdmit& a = msg.admit();
  GenerationRequest req;
  req.prompt.assign(a.prompt_ids().begin(), a.prompt_ids().end());
  req.sampling = FromProto(a.sampling());
  req.max_tokens = a.max_tokens();
  req.ignore_eos = a.ignore_eos();
  req.output_tokens = a.output_tokens();
  req.speculative = !a.disable_speculation();
  auto admission = engine_->Admit(req);
  if (!admission.ok()) return ToGrpc(admission.status());
  const uint64_t handle = admission->handle;
  // From here on every exit must end the request exactly once.
  struct Guard {
    DecodeEngine* e;
    uint64_t h;
    ~Guard() { e->Cancel(h); }
  } guard{engine_, handle};

  v1::DecodeServerMessage out;
  *out.mutable_admitted()->mutable_kv_target() = ToProto(admission->target);
  if (!stream->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed");
  if (!stream->Read(&msg) || !msg.has_start()) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed before Start");
  }
  if (absl::Status s = engine_->Start(handle, msg.start().first_token()); !s.ok()) return ToGrpc(s);
  for (;;) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    DecodeEngine::Output o = engine_->Next(handle, absl::Milliseconds(100));
    if (!o.tokens.empty()) {
      v1::DecodeServerMessage t;
      t.mutable_tokens()->mutable_ids()->Add(o.tokens.begin(), o.tokens.end());
      for (const TokenLogprobs& l : o.logprobs) *t.mutable_tokens()->add_logprobs() = ToProto(l);
      if (!stream->Write(t)) return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed");
    }
    if (!o.error.ok()) return ToGrpc(o.error);
    if (o.finish) {
      v1::DecodeServerMessage f;
      f.mutable_finished()->set_reason(ToProto(*o.finish));
      stream->Write(f);
      return grpc::Status::OK;
    }
  }
}

grpc::Status DecodeService::NcclBootstrap(grpc::ServerContext* ctx,
                                          const v1::NcclBootstrapRequest* req,
                                          v1::NcclBootstrapResponse* resp) {
  if (grpc::Status s = auth_->Check(ctx, internal_method::kNcclBootstrap, PeerRole::kPrefill, req);
      !s.ok()) {
    return s;
  }
  if (nccl_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "NcclBootstrap: this decode worker does not use --kv-transport=nccl "
                        "(every worker of a cluster must use the same transport)");
  }
  if (req->prefill_worker().size() > 1024) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "prefill_worker: longer than 1024 bytes");
  }
  absl::StatusOr<NcclUniqueId> id = nccl_->Bootstrap(req->prefill_worker());
  if (!id.ok()) return ToGrpc(id.status());
  resp->set_unique_id(id->data(), id->size());
  return grpc::Status::OK;
}

}  // namespace tandem
