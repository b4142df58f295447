// Small helpers shared by the gRPC services: status conversion and proto <-> engine types.
#ifndef TANDEM_RPC_GRPC_UTIL_H_
#define TANDEM_RPC_GRPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/request.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduling/scheduler.h"
#include "kv_transfer/kv_transfer.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// A call's deadline; InfiniteFuture when the client set none.
inline absl::Time DeadlineOf(const grpc::ServerContextBase* ctx) {
  const auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Unset fields take the engine defaults (temperature 1, top_p 1).
inline SamplingParams FromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.seed = p.seed();
  s.logprobs = p.logprobs();
  s.top_logprobs = p.top_logprobs();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  s.min_tokens = p.min_tokens();
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());  // map order is unspecified
  s.json_schema = p.json_schema();
  s.json_prefix = p.json_prefix();
  s.json_suffix = p.json_suffix();
  s.choice.assign(p.choice().begin(), p.choice().end());
  s.regex = p.regex();
  return s;
}

inline v1::SamplingParams ToProto(const SamplingParams& s) {
  v1::SamplingParams p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  p.set_seed(s.seed);
  p.set_logprobs(s.logprobs);
  p.set_top_logprobs(s.top_logprobs);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  p.set_repetition_penalty(s.repetition_penalty);
  p.set_min_tokens(s.min_tokens);
  for (const auto& [id, bias] : s.logit_bias) (*p.mutable_logit_bias())[id] = bias;
  p.set_json_schema(s.json_schema);
  p.set_json_prefix(s.json_prefix);
  p.set_json_suffix(s.json_suffix);
  for (const std::string& c : s.choice) p.add_choice(c);
  p.set_regex(s.regex);
  return p;
}

inline v1::TokenLogprobs ToProto(const TokenLogprobs& l) {
  v1::TokenLogprobs p;
  p.set_logprob(l.logprob);
  for (const auto& [token, logprob] : l.top) {
    v1::TopLogprob* t = p.add_top();
    t->set_token_id(token);
    t->set_logprob(logprob);
  }
  return p;
}

inline KvTarget FromProto(const v1::KvTarget& t) {
  return KvTarget{t.endpoint(), t.lease_id(), t.generation(), t.capability()};
}

inline v1::KvTarget ToProto(const KvTarget& t) {
  v1::KvTarget p;
  p.set_endpoint(t.endpoint);
  p.set_lease_id(t.lease_id);
  p.set_generation(t.generation);
  p.set_capability(t.capability);
  return p;
}

inline v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kContext:
      return v1::FINISH_REASON_CONTEXT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

inline v1::WorkerLoad ToProto(const WorkerLoadSnapshot& l) {
  v1::WorkerLoad p;
  p.set_queue_depth(l.queue_depth);
  p.set_running_requests(l.running);
  p.set_free_kv_blocks(l.free_blocks);
  p.set_total_kv_blocks(l.total_blocks);
  p.set_block_size(l.block_size);
  p.set_growth_kv_blocks(l.growth_blocks);
  p.set_watermark_kv_blocks(l.watermark_blocks);
  p.set_reserves_max_tokens(l.reserves_max_tokens);
  for (int w : l.kv_group_window) p.add_kv_group_window(w);
  return p;
}

}  // namespace tandem

#endif  // TANDEM_RPC_GRPC_UTIL_H_
