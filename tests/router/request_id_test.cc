// Request ids (router/request_id.h): the router's own cannot be guessed, and clients' ids are
// scoped to their callers, so that no caller can take an id another needs.
#include "router/request_id.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace tandem {
namespace {

TEST(RequestIdTest, RouterIdsAre128RandomBits) {
  std::set<std::string> seen;
  for (int i = 0; i < 10000; ++i) {
    const std::string id = NewRequestId();
    ASSERT_EQ(id.size(), 4u + 32u) << id;
    EXPECT_EQ(id.substr(0, 4), "req-");
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
    EXPECT_TRUE(seen.insert(id).second) << "drawn twice: " << id;
  }
  // Not a counter: consecutive ids share no long prefix of their random part.
  const std::string a = NewRequestId(), b = NewRequestId();
  EXPECT_NE(a.substr(4, 8), b.substr(4, 8));
}

TEST(RequestIdTest, ClientIdsLiveInTheirCallersNamespace) {
  const std::string alice = CallerNamespace("alice-key-0123456789", "ipv4:127.0.0.1:1000");
  const std::string bob = CallerNamespace("bob-key-0123456789ab", "ipv4:127.0.0.1:1000");
  // A key is the same namespace on every connection, and it is never written out.
  EXPECT_EQ(alice, CallerNamespace("alice-key-0123456789", "ipv4:10.0.0.9:2000"));
  EXPECT_EQ(alice.find("alice"), std::string::npos) << alice;
  EXPECT_EQ(alice.size(), 4u + 32u);
  // Without keys, each connection is its own namespace.
  const std::string c1 = CallerNamespace("", "ipv4:127.0.0.1:1000");
  const std::string c2 = CallerNamespace("", "ipv4:127.0.0.1:1001");
  EXPECT_EQ(c1, "peer:ipv4:127.0.0.1:1000");
  std::set<std::string> callers = {alice, bob, c1, c2};
  EXPECT_EQ(callers.size(), 4u);
  // The same id chosen by different callers: different requests; by the same caller: the same.
  std::set<std::string> scoped;
  for (const std::string& caller : callers) scoped.insert(ScopedRequestId(caller, "job-1"));
  EXPECT_EQ(scoped.size(), 4u);
  EXPECT_EQ(ScopedRequestId(c1, "job-1"), ScopedRequestId(c1, "job-1"));
  // A client naming an id the router could draw does not take it.
  const std::string drawn = ScopedRequestId(c1, "");
  EXPECT_EQ(drawn.substr(0, 4), "req-");
  EXPECT_NE(ScopedRequestId(c2, drawn), drawn);
  EXPECT_EQ(drawn.find('/'), std::string::npos);
  // Slashes cannot move the boundary between namespace and id: ("unix:/a", "b/c") and
  // ("unix:/a/b", "c") stay apart.
  EXPECT_NE(ScopedRequestId(CallerNamespace("", "unix:/a"), "b/c"),
            ScopedRequestId(CallerNamespace("", "unix:/a/b"), "c"));
  EXPECT_NE(ScopedRequestId(CallerNamespace("", "a%2Fb"), "c"),
            ScopedRequestId(CallerNamespace("", "a/b"), "c"));
  EXPECT_EQ(ScopedRequestId("", "x"), "local/x");
}

}  // namespace
}  // namespace tandem
