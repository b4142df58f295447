#include "kv_transfer/local_transport.h"

#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/transport_common.h"
#include "lib/crc32c/crc32c.h"

namespace tandem {
namespace {

// name -> live receiver, with a count of sink calls running on each so Shutdown can wait them
// out.
struct Registration {
  KvSink* sink = nullptr;
  int active_calls = 0;
  bool closing = false;
};

absl::Mutex& RegistryMu() {
  static absl::Mutex mu;
  return mu;
}
absl::flat_hash_map<std::string, Registration*>& Registry()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(RegistryMu()) {
  static auto* registry = new absl::flat_hash_map<std::string, Registration*>();
  return *registry;
}

class LocalKvReceiver final : public KvReceiver {
 public:
  LocalKvReceiver(std::string name, KvSink* sink) : name_(std::move(name)) { reg_.sink = sink; }
  ~LocalKvReceiver() override { Shutdown(); }

  absl::Status Register() {
    absl::MutexLock lock(&RegistryMu());
    if (!Registry().try_emplace(name_, &reg_).second) {
      return absl::AlreadyExistsError(
          absl::StrFormat("kv local receiver: \"%s\" is already registered", name_));
    }
    registered_ = true;
    return absl::OkStatus();
  }

  std::string endpoint() const override { return "local://" + name_; }

  void Shutdown() override {
    absl::MutexLock lock(&RegistryMu());
    if (!registered_) return;
    Registry().erase(name_);
    reg_.closing = true;
    RegistryMu().Await(absl::Condition(
        +[](Registration* r) { return r->active_calls == 0; }, &reg_));
    registered_ = false;
  }

 private:
  const std::string name_;
  Registration reg_;
  bool registered_ = false;  // guarded by RegistryMu()
};

// Verifies and delivers one chunk to the receiver named `name`.
absl::Status DeliverLocal(const std::string& name, const KvFrameHeader& h,
                          std::span<const char> payload) {
  Registration* reg;
  {
    absl::MutexLock lock(&RegistryMu());
    auto it = Registry().find(name);
    if (it == Registry().end()) {
      return absl::UnavailableError(absl::StrFormat("kv local: no receiver named \"%s\"", name));
    }
    reg = it->second;
    ++reg->active_calls;
  }
  const absl::Status verdict = DeliverKvChunk(reg->sink, h, payload);
  absl::MutexLock lock(&RegistryMu());
  --reg->active_calls;
  return verdict;
}

class LocalKvSender final : public KvSender {
 public:
  explicit LocalKvSender(const KvSenderOptions& options) : tracker_(options) {
    worker_ = std::thread([this] { WorkerLoop(); });
  }
  ~LocalKvSender() override { Shutdown(); }

  absl::Status Send(const KvTarget& target, const KvChunkHeader& header,
                    std::string payload) override {
    absl::StatusOr<KvSendTracker::Started> started =
        tracker_.BeginSend("local", target, header, std::move(payload));
    if (!started.ok()) return started.status();
    if (!started->chunk) return absl::OkStatus();  // dropped (fault injection)
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return tracker_.Abandon(*started->chunk, absl::CancelledError("kv local sender: shut down"));
    }
    queue_.push_back({started->endpoint.name, *std::move(started->chunk)});
    return absl::OkStatus();
  }

  absl::Status Wait(const KvTarget& target, absl::Time deadline) override {
    return tracker_.Wait(target, deadline);
  }
  void Forget(const KvTarget& target) override { tracker_.Forget(target); }
  size_t num_targets() const override { return tracker_.num_targets(); }

  // Fails the queue at once; then waits for a sink call in progress, which runs on the
  // worker thread.
  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
      FailQueue();
    }
    worker_.join();
  }

 private:
  struct Item {
    std::string name;
    KvOutgoingChunk out;
  };

  void WorkerLoop() {
    for (;;) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) break;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      KvOutgoingChunk& c = item.out;
      const uint64_t bytes = c.payload.size();
      if (absl::Status skip = tracker_.SkipReason(*c.state); !skip.ok()) {
        tracker_.Complete(*c.state, skip);
      } else {
        KvFrameHeader h;
        h.kind = KvFrameKind::kData;
        h.chunk = c.chunk;
        h.payload_length = bytes;
        h.payload_crc = Crc32c(c.payload);
        if (c.fault == KvFault::kCorrupt) CorruptKvPayload(&c.payload);
        tracker_.Complete(*c.state, DeliverLocal(item.name, h, c.payload));
      }
      tracker_.Dequeued(bytes);
    }
    absl::MutexLock lock(&mu_);
    FailQueue();
  }

  void FailQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Item& item : queue_) {
      tracker_.Dequeued(item.out.payload.size());
      tracker_.Complete(*item.out.state, absl::CancelledError("kv local sender: shut down"));
    }
    queue_.clear();
  }

  KvSendTracker tracker_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateLocalKvReceiver(std::string_view name,
                                                                  KvSink* sink) {
  if (sink == nullptr) return absl::InvalidArgumentError("kv local receiver: sink is null");
  if (name.empty()) return absl::InvalidArgumentError("kv local receiver: empty name");
  auto r = std::make_unique<LocalKvReceiver>(std::string(name), sink);
  if (absl::Status s = r->Register(); !s.ok()) return s;
  return r;
}

std::unique_ptr<KvSender> CreateLocalKvSender(const KvSenderOptions& options) {
  return std::make_unique<LocalKvSender>(options);
}

}  // namespace tandem
