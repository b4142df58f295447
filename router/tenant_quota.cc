#include "router/tenant_quota.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

int64_t Seconds(absl::Time t) { return absl::ToUnixSeconds(t); }

}  // namespace

int64_t TenantQuotas::Used(const Use& u, int64_t now_s) {
  int64_t sum = 0;
  for (int i = 0; i < 60; ++i) {
    if (u.second[i] > now_s - 60) sum += u.tokens[i];
  }
  return sum;
}

void TenantQuotas::Add(Use& u, int64_t tokens, int64_t now_s) {
  const int i = static_cast<int>(((now_s % 60) + 60) % 60);
  if (u.second[i] != now_s) {
    u.second[i] = now_s;
    u.tokens[i] = 0;
  }
  u.tokens[i] += tokens;
}

std::optional<TenantQuotas::Refusal> TenantQuotas::Start(const std::string& tenant,
                                                         const KeyLimits& limits, int prompt_tokens,
                                                         absl::Time now, int fallback_retry_ms) {
  if (!limits.any()) return std::nullopt;
  Use& u = use_[tenant];
  const int64_t now_s = Seconds(now);
  if (limits.max_concurrent > 0 && u.running >= limits.max_concurrent) {
    return Refusal{absl::StrFormat("this API key has %d generations in flight, its "
                                   "max_concurrent; retry after %d ms",
                                   u.running, fallback_retry_ms),
                   fallback_retry_ms};
  }
  if (limits.tokens_per_minute > 0) {
    const int64_t used = Used(u, now_s);
    if (used >= limits.tokens_per_minute) {
      // The oldest second still counted leaves the window first.
      int64_t oldest = now_s;
      for (int i = 0; i < 60; ++i) {
        if (u.second[i] > now_s - 60 && u.tokens[i] > 0) oldest = std::min(oldest, u.second[i]);
      }
      const int retry_ms = static_cast<int>(std::max<int64_t>(1, oldest + 60 - now_s) * 1000);
      if (u.running == 0 && used == 0) use_.erase(tenant);
      return Refusal{absl::StrFormat("this API key used %d tokens in the last minute, its "
                                     "tokens_per_minute is %d; retry after %d ms",
                                     used, limits.tokens_per_minute, retry_ms),
                     retry_ms};
    }
  }
  ++u.running;
  Add(u, prompt_tokens, now_s);
  return std::nullopt;
}

void TenantQuotas::Charge(const std::string& tenant, int tokens, absl::Time now) {
  auto it = use_.find(tenant);
  if (it == use_.end() || tokens <= 0) return;
  Add(it->second, tokens, Seconds(now));
}

void TenantQuotas::End(const std::string& tenant, absl::Time now) {
  auto it = use_.find(tenant);
  if (it == use_.end()) return;
  Use& u = it->second;
  if (u.running > 0) --u.running;
  // An idle tenant is dropped; its minute of use goes with it only once it is empty.
  if (u.running == 0 && Used(u, Seconds(now)) == 0) use_.erase(it);
}

int TenantQuotas::running(const std::string& tenant) const {
  auto it = use_.find(tenant);
  return it == use_.end() ? 0 : it->second.running;
}

int64_t TenantQuotas::UsedLastMinute(const std::string& tenant, absl::Time now) const {
  auto it = use_.find(tenant);
  return it == use_.end() ? 0 : Used(it->second, Seconds(now));
}

}  // namespace tandem
