#include "router/admission.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(AdmissionLineTest, FirstComeFirstLooks) {
  AdmissionLine line(3);
  EXPECT_TRUE(line.MayLook(0));  // nobody waits: anyone may look
  const auto a = line.Join(), b = line.Join();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, 0u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(line.waiting(), 2);
  EXPECT_EQ(line.front(), *a);
  EXPECT_TRUE(line.MayLook(*a));
  EXPECT_FALSE(line.MayLook(*b));
  EXPECT_FALSE(line.MayLook(0));  // a newcomer waits behind them
  line.Leave(*a);
  EXPECT_TRUE(line.MayLook(*b));
  line.Leave(*b);
  EXPECT_EQ(line.waiting(), 0);
  EXPECT_EQ(line.front(), 0u);
  EXPECT_TRUE(line.MayLook(0));
}

TEST(AdmissionLineTest, TheBoundRefusesAndLeavingMakesRoom) {
  AdmissionLine line(2);
  const auto a = line.Join(), b = line.Join();
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(line.Join());  // full
  line.Leave(*b);             // from the middle or the back: the order of the rest holds
  const auto c = line.Join();
  ASSERT_TRUE(c);
  EXPECT_EQ(line.front(), *a);
  line.Leave(*a);
  EXPECT_EQ(line.front(), *c);
  line.Leave(*a);  // twice, unknown and 0: ignored
  line.Leave(12345);
  line.Leave(0);
  EXPECT_EQ(line.waiting(), 1);
}

// Tenants take turns at the front: a quiet tenant's request waits behind one of the flood's,
// and within a tenant the order is first come, first looked.
TEST(AdmissionLineTest, TenantsTakeTurns) {
  AdmissionLine line(10);
  const auto f1 = line.Join("flood"), f2 = line.Join("flood"), f3 = line.Join("flood");
  const auto q1 = line.Join("quiet"), q2 = line.Join("quiet");
  ASSERT_TRUE(f1 && f2 && f3 && q1 && q2);
  EXPECT_EQ(line.front(), *f1);
  line.Leave(*f1);  // admitted: the turn passes
  EXPECT_EQ(line.front(), *q1);
  EXPECT_FALSE(line.MayLook(*f2));
  line.Leave(*q1);
  EXPECT_EQ(line.front(), *f2);
  line.Leave(*q2);  // gave up from behind: the order holds
  EXPECT_EQ(line.front(), *f2);
  line.Leave(*f2);
  EXPECT_EQ(line.front(), *f3);
  const auto q3 = line.Join("quiet");
  line.Leave(*f3);
  EXPECT_EQ(line.front(), *q3);
  line.Leave(*q3);
  EXPECT_EQ(line.waiting(), 0);
  EXPECT_TRUE(line.MayLook(0));
}

// vLLM's priority orders a tenant's own requests (lower first, then first come), never one
// tenant's ahead of another's turn.
TEST(AdmissionLineTest, PriorityOrdersWithinATenant) {
  AdmissionLine line(10);
  const auto a0 = line.Join("a", 0), a1 = line.Join("a", 5), b0 = line.Join("b", 9);
  const auto a2 = line.Join("a", -1), a3 = line.Join("a", 5), a4 = line.Join("a", 0);
  ASSERT_TRUE(a0 && a1 && b0 && a2 && a3 && a4);
  EXPECT_EQ(line.front(), *a2);  // ahead of its own tenant's older requests
  line.Leave(*a2);
  EXPECT_EQ(line.front(), *b0);  // the turn passes to the other tenant whatever the priorities
  line.Leave(*b0);
  EXPECT_EQ(line.front(), *a0);
  line.Leave(*a0);
  EXPECT_EQ(line.front(), *a4);  // priority 0 after the older priority 0
  line.Leave(*a4);
  EXPECT_EQ(line.front(), *a1);  // equal priorities: first come first
  line.Leave(*a1);
  EXPECT_EQ(line.front(), *a3);
  line.Leave(*a3);
  EXPECT_EQ(line.waiting(), 0);
}

// A tenant far below its share goes first as it joins: its request looks before the front of
// the tenant holding the places; the others keep their order and the turns go on from there.
TEST(AdmissionLineTest, GoFirstPutsATenantsTurnAtTheFront) {
  AdmissionLine line(10);
  const auto f1 = line.Join("flood"), f2 = line.Join("flood"), m1 = line.Join("mid");
  const auto q1 = line.Join("quiet"), q2 = line.Join("quiet");
  ASSERT_TRUE(f1 && f2 && m1 && q1 && q2);
  EXPECT_EQ(line.front(), *f1);
  line.GoFirst("quiet");
  EXPECT_EQ(line.front(), *q1);
  EXPECT_TRUE(line.MayLook(*q1));
  EXPECT_FALSE(line.MayLook(*f1));
  EXPECT_EQ(line.turns(), (std::deque<std::string>{"quiet", "flood", "mid"}));
  line.GoFirst("quiet");   // already first
  line.GoFirst("nobody");  // not waiting: nothing changes
  EXPECT_EQ(line.turns(), (std::deque<std::string>{"quiet", "flood", "mid"}));
  line.Leave(*q1);
  EXPECT_EQ(line.front(), *f1);
  line.Leave(*f1);
  EXPECT_EQ(line.front(), *m1);
  line.Leave(*m1);
  EXPECT_EQ(line.front(), *q2);
  line.Leave(*q2);
  line.Leave(*f2);
  EXPECT_EQ(line.waiting(), 0);
}

TEST(AdmissionLineTest, ALineOfZeroRefusesEveryWait) {
  AdmissionLine line(0);
  EXPECT_FALSE(line.Join());
  EXPECT_TRUE(line.MayLook(0));
}

TEST(RunningSharesTest, AWaitingTenantTakesTheNewestPlaceOfTheLargest) {
  RunningShares s;
  for (uint64_t id = 1; id <= 5; ++id) s.Add("flood", id);
  s.Add("mid", 6);
  s.Add("mid", 7);
  EXPECT_EQ(s.running("flood"), 5);
  EXPECT_TRUE(s.FarBelow("quiet", "flood"));
  EXPECT_TRUE(s.FarBelow("quiet", "mid"));
  EXPECT_FALSE(s.FarBelow("flood", "quiet"));
  EXPECT_EQ(s.VictimFor("quiet"), 5u) << "the flood's newest";
  EXPECT_EQ(s.VictimFor("mid"), 5u);
  EXPECT_EQ(s.VictimFor("flood"), std::nullopt) << "mid streams 2, flood 5: it never takes";
  s.Remove("flood", 5);
  s.Remove("flood", 4);
  s.Remove("flood", 3);  // flood 2, mid 2
  EXPECT_EQ(s.VictimFor("mid"), std::nullopt) << "one apart at most: shares do not flip";
  const std::optional<uint64_t> tie = s.VictimFor("quiet");
  EXPECT_TRUE(tie == 2u || tie == 7u) << "a tie: one of the largest, its newest";
  s.Add("quiet", 8);
  EXPECT_FALSE(s.FarBelow("quiet", "mid")) << "2 against 1";
  EXPECT_EQ(s.VictimFor("quiet"), std::nullopt) << "2 against 1";
  s.Remove("quiet", 8);
  s.Remove("nobody", 1);  // unknown: ignored
  EXPECT_EQ(s.running("quiet"), 0);
}

TEST(NeverFitsTest, OnlyWhenEveryCacheIsSmaller) {
  EXPECT_FALSE(NeverFits(0, 1 << 20));  // no worker has reported yet: it may fit
  EXPECT_FALSE(NeverFits(4096, 4096));
  EXPECT_FALSE(NeverFits(4096, 100));
  const auto why = NeverFits(4096, 5000);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("5000"), std::string::npos);
  EXPECT_NE(why->find("4096"), std::string::npos);
}

}  // namespace
}  // namespace tandem
