// The tenants' line as a data structure: turns between tenants, each tenant's own order, and
// the room a full line makes from the tenant holding the most; the client address and tenant of
// a request, behind trusted proxies and not.
#include "http/fair_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "http/client_address.h"

namespace tandem {
namespace {

std::vector<int> PopAll(FairQueue<int>& q) {
  std::vector<int> out;
  while (std::optional<int> v = q.Pop()) out.push_back(*v);
  return out;
}

TEST(FairQueueTest, TenantsTakeTurnsAndKeepTheirOwnOrder) {
  FairQueue<int> q;
  for (int i = 0; i < 5; ++i) q.Push("flood", i);
  q.Push("quiet", 100);
  q.Push("third", 200);
  q.Push("quiet", 101);
  EXPECT_EQ(q.size(), 8u);
  EXPECT_EQ(q.tenants(), 3u);
  EXPECT_EQ(q.Waiting("flood"), 5u);
  // The quiet tenant waits behind one of the flood's requests, not five.
  EXPECT_EQ(PopAll(q), (std::vector<int>{0, 100, 200, 1, 101, 2, 3, 4}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.tenants(), 0u);
}

TEST(FairQueueTest, ATenantThatEmptiesJoinsAtTheBack) {
  FairQueue<int> q;
  q.Push("a", 1);
  q.Push("b", 2);
  EXPECT_EQ(*q.Pop(), 1);
  q.Push("a", 3);  // "a" comes back after "b"
  q.Push("c", 4);
  EXPECT_EQ(PopAll(q), (std::vector<int>{2, 3, 4}));
}

TEST(FairQueueTest, AFullLineTakesTheNewestOfTheLargestTenant) {
  FairQueue<int> q;
  for (int i = 0; i < 4; ++i) q.Push("flood", i);
  q.Push("other", 10);
  q.Push("other", 11);
  EXPECT_FALSE(q.TakeNewestOfLargest(4).has_value());  // nobody holds more than 4
  EXPECT_EQ(q.TakeNewestOfLargest(1), 3);
  EXPECT_EQ(q.TakeNewestOfLargest(1), 2);
  EXPECT_EQ(q.TakeNewestOfLargest(1), 1);  // a tie: the tenant first in line
  EXPECT_EQ(q.Waiting("flood"), 1u);
  q.Push("x", 20);
  EXPECT_EQ(q.TakeNewestOfLargest(0), 11);
  EXPECT_EQ(q.TakeNewestOfLargest(0), 0);  // "flood" leaves the line entirely
  EXPECT_EQ(q.tenants(), 2u);
  EXPECT_EQ(PopAll(q), (std::vector<int>{10, 20}));
}

// A request head as the parser leaves it (header names in lower case).
HttpRequest Head(std::string peer, std::vector<std::pair<std::string, std::string>> headers) {
  HttpRequest r;
  r.peer = std::move(peer);
  r.headers = std::move(headers);
  return r;
}

TEST(ClientAddressTest, ForwardedAddressesAreBelievedOnlyFromTrustedProxies) {
  auto proxies = TrustedProxies::Parse("10.0.0.0/8, 192.168.1.7,fd00::/8");
  ASSERT_TRUE(proxies.ok()) << proxies.status();
  EXPECT_TRUE(proxies->Contains("10.200.3.4"));
  EXPECT_FALSE(proxies->Contains("11.0.0.1"));
  EXPECT_TRUE(proxies->Contains("192.168.1.7"));
  EXPECT_FALSE(proxies->Contains("192.168.1.8"));
  EXPECT_TRUE(proxies->Contains("fd12::1"));
  EXPECT_FALSE(proxies->Contains("fe80::1"));

  // Directly connected: the header is the client's own claim and is ignored.
  EXPECT_EQ(ClientAddress(Head("203.0.113.5", {{"x-forwarded-for", "1.2.3.4"}}), *proxies),
            "203.0.113.5");
  // Through the ingress: the rightmost hop that is not a trusted proxy. What the client wrote
  // itself (the leftmost) is not believed over it.
  EXPECT_EQ(
      ClientAddress(Head("10.1.1.1", {{"x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.2.2.2"}}),
                    *proxies),
      "198.51.100.9");
  EXPECT_EQ(
      ClientAddress(Head("10.1.1.1", {{"forwarded", "for=\"[2001:db8::7]:4711\";proto=https"}}),
                    *proxies),
      "2001:db8::7");
  EXPECT_EQ(ClientAddress(Head("10.1.1.1", {{"x-forwarded-for", "not an address"}}), *proxies),
            "10.1.1.1");
  EXPECT_EQ(ClientAddress(Head("10.1.1.1", {}), *proxies), "10.1.1.1");

  EXPECT_FALSE(TrustedProxies::Parse("10.0.0.0/33").ok());
  EXPECT_NE(TrustedProxies::Parse("10.0.0.0/8,proxy.local").status().message().find("proxy.local"),
            std::string::npos);
}

TEST(ClientAddressTest, TenantsAreKeysOnlyWhereKeysAreChecked) {
  const TrustedProxies none;
  const HttpRequest a = Head("127.0.0.1", {{"authorization", "Bearer one"}});
  const HttpRequest b = Head("127.0.0.1", {{"authorization", "Bearer two"}});
  EXPECT_NE(TenantOf(a, none, true), TenantOf(b, none, true));
  EXPECT_EQ(TenantOf(a, none, true).rfind("key:", 0), 0u);
  EXPECT_EQ(TenantOf(a, none, true).find("one"), std::string::npos);  // the key is not kept
  // Unchecked keys would let one client be a new tenant with every request.
  EXPECT_EQ(TenantOf(a, none, false), "addr:127.0.0.1");
  EXPECT_EQ(TenantOf(b, none, false), "addr:127.0.0.1");
}

}  // namespace
}  // namespace tandem
