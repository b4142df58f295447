// An in-process stand-in for NCCL behind kv_transfer/nccl/communicator.h, for unit tests of the
// NCCL KV transport's logic on the CPU. Rank pairs meet by unique id; a Send on one rank is
// matched with the other rank's next Recv in posting order (NCCL's rule for point-to-point),
// and bytes are copied when both are posted. A size mismatch is an asynchronous error on both
// ranks, as NCCL reports a truncated receive.
//
// Faults: Freeze(rank) makes every communicator of that rank stop progressing (a hung peer:
// nothing completes, nothing errors); an Abort makes the other rank of the pair see an
// asynchronous error when abort_visible_to_peer (the socket/IB case), or just stall otherwise
// (what NVLink peers may do); FailAll(status) gives every live pair an asynchronous error (a
// peer process that died).
#ifndef TANDEM_TESTS_KV_TRANSFER_NCCL_FAKE_H_
#define TANDEM_TESTS_KV_TRANSFER_NCCL_FAKE_H_

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl/communicator.h"

namespace tandem::testing {

class FakeNccl : public CommunicatorFactory {
 public:
  absl::StatusOr<NcclUniqueId> NewUniqueId() override {
    absl::MutexLock lock(&mu_);
    NcclUniqueId id{};
    const uint64_t n = ++ids_;
    std::memcpy(id.data(), &n, sizeof(n));
    return id;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const NcclUniqueId& id, int nranks,
                                                         int rank) override {
    absl::MutexLock lock(&mu_);
    if (nranks != 2 || rank < 0 || rank > 1) {
      return absl::InvalidArgumentError(absl::StrFormat("fake nccl: rank %d of %d", rank, nranks));
    }
    if (!init_error_.ok()) return init_error_;
    auto& link = links_[id];
    if (link == nullptr) link = std::make_shared<Link>();
    if (link->joined[rank]) return absl::AlreadyExistsError("fake nccl: rank joined twice");
    link->joined[rank] = true;
    ++inits_;
    return std::unique_ptr<Communicator>(new Comm(this, link, rank));
  }

  void Freeze(int rank, bool frozen) {
    absl::MutexLock lock(&mu_);
    frozen_[rank] = frozen;
    if (!frozen) MatchAllLocked();
  }
  void set_abort_visible_to_peer(bool v) {
    absl::MutexLock lock(&mu_);
    abort_visible_ = v;
  }
  void FailAll(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    for (auto& [id, link] : links_) link->error[0] = link->error[1] = s;
  }
  void set_init_error(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    init_error_ = s;
  }

  // The leak check: communicators not destroyed, and how many were aborted.
  int live_comms() const {
    absl::MutexLock lock(&mu_);
    return live_;
  }
  int aborts() const {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }
  int inits() const {
    absl::MutexLock lock(&mu_);
    return inits_;
  }
  uint64_t bytes_moved() const {
    absl::MutexLock lock(&mu_);
    return bytes_;
  }

 private:
  struct Op {
    const char* src = nullptr;
    char* dst = nullptr;
    size_t n = 0;
  };
  struct Link {
    bool joined[2] = {false, false};
    bool aborted[2] = {false, false};
    absl::Status error[2];
    std::deque<Op> sends[2];  // posted by rank r, to the other rank
    std::deque<Op> recvs[2];  // posted by rank r, from the other rank
    int outstanding[2] = {0, 0};
  };

  class Comm : public Communicator {
   public:
    Comm(FakeNccl* net, std::shared_ptr<Link> link, int rank)
        : net_(net), link_(std::move(link)), rank_(rank) {
      ++net_->live_;
    }
    ~Comm() override {
      absl::MutexLock lock(&net_->mu_);
      --net_->live_;
    }
    int rank() const override { return rank_; }
    absl::Status GroupStart() override {
      absl::MutexLock lock(&net_->mu_);
      if (absl::Status s = UsableLocked(); !s.ok()) return s;
      ++group_depth_;
      return absl::OkStatus();
    }
    absl::Status GroupEnd() override {
      absl::MutexLock lock(&net_->mu_);
      if (absl::Status s = UsableLocked(); !s.ok()) return s;
      if (group_depth_ == 0) return absl::InvalidArgumentError("fake nccl: GroupEnd without start");
      if (--group_depth_ == 0) {
        for (auto& [is_send, op] : staged_) LaunchLocked(is_send, op);
        staged_.clear();
        net_->MatchAllLocked();
      }
      return absl::OkStatus();
    }
    absl::Status Send(std::span<const char> data, int peer) override {
      return Post(true, Op{data.data(), nullptr, data.size()}, peer);
    }
    absl::Status Recv(std::span<char> data, int peer) override {
      return Post(false, Op{nullptr, data.data(), data.size()}, peer);
    }
    absl::StatusOr<CommPoll> Poll() override {
      absl::MutexLock lock(&net_->mu_);
      if (link_->aborted[rank_]) return absl::FailedPreconditionError("fake nccl: aborted");
      if (!link_->error[rank_].ok()) return link_->error[rank_];
      if (!link_->joined[0] || !link_->joined[1]) return CommPoll::kPending;
      return link_->outstanding[rank_] == 0 ? CommPoll::kIdle : CommPoll::kPending;
    }
    void Abort() override {
      absl::MutexLock lock(&net_->mu_);
      if (link_->aborted[rank_]) return;
      link_->aborted[rank_] = true;
      ++net_->aborts_;
      link_->sends[rank_].clear();
      link_->recvs[rank_].clear();
      link_->outstanding[rank_] = 0;
      if (net_->abort_visible_ && link_->error[1 - rank_].ok()) {
        link_->error[1 - rank_] = absl::UnavailableError("fake nccl: remote rank aborted");
      }
    }

   private:
    absl::Status UsableLocked() const {
      if (link_->aborted[rank_]) return absl::FailedPreconditionError("fake nccl: aborted");
      return link_->error[rank_];
    }
    absl::Status Post(bool is_send, Op op, int peer) {
      absl::MutexLock lock(&net_->mu_);
      if (absl::Status s = UsableLocked(); !s.ok()) return s;
      if (peer != 1 - rank_) return absl::InvalidArgumentError("fake nccl: bad peer");
      if (group_depth_ > 0) {
        staged_.push_back({is_send, op});
      } else {
        LaunchLocked(is_send, op);
        net_->MatchAllLocked();
      }
      return absl::OkStatus();
    }
    void LaunchLocked(bool is_send, const Op& op) {
      (is_send ? link_->sends : link_->recvs)[rank_].push_back(op);
      ++link_->outstanding[rank_];
    }

    FakeNccl* const net_;
    const std::shared_ptr<Link> link_;
    const int rank_;
    int group_depth_ = 0;
    std::vector<std::pair<bool, Op>> staged_;
  };

  void MatchAllLocked() {
    for (auto& [id, link] : links_) {
      for (int r = 0; r < 2; ++r) {
        const int o = 1 - r;
        while (!frozen_[r] && !frozen_[o] && !link->aborted[r] && !link->aborted[o] &&
               link->error[r].ok() && link->error[o].ok() && !link->sends[r].empty() &&
               !link->recvs[o].empty()) {
          Op s = link->sends[r].front(), d = link->recvs[o].front();
          link->sends[r].pop_front();
          link->recvs[o].pop_front();
          --link->outstanding[r];
          --link->outstanding[o];
          if (s.n != d.n) {
            const absl::Status e = absl::InternalError(absl::StrFormat(
                "fake nccl: send of %d bytes matched a receive of %d (truncated)", s.n, d.n));
            link->error[r] = link->error[o] = e;
            break;
          }
          if (s.n > 0) std::memcpy(d.dst, s.src, s.n);
          bytes_ += s.n;
        }
      }
    }
  }

  mutable absl::Mutex mu_;
  std::map<NcclUniqueId, std::shared_ptr<Link>> links_;
  uint64_t ids_ = 0;
  bool frozen_[2] = {false, false};
  bool abort_visible_ = true;
  absl::Status init_error_;
  int live_ = 0;
  int aborts_ = 0;
  int inits_ = 0;
  uint64_t bytes_ = 0;
};

// `n` bytes from a seeded generator: a KV payload whose every byte matters.
inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Polls `cond` every millisecond until it holds (true) or `timeout` passes (false).
inline bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KV_TRANSFER_NCCL_FAKE_H_
