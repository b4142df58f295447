// WorkerRegistry: forgetting workers that stopped heartbeating, next to the health rules it
// builds on; the integrity rules (ids, load claims, KV endpoints).
#include "router/registry.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

WorkerLoadSnapshot Load(int free_blocks) {
  WorkerLoadSnapshot l;
  l.block_size = 16;
  l.free_blocks = free_blocks;
  l.total_blocks = free_blocks;
  return l;
}

RegistryOptions Options() {
  RegistryOptions o;
  o.heartbeat_timeout = absl::Seconds(3);
  o.forget_after = absl::Seconds(30);
  return o;
}

std::vector<std::string> Ids(const WorkerRegistry& r) {
  std::vector<std::string> ids;
  for (const WorkerEntry* w : r.List()) ids.push_back(w->id);
  return ids;
}

TEST(RegistryForget, SilentWorkerIsUnhealthyThenForgotten) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(100), t0).ok());
  ASSERT_TRUE(r.Register("d2", WorkerRole::kDecode, "10.0.0.2:7000", Load(100), t0).ok());
  // d2 keeps heartbeating, d1 goes silent.
  for (int s = 1; s <= 40; ++s) {
    ASSERT_TRUE(r.Heartbeat("d2", Load(100), true, t0 + absl::Seconds(s)));
  }
  const absl::Time unhealthy = t0 + absl::Seconds(4);
  EXPECT_FALSE(r.Healthy(*r.Find("d1"), unhealthy));
  EXPECT_TRUE(r.ForgetSilent(unhealthy).empty()) << "unhealthy is not yet forgotten";
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"d1", "d2"}));
  // Exactly at forget_after it is kept; past it, it is removed and returned.
  EXPECT_TRUE(r.ForgetSilent(t0 + absl::Seconds(30)).empty());
  const std::vector<WorkerEntry> gone = r.ForgetSilent(t0 + absl::Seconds(31));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, "d1");
  EXPECT_EQ(gone[0].address, "10.0.0.1:7000");
  EXPECT_EQ(gone[0].role, WorkerRole::kDecode);
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"d2"}));
  EXPECT_EQ(r.Find("d1"), nullptr);
  // A forgotten worker's heartbeat is refused: it must register again.
  EXPECT_FALSE(r.Heartbeat("d1", Load(100), true, t0 + absl::Seconds(32)));
  ASSERT_TRUE(
      r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(100), t0 + absl::Seconds(33))
          .ok());
  EXPECT_TRUE(r.Healthy(*r.Find("d1"), t0 + absl::Seconds(33)));
  EXPECT_EQ(r.CountHealthy(WorkerRole::kDecode, t0 + absl::Seconds(33)), 2);
}

TEST(RegistryForget, ForgottenWorkersAreNeverPicked) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("p1", WorkerRole::kPrefill, "10.0.0.1:1", Load(10), t0).ok());
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.2:1", Load(10), t0).ok());
  const absl::Time later = t0 + absl::Minutes(5);
  const std::vector<WorkerEntry> gone = r.ForgetSilent(later);
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].id, "d1");  // sorted by id
  EXPECT_EQ(gone[1].id, "p1");
  EXPECT_TRUE(r.List().empty());
  EXPECT_FALSE(r.PickDecode(16, 16, later, {}).has_value());
  EXPECT_FALSE(r.PickPrefill({}, later, {}).has_value());
  EXPECT_EQ(r.PrefillBlockSize(), 0);
  // Reporting on a forgotten id is harmless.
  r.ReportFailure("d1", later);
  r.ReportSuccess("p1");
  EXPECT_TRUE(r.List().empty());
}

TEST(RegistryForget, NotServingWorkerThatStillHeartbeatsIsKept) {
  // A draining worker (serving=false) is unhealthy but alive: it stays registered.
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:1", Load(10), t0).ok());
  for (int s = 1; s <= 60; ++s) r.Heartbeat("d1", Load(10), false, t0 + absl::Seconds(s));
  const absl::Time now = t0 + absl::Seconds(60);
  EXPECT_FALSE(r.Healthy(*r.Find("d1"), now));
  EXPECT_TRUE(r.ForgetSilent(now).empty());
  EXPECT_EQ(Ids(r), (std::vector<std::string>{"d1"}));
}

TEST(RegistryForget, InfiniteForgetAfterKeepsEveryone) {
  RegistryOptions o = Options();
  o.forget_after = absl::InfiniteDuration();
  WorkerRegistry r(o);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:1", Load(10), t0).ok());
  EXPECT_TRUE(r.ForgetSilent(t0 + absl::Hours(24 * 365)).empty());
  EXPECT_EQ(r.List().size(), 1u);
}

// Mixed KV transports or dtypes: a prefill worker cannot send KV to a decode worker of another
// transport or KV dtype, so the router refuses the newcomer; workers that did not say never
// conflict.
TEST(RegistryKvSettings, AWorkerOfAnotherTransportOrDtypeConflicts) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(r.FindKvConflict("p1", "nccl", "f32").other, nullptr);  // empty registry
  ASSERT_TRUE(r.Register("p1", WorkerRole::kPrefill, "p1:1", Load(100), t0).ok());
  r.SetKvSettings("p1", "nccl", "bf16");
  ASSERT_TRUE(r.Register("old", WorkerRole::kDecode, "old:1", Load(100), t0).ok());  // did not say
  EXPECT_EQ(r.FindKvConflict("d1", "nccl", "bf16").other, nullptr);
  WorkerRegistry::KvConflict c = r.FindKvConflict("d1", "tcp", "bf16");
  ASSERT_NE(c.other, nullptr);
  EXPECT_EQ(c.other->id, "p1");
  EXPECT_STREQ(c.field, "kv_transport");
  c = r.FindKvConflict("d1", "nccl", "fp8");
  ASSERT_NE(c.other, nullptr);
  EXPECT_STREQ(c.field, "kv_dtype");
  EXPECT_EQ(c.other->kv_dtype, "bf16");
  EXPECT_EQ(r.FindKvConflict("d1", "", "").other, nullptr);
  // A worker re-registering with other settings conflicts only with the others.
  EXPECT_EQ(r.FindKvConflict("p1", "tcp", "f32").other, nullptr);
  // Once the nccl worker is forgotten, tcp workers may join.
  r.ForgetSilent(t0 + absl::Seconds(31));
  EXPECT_EQ(r.FindKvConflict("d1", "tcp", "f32").other, nullptr);
}

// Registry integrity: a live worker's id cannot be taken over from another address or identity;
// once it is silent past the heartbeat timeout, it can (a restarted pod keeps its name).
TEST(RegistryIntegrity, LiveWorkerIdCannotBeTakenOver) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(10), t0,
                         {"CN=d1 [decode]", "tcp://10.0.0.1:7100"})
                  .ok());
  const absl::Time t1 = t0 + absl::Seconds(1);
  EXPECT_EQ(r.Register("d1", WorkerRole::kDecode, "10.9.9.9:7000", Load(1000), t1,
                       {"CN=d1 [decode]", "tcp://10.9.9.9:7100"})
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(1000), t1,
                       {"CN=evil [decode]", "tcp://10.0.0.1:7100"})
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Find("d1")->address, "10.0.0.1:7000");
  EXPECT_EQ(r.Find("d1")->load.total_blocks, 10);
  // Another identity's heartbeats are not the worker's: refused (it would have to register).
  EXPECT_FALSE(r.Heartbeat("d1", Load(1000), true, t1, false, "CN=evil [decode]"));
  EXPECT_TRUE(r.Heartbeat("d1", Load(10), true, t1, false, "CN=d1 [decode]"));
  // The same worker registering again (it restarted at the same address) is fine.
  EXPECT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(10), t1,
                         {"CN=d1 [decode]", "tcp://10.0.0.1:7100"})
                  .ok());
  // Silent past the heartbeat timeout: gone, the id is free again.
  EXPECT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.2:7000", Load(10),
                         t1 + absl::Seconds(4), {"CN=d1 [decode]", "tcp://10.0.0.2:7100"})
                  .ok());
  EXPECT_EQ(r.Find("d1")->address, "10.0.0.2:7000");
}

TEST(RegistryIntegrity, LoadClaimsAreBoundedByTheRegisteredCapacity) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:1", Load(100), t0).ok());
  ASSERT_TRUE(r.Register("d2", WorkerRole::kDecode, "10.0.0.2:1", Load(100), t0).ok());
  WorkerLoadSnapshot claim = Load(1 << 30);
  claim.block_size = 1;
  claim.running = -7;
  claim.queue_depth = -3;
  ASSERT_TRUE(r.Heartbeat("d1", claim, true, t0));
  const WorkerEntry* d1 = r.Find("d1");
  EXPECT_EQ(d1->load.total_blocks, 100);
  EXPECT_EQ(d1->load.free_blocks, 100);
  EXPECT_EQ(d1->load.block_size, 16);
  EXPECT_EQ(d1->load.running, 0);
  EXPECT_EQ(d1->load.queue_depth, 0);
  // The claim cannot win routing beyond what the worker has: 101 blocks fit nowhere.
  EXPECT_FALSE(r.PickDecode(100 * 16, 100 * 16, t0, {}).has_value());
  EXPECT_EQ(r.LargestDecodeTokens(t0), 100 * 16);
}

// A decode worker that reserves prompt + max_tokens at admission is picked only when those
// blocks are free; an on-demand one when the prompt's are (and the watermark stays free).
TEST(RegistryPick, DecodeRoomFollowsTheWorkersAdmission) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WorkerLoadSnapshot reserve = Load(100);
  reserve.reserves_max_tokens = true;
  ASSERT_TRUE(r.Register("reserve", WorkerRole::kDecode, "10.0.0.1:1", reserve, t0).ok());
  reserve.free_blocks = 10;
  ASSERT_TRUE(r.Heartbeat("reserve", reserve, true, t0));
  // 32 prompt tokens, up to 1024: 3 blocks on demand, 64 reserved.
  EXPECT_FALSE(r.PickDecode(32, 1024, t0, {}).has_value());
  EXPECT_EQ(r.PickDecode(32, 160, t0, {}), "reserve");  // 10 blocks: it fits
  // The pick took 3 blocks and promised 7 until the next heartbeat: no room for another.
  EXPECT_FALSE(r.PickDecode(32, 160, t0, {}).has_value());
  WorkerLoadSnapshot on_demand = Load(100);
  ASSERT_TRUE(r.Register("on-demand", WorkerRole::kDecode, "10.0.0.2:1", on_demand, t0).ok());
  on_demand.free_blocks = 10;
  on_demand.watermark_blocks = 7;
  ASSERT_TRUE(r.Heartbeat("on-demand", on_demand, true, t0));
  EXPECT_EQ(r.PickDecode(32, 1024, t0, {}), "on-demand");    // 3 blocks + 7 kept free
  EXPECT_FALSE(r.PickDecode(32, 1024, t0, {}).has_value());  // the pick took 3
}

// A decode worker whose model keeps sliding-window KV in layer groups (a full group and a
// sliding one of window 64, blocks of 16): a sequence costs a full group's blocks for every
// token and the sliding group's for the window only, and the worker's capacity in tokens
// follows. The layout is the registered one; a heartbeat cannot change it, and a layout the
// router cannot use counts as one group.
TEST(RegistryPick, DecodeRoomFollowsTheWorkersLayerGroups) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  WorkerLoadSnapshot grouped = Load(100);
  grouped.kv_group_window = {0, 64};
  ASSERT_TRUE(r.Register("d", WorkerRole::kDecode, "10.0.0.1:1", grouped, t0).ok());
  // 1000 prompt tokens + 1: 63 full blocks and 5 sliding ones (positions 937..1000).
  grouped.free_blocks = 67;
  ASSERT_TRUE(r.Heartbeat("d", grouped, true, t0));
  EXPECT_FALSE(r.PickDecode(1000, 1001, t0, {}).has_value());
  grouped.free_blocks = 68;
  grouped.kv_group_window = {0, 0};  // claims one cannot change the registered layout
  ASSERT_TRUE(r.Heartbeat("d", grouped, true, t0));
  EXPECT_EQ(r.PickDecode(1000, 1001, t0, {}), "d");
  // 100 blocks: 95 of the full group (1520 tokens) beside the sliding group's 5 at most.
  EXPECT_EQ(r.LargestDecodeTokens(t0), 1520);

  WorkerLoadSnapshot hostile = Load(100);
  hostile.kv_group_window = {0, -5};
  ASSERT_TRUE(r.Register("h", WorkerRole::kDecode, "10.0.0.2:1", hostile, t0).ok());
  EXPECT_TRUE(r.Find("h")->load.kv_group_window.empty());
  hostile.kv_group_window.assign(5000, 1);
  ASSERT_TRUE(r.Register("h2", WorkerRole::kDecode, "10.0.0.3:1", hostile, t0).ok());
  EXPECT_TRUE(r.Find("h2")->load.kv_group_window.empty());
}

TEST(RegistryIntegrity, KvEndpointMustBeOnTheWorkersHost) {
  WorkerRegistry r(Options());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(r.Register("d1", WorkerRole::kDecode, "10.0.0.1:7000", Load(10), t0,
                       {"", "tcp://203.0.113.5:7100"})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Find("d1"), nullptr);
  EXPECT_TRUE(r.Register("d1", WorkerRole::kDecode, "[fd00::1]:7000", Load(10), t0,
                         {"", "tcp://[fd00::1]:7100"})
                  .ok());
  EXPECT_TRUE(r.Register("d2", WorkerRole::kDecode, "10.0.0.2:7000", Load(10), t0,
                         {"", "nccl://10.0.0.2:7000"})
                  .ok());
  EXPECT_TRUE(
      r.Register("d3", WorkerRole::kDecode, "10.0.0.3:7000", Load(10), t0, {"", "local://decode-3"})
          .ok());
}

}  // namespace
}  // namespace tandem
