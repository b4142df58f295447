#include "router/worker_calls.h"

#include <utility>

namespace tandem::router_internal {

std::shared_ptr<DecodeCall> DecodeCall::Start(
    const std::shared_ptr<grpc::Channel>& channel, std::unique_ptr<grpc::ClientContext> ctx,
    async::Executor* executor, std::function<void(const grpc::ClientContext&)> on_done) {
  std::shared_ptr<DecodeCall> call(new DecodeCall(std::move(ctx), executor, std::move(on_done)));
  call->self_ = call;
  call->channel_ = channel;
  auto stub = v1::DecodeWorker::NewStub(channel);
  stub->async()->Decode(call->ctx_.get(), call.get());
  call->AddHold();  // OnDone waits for Release: the stream stays usable between awaits
  call->StartCall();
  return call;
}

async::Callback<bool> DecodeCall::Write(const v1::DecodeClientMessage& m) {
  return async::Callback<bool>(executor_, [this, m](std::function<void(bool)> done) {
    out_ = m;
    write_done_ = std::move(done);
    StartWrite(&out_);
  });
}

async::Callback<bool> DecodeCall::Read(v1::DecodeServerMessage* m) {
  return async::Callback<bool>(executor_, [this, m](std::function<void(bool)> done) {
    read_done_ = std::move(done);
    StartRead(m);
  });
}

async::Callback<grpc::Status> DecodeCall::Finish(bool cancel) {
  return async::Callback<grpc::Status>(
      executor_, [this, cancel](std::function<void(grpc::Status)> done) {
        if (cancel) {
          ctx_->TryCancel();
        } else {
          StartWritesDone();  // the worker ends the stream with its status
        }
        {
          std::unique_lock<std::mutex> lock(mu_);
          if (!done_) {
            finish_waiter_ = std::move(done);
            lock.unlock();
            Release();
            return;
          }
        }
        done(status_);
      });
}

void DecodeCall::Drop() {
  bool done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = done_;
  }
  if (!done) ctx_->TryCancel();
  Release();
}

void DecodeCall::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
  }
  RemoveHold();
}

void DecodeCall::OnWriteDone(bool ok) { std::exchange(write_done_, nullptr)(ok); }

void DecodeCall::OnReadDone(bool ok) { std::exchange(read_done_, nullptr)(ok); }

void DecodeCall::OnDone(const grpc::Status& s) {
  if (on_done_) on_done_(*ctx_);
  std::function<void(grpc::Status)> waiter;
  std::shared_ptr<DecodeCall> self;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    status_ = s;
    waiter = std::move(finish_waiter_);
    self = std::move(self_);
  }
  if (waiter) waiter(s);
  // `self` goes last: the reactor may be freed here.
}

async::Callback<grpc::Status> CallPrefill(v1::PrefillWorker::Stub* stub, grpc::ClientContext* ctx,
                                          const v1::PrefillRequest* req, v1::PrefillResponse* resp,
                                          async::Executor* executor) {
  return async::Callback<grpc::Status>(executor, [=](std::function<void(grpc::Status)> done) {
    stub->async()->Prefill(ctx, req, resp, std::move(done));
  });
}

}  // namespace tandem::router_internal
