// What each tenant uses against its API key's limits (rpc/api_keys.h KeyLimits): generations in
// flight, and tokens (prompt and generated) over the last minute, in one-second buckets. A pure
// data structure (no locks, clocks or RPCs): the router holds it under its lock and passes the
// time in.
#ifndef TANDEM_ROUTER_TENANT_QUOTA_H_
#define TANDEM_ROUTER_TENANT_QUOTA_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/time/time.h"
#include "rpc/api_keys.h"

namespace tandem {

class TenantQuotas {
 public:
  struct Refusal {
    std::string why;     // names the limit and the use
    int retry_after_ms;  // when the use will have fallen below it (concurrency: `fallback`)
  };
  // A generation of `tenant` starting with `prompt_tokens`: nullopt when `limits` allow it (its
  // place is taken and its prompt charged; End gives the place back), else why not. Tenants
  // without limits are not tracked. `fallback_retry_ms`: the hint when a place must free.
  std::optional<Refusal> Start(const std::string& tenant, const KeyLimits& limits,
                               int prompt_tokens, absl::Time now, int fallback_retry_ms);
  // Generated tokens of a started generation.
  void Charge(const std::string& tenant, int tokens, absl::Time now);
  void End(const std::string& tenant, absl::Time now);

  int running(const std::string& tenant) const;
  int64_t UsedLastMinute(const std::string& tenant, absl::Time now) const;
  // Tenants tracked now: those with limits that have generations in flight or tokens in the last
  // minute (at most the keys with limits).
  size_t tenants() const { return use_.size(); }

 private:
  struct Use {
    int running = 0;
    std::array<int64_t, 60> tokens{};  // by second % 60
    std::array<int64_t, 60> second{};  // which second each bucket holds
  };
  static int64_t Used(const Use& u, int64_t now_s);
  static void Add(Use& u, int64_t tokens, int64_t now_s);
  std::unordered_map<std::string, Use> use_;
};

}  // namespace tandem

#endif  // TANDEM_ROUTER_TENANT_QUOTA_H_
