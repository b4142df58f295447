// The API keys' per-tenant quotas as a data structure (router/tenant_quota.h): generations in
// flight up to max_concurrent, tokens over a sliding minute up to tokens_per_minute (with the
// wait until enough of them leave the window), tenants without limits untracked, and an idle
// tenant dropped once its minute is empty.
#include "router/tenant_quota.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

TEST(TenantQuotasTest, ConcurrencyIsBoundedPerTenant) {
  TenantQuotas q;
  KeyLimits l;
  l.max_concurrent = 2;
  EXPECT_FALSE(q.Start("a", l, 5, kT0, 200));
  EXPECT_FALSE(q.Start("a", l, 5, kT0, 200));
  auto no = q.Start("a", l, 5, kT0, 200);
  ASSERT_TRUE(no);
  EXPECT_NE(no->why.find("max_concurrent"), std::string::npos) << no->why;
  EXPECT_EQ(no->retry_after_ms, 200);
  EXPECT_FALSE(q.Start("b", l, 5, kT0, 200)) << "another tenant has its own";
  q.End("a", kT0);
  EXPECT_EQ(q.running("a"), 1);
  EXPECT_FALSE(q.Start("a", l, 5, kT0, 200));
}

TEST(TenantQuotasTest, TokensPerMinuteSlideAndSayWhenToComeBack) {
  TenantQuotas q;
  KeyLimits l;
  l.tokens_per_minute = 100;
  ASSERT_FALSE(q.Start("a", l, 30, kT0, 200));
  q.Charge("a", 40, kT0 + absl::Seconds(10));
  q.End("a", kT0 + absl::Seconds(10));
  EXPECT_EQ(q.UsedLastMinute("a", kT0 + absl::Seconds(10)), 70);
  ASSERT_FALSE(q.Start("a", l, 30, kT0 + absl::Seconds(20), 200));  // 70 < 100: allowed
  q.End("a", kT0 + absl::Seconds(20));
  auto no = q.Start("a", l, 1, kT0 + absl::Seconds(30), 200);  // 100 used
  ASSERT_TRUE(no);
  EXPECT_NE(no->why.find("tokens_per_minute"), std::string::npos) << no->why;
  EXPECT_EQ(no->retry_after_ms, 30'000) << "the first second's tokens leave at 60 s";
  // At 60 s the prompt of the first request has left the window: 70 remain.
  EXPECT_EQ(q.UsedLastMinute("a", kT0 + absl::Seconds(60)), 70);
  EXPECT_FALSE(q.Start("a", l, 1, kT0 + absl::Seconds(60), 200));
  q.End("a", kT0 + absl::Seconds(60));
  EXPECT_EQ(q.UsedLastMinute("a", kT0 + absl::Seconds(200)), 0);
}

TEST(TenantQuotasTest, TenantsWithoutLimitsAreNotTrackedAndIdleOnesAreDropped) {
  TenantQuotas q;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(q.Start("free", KeyLimits(), 10, kT0, 200));
  EXPECT_EQ(q.tenants(), 0u);
  KeyLimits l;
  l.max_concurrent = 1;
  ASSERT_FALSE(q.Start("a", l, 0, kT0, 200));
  EXPECT_EQ(q.tenants(), 1u);
  q.End("a", kT0);
  EXPECT_EQ(q.tenants(), 0u);
  q.End("a", kT0);  // unknown: ignored
  q.Charge("a", 5, kT0);
  EXPECT_EQ(q.tenants(), 0u);
}

}  // namespace
}  // namespace tandem
