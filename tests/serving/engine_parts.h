// stories260K on the CPU and a KV sender with the test cluster's credentials: what the tests of
// the workers' engines behind their services start from.
#ifndef TANDEM_TESTS_SERVING_ENGINE_PARTS_H_
#define TANDEM_TESTS_SERVING_ENGINE_PARTS_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/model.h"
#include "kv_transfer/kv_transfer.h"
#include "tests/cluster_auth.h"
#include "tests/test_util.h"

namespace tandem::testing {

// A fixture's start: stories260K on the CPU and a tcp KV sender with the test cluster's
// credentials (derived fixtures that override SetUp call this one first).
class StoriesEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(Stories260K(), backend_.get()));
    KvSenderOptions so;
    so.auth.secret = TestClusterSecret();
    auto sender = MakeKvSender("tcp", so);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvSender> sender_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SERVING_ENGINE_PARTS_H_
