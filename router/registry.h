// The router's view of the workers: registration, heartbeats with load, health, ejection after
// repeated failures, and the routing policies. A pure data structure: time is passed in, no
// threads, no I/O (the router serializes calls).
#ifndef TANDEM_ROUTER_REGISTRY_H_
#define TANDEM_ROUTER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/scheduling/scheduler.h"

namespace tandem {

enum class WorkerRole { kPrefill, kDecode };

struct WorkerEntry {
  std::string id;
  WorkerRole role = WorkerRole::kPrefill;
  std::string address;
  std::string kv_transport;  // as registered ("" when the worker did not say)
  std::string kv_dtype;      // likewise
  // Who registered it (the certificate's subject and roles under mutual TLS; "" otherwise): only
  // the same identity may heartbeat for it or replace it while it lives.
  std::string identity;
  // Decode workers: the KV endpoint their admissions must name ("" when not told).
  std::string kv_endpoint;
  // The capacity registered; heartbeats can claim no more (total_blocks and block_size are
  // fixed at registration, free blocks and counts are clamped to them).
  WorkerLoadSnapshot registered;
  WorkerLoadSnapshot load;
  absl::Time last_seen;
  bool serving = true;
  bool draining_ = false;
  bool draining() const { return draining_; }
  int consecutive_failures = 0;
  int ejections = 0;  // in a row, without a success in between: the back-off doubles
  absl::Time ejected_until = absl::InfinitePast();
  // Prefill workers: block hashes of prompts recently routed there (what its prefix cache
  // probably holds), bounded.
  absl::flat_hash_set<uint64_t> prefixes;
  std::deque<uint64_t> prefix_order;
};

struct RegistryOptions {
  absl::Duration heartbeat_timeout = absl::Seconds(3);  // silent this long: unhealthy
  int max_consecutive_failures = 3;                     // then ejected...
  absl::Duration ejection = absl::Seconds(5);           // ...for this long, doubling while it
  absl::Duration max_ejection = absl::Seconds(60);      // keeps failing, up to this
  // Silent this long: removed from the registry (a worker whose pod or host is gone never
  // comes back under the same address; it registers again if it was only cut off). Must be
  // >= heartbeat_timeout; InfiniteDuration keeps silent workers forever.
  absl::Duration forget_after = absl::Seconds(30);
  size_t max_prefixes_per_worker = 16384;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(RegistryOptions options = {}) : options_(options) {}

  struct Credentials {
    std::string identity;
    std::string kv_endpoint;
  };
  // (Re)registers a worker; a known id is updated in place. ALREADY_EXISTS when the id is held
  // by a live worker (heard from within the heartbeat timeout) at another address or of
  // another identity: a worker id cannot be taken over while its worker lives.
  absl::Status Register(const std::string& id, WorkerRole role, const std::string& address,
                        const WorkerLoadSnapshot& load, absl::Time now,
                        const Credentials& credentials = {});
  // A prefill worker can send KV only to decode workers of its transport and KV dtype. The
  // registered worker other than `id` whose transport or dtype differs (workers that did not
  // name one never conflict), with the name of the field that differs; null when none.
  struct KvConflict {
    const WorkerEntry* other = nullptr;
    const char* field = "";  // "kv_transport" or "kv_dtype"
  };
  KvConflict FindKvConflict(const std::string& id, const std::string& kv_transport,
                            const std::string& kv_dtype) const;
  void SetKvSettings(const std::string& id, const std::string& kv_transport,
                     const std::string& kv_dtype);
  // False when the id is unknown, or registered by another identity (the worker must register
  // again). The load is clamped to the registered capacity.
  bool Heartbeat(const std::string& id, const WorkerLoadSnapshot& load, bool serving,
                 absl::Time now, bool draining = false, const std::string& identity = "");

  bool Healthy(const WorkerEntry& w, absl::Time now) const;
  std::vector<const WorkerEntry*> List() const;
  int CountHealthy(WorkerRole role, absl::Time now) const;
  const WorkerEntry* Find(const std::string& id) const;

  // Decode: a healthy worker that can admit `prompt_tokens` (their blocks and the first token's
  // fit in its free blocks beyond the watermark) and whose whole cache could hold `max_tokens`;
  // the most free blocks net of the growth its sequences may still claim, then the fewest
  // running. Optimistically charges the blocks until the next heartbeat.
  std::optional<std::string> PickDecode(int prompt_tokens, int max_tokens, absl::Time now,
                                        const std::set<std::string>& exclude);
  // The most tokens one request may reach on the largest healthy decode worker (0: none).
  int64_t LargestDecodeTokens(absl::Time now) const;
  // Prefill: the healthy worker holding the longest run of `block_hashes` (prompt blocks, in
  // order), then the lightest queue. Records the hashes as now cached there.
  std::optional<std::string> PickPrefill(std::span<const uint64_t> block_hashes, absl::Time now,
                                         const std::set<std::string>& exclude);
  // Block size the prefill workers hash prompts with (0 when none is registered).
  int PrefillBlockSize() const;

  // Removes every worker silent for longer than `forget_after`; returns them, by id.
  std::vector<WorkerEntry> ForgetSilent(absl::Time now);

  // Outlier ejection: `max_consecutive_failures` failures in a row eject a worker for the
  // back-off (ejection, doubled per ejection without a success since, capped); after it the
  // worker gets traffic again, and one success resets the count. The last healthy worker of a
  // role is never ejected.
  void ReportFailure(const std::string& id, absl::Time now);
  void ReportSuccess(const std::string& id);

 private:
  RegistryOptions options_;
  absl::flat_hash_map<std::string, WorkerEntry> workers_;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_REGISTRY_H_
