#include "decode_node/decode_service.h"

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "rpc/grpc_util.h"

namespace tandem {

namespace {

using DecodeReactor = grpc::ServerBidiReactor<v1::DecodeClientMessage, v1::DecodeServerMessage>;

// One Decode stream, through its states: kAdmit (reading the Admit), kAdmitted (writing the
// lease), kStart (reading the Start), kStreaming (writing tokens as the engine makes them: the
// engine's notifier calls Pump), kEnding (writing the last tokens and Finished), kDone. At most
// one read or write is in flight (`busy_`), and no lock is held while one is started. Finish
// comes once: from the completion of the op in flight, or at once from OnCancel when none is.
// Every end cancels the engine's request (a no-op once its end was read), so a stream never
// leaves one behind; a cancel frees the request's place at once.
class DecodeStream final : public DecodeReactor, public std::enable_shared_from_this<DecodeStream> {
 public:
  static DecodeReactor* Open(grpc::CallbackServerContext* ctx, DecodeEngine* engine,
                             InternalAuth* auth, DecodeService::RequestHandles* handles) {
    std::shared_ptr<DecodeStream> s(new DecodeStream(ctx, engine, auth, handles));
    s->self_ = s;
    // The proof is checked twice: before the first message is read (who may call), and
    // against that message (what it was made for).
    if (grpc::Status st = auth->Check(ctx, internal_method::kDecode, PeerRole::kRouter, nullptr);
        !st.ok()) {
      s->End(st);
    } else {
      s->busy_ = true;
      s->StartRead(&s->in_);
    }
    return s.get();
  }

  void OnReadDone(bool ok) override {
    std::optional<grpc::Status> end;
    bool write = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (state_ == State::kAdmit) {
        end = ok && in_.has_admit() ? AdmitLocked()
                                    : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                   "admit: the first message must be Admit");
        write = !end;
      } else if (!ok || !in_.has_start()) {
        end = grpc::Status(grpc::StatusCode::CANCELLED, "stream closed before Start");
      } else {
        end = StartLocked();
      }
    }
    if (end) {
      End(*end);
    } else if (write) {
      StartWrite(&out_);
    } else {
      Pump();
    }
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> end;
    bool read = false, write = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (!ok) {
        end = grpc::Status(grpc::StatusCode::CANCELLED, "stream closed");
      } else if (state_ == State::kAdmitted) {
        state_ = State::kStart;
        busy_ = read = true;
      } else if (state_ == State::kEnding && tail_) {
        out_ = *std::exchange(tail_, std::nullopt);
        busy_ = write = true;
      } else if (state_ == State::kEnding) {
        end = final_;
      } else if (cancelled_) {
        end = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
    }
    if (end) {
      End(*end);
    } else if (read) {
      StartRead(&in_);
    } else if (write) {
      StartWrite(&out_);
    } else {
      Pump();
    }
  }

  void OnCancel() override {
    bool end = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (handle_ != 0) engine_->Cancel(handle_);
      end = !busy_;  // otherwise the op in flight fails and ends the stream
    }
    if (end) End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override { self_.reset(); }

 private:
  enum class State { kAdmit, kAdmitted, kStart, kStreaming, kEnding, kDone };

  DecodeStream(grpc::CallbackServerContext* ctx, DecodeEngine* engine, InternalAuth* auth,
               DecodeService::RequestHandles* handles)
      : ctx_(ctx), engine_(engine), auth_(auth), handles_(handles) {}

  // The Admit in `in_`: the request admitted and `out_` its lease, or the refusal.
  std::optional<grpc::Status> AdmitLocked() {
    if (grpc::Status s = auth_->CheckFirstMessage(*ctx_, internal_method::kDecode, in_); !s.ok()) {
      return s;
    }
    const v1::DecodeAdmit& a = in_.admit();
    GenerationRequest req;
    req.prompt.assign(a.prompt_ids().begin(), a.prompt_ids().end());
    req.sampling = FromProto(a.sampling());
    req.max_tokens = a.max_tokens();
    req.ignore_eos = a.ignore_eos();
    req.output_tokens = a.output_tokens();
    req.speculative = !a.disable_speculation();
    if (!a.replaces_request_id().empty()) {
      if (std::optional<uint64_t> h = handles_->Find(a.replaces_request_id())) engine_->Cancel(*h);
    }
    auto admission = engine_->Admit(req);
    if (!admission.ok()) return ToGrpc(admission.status());
    handle_ = admission->handle;
    request_id_ = a.request_id();
    handles_->Track(request_id_, handle_);
    out_.Clear();
    *out_.mutable_admitted()->mutable_kv_target() = ToProto(admission->target);
    state_ = State::kAdmitted;
    busy_ = true;
    return std::nullopt;
  }

  // The Start in `in_`: the request decodes, and the engine's notifier pumps its output.
  std::optional<grpc::Status> StartLocked() {
    if (absl::Status s = engine_->Start(handle_, in_.start().first_token()); !s.ok()) {
      return ToGrpc(s);
    }
    state_ = State::kStreaming;
    std::weak_ptr<DecodeStream> weak = weak_from_this();
    engine_->Watch(handle_, [weak] {
      if (std::shared_ptr<DecodeStream> s = weak.lock()) s->Pump();
    });
    return std::nullopt;
  }

  // Writes the engine's output when no write is in flight (OnWriteDone pumps again after one).
  void Pump() {
    std::optional<grpc::Status> end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ != State::kStreaming || busy_ || cancelled_) return;
      DecodeEngine::Output o = engine_->Next(handle_, absl::ZeroDuration());
      const bool over = o.finish.has_value() || !o.error.ok();
      if (o.tokens.empty() && !over) return;
      if (over) {
        state_ = State::kEnding;
        final_ = ToGrpc(o.error);
        if (o.finish) {
          v1::DecodeServerMessage f;
          f.mutable_finished()->set_reason(ToProto(*o.finish));
          tail_ = std::move(f);
        }
      }
      if (!o.tokens.empty()) {
        out_.Clear();
        v1::DecodeTokens* t = out_.mutable_tokens();
        t->mutable_ids()->Add(o.tokens.begin(), o.tokens.end());
        for (const TokenLogprobs& l : o.logprobs) *t->add_logprobs() = ToProto(l);
      } else if (tail_) {
        out_ = *std::exchange(tail_, std::nullopt);
      } else {
        end = final_;  // failed with nothing left to send
      }
      busy_ = !end;
    }
    if (end) {
      End(*end);
    } else {
      StartWrite(&out_);
    }
  }

  // Finishes the stream once, ending the engine's request.
  void End(const grpc::Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ == State::kDone) return;
      state_ = State::kDone;
      if (handle_ != 0) {
        engine_->Cancel(handle_);
        handles_->Untrack(request_id_, handle_);
      }
    }
    Finish(s);
  }

  grpc::CallbackServerContext* const ctx_;
  DecodeEngine* const engine_;
  InternalAuth* const auth_;
  DecodeService::RequestHandles* const handles_;
  std::shared_ptr<DecodeStream> self_;  // until OnDone
  std::mutex mu_;
  State state_ = State::kAdmit;
  bool busy_ = false;       // a read or write in flight
  bool cancelled_ = false;  // OnCancel came
  uint64_t handle_ = 0;     // the engine's request, once admitted
  std::string request_id_;  // the router's, once admitted
  v1::DecodeClientMessage in_;
  v1::DecodeServerMessage out_;
  std::optional<v1::DecodeServerMessage> tail_;  // kEnding: Finished, after the last tokens
  grpc::Status final_;                           // kEnding: the status to finish with
};

}  // namespace

DecodeReactor* DecodeService::Decode(grpc::CallbackServerContext* ctx) {
  return DecodeStream::Open(ctx, engine_, auth_.get(), &handles_);
}

void DecodeService::RequestHandles::Track(const std::string& id, uint64_t handle) {
  if (id.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  handles_[id] = handle;
}

void DecodeService::RequestHandles::Untrack(const std::string& id, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(id);
  if (it != handles_.end() && it->second == handle) handles_.erase(it);
}

std::optional<uint64_t> DecodeService::RequestHandles::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) return std::nullopt;
  return it->second;
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
