// The router's calls to its workers on gRPC's callback API, as awaitables for a request's
// coroutine (router/async.h): the decode stream (a client reactor that lives as long as the
// request on its decode worker) and the prefill call. No thread waits on either.
#ifndef TANDEM_ROUTER_WORKER_CALLS_H_
#define TANDEM_ROUTER_WORKER_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>

#include "router/async.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router_internal {

// One Decode stream. Reads and writes are awaited one at a time each; a read and a write may be
// outstanding together. The reactor lives until gRPC is done with it, after its owner let go.
class DecodeCall final
    : public grpc::ClientBidiReactor<v1::DecodeClientMessage, v1::DecodeServerMessage> {
 public:
  // Opens the stream on `channel` (the context already carries its deadline and proof);
  // `on_done` runs on gRPC's thread once the call has ended (the context's trailing metadata is
  // readable then), before any Finish awaiter resumes.
  static std::shared_ptr<DecodeCall> Start(const std::shared_ptr<grpc::Channel>& channel,
                                           std::unique_ptr<grpc::ClientContext> ctx,
                                           async::Executor* executor,
                                           std::function<void(const grpc::ClientContext&)> on_done);

  // True once `m` is on its way; false once the stream is broken.
  async::Callback<bool> Write(const v1::DecodeClientMessage& m);
  // True with the next message in *m; false at the stream's end.
  async::Callback<bool> Read(v1::DecodeServerMessage* m);
  // Ends the call (cancelling it if `cancel`, else closing its side so that the worker ends it
  // with its status) and waits for that status.
  async::Callback<grpc::Status> Finish(bool cancel);
  // Ends the call without waiting: cancelled unless it already ended.
  void Drop();

  grpc::ClientContext* context() { return ctx_.get(); }

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  DecodeCall(std::unique_ptr<grpc::ClientContext> ctx, async::Executor* executor,
             std::function<void(const grpc::ClientContext&)> on_done)
      : ctx_(std::move(ctx)), executor_(executor), on_done_(std::move(on_done)) {}
  // Lets gRPC finish the call (once): its hold on OnDone is removed.
  void Release();

  std::shared_ptr<grpc::Channel> channel_;  // the call uses it until its end
  std::unique_ptr<grpc::ClientContext> ctx_;
  async::Executor* executor_;
  std::function<void(const grpc::ClientContext&)> on_done_;
  v1::DecodeClientMessage out_;
  std::function<void(bool)> write_done_, read_done_;
  std::mutex mu_;
  bool released_ = false;
  bool done_ = false;
  grpc::Status status_;
  std::function<void(grpc::Status)> finish_waiter_;
  std::shared_ptr<DecodeCall> self_;  // until OnDone
};

// A unary Prefill call, awaited: its status (the response in *resp).
async::Callback<grpc::Status> CallPrefill(v1::PrefillWorker::Stub* stub, grpc::ClientContext* ctx,
                                          const v1::PrefillRequest* req, v1::PrefillResponse* resp,
                                          async::Executor* executor);

}  // namespace tandem::router_internal

#endif  // TANDEM_ROUTER_WORKER_CALLS_H_
