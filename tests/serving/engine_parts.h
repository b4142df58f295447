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

// The model, its backend and a KV sender of `kind` ("tcp", "local").
struct StoriesEngineParts {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvSender> sender;

  static StoriesEngineParts Make(const std::string& kind = "tcp") {
    StoriesEngineParts p;
    p.backend = MakeCpuBackend();
    p.model = std::move(*Model::Load(Stories260K(), p.backend.get()));
    KvSenderOptions so;
    so.auth.secret = TestClusterSecret();
    auto sender = MakeKvSender(kind, so);
    EXPECT_TRUE(sender.ok()) << sender.status();
    if (sender.ok()) p.sender = std::move(*sender);
    return p;
  }
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SERVING_ENGINE_PARTS_H_
