// Driving a prefill engine and a decode engine in process the way the router drives the
// workers (admit, prefill into the lease, start, read to the end): shared by the engine tests.
#ifndef TANDEM_TESTS_SERVING_ENGINE_PAIR_H_
#define TANDEM_TESTS_SERVING_ENGINE_PAIR_H_

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "decode_node/decode_engine.h"
#include "engine/generator.h"
#include "prefill_node/prefill_engine.h"

namespace tandem::testing {

// Holds each of `n` callers in Arrive until all have arrived (or `timeout` has passed, so a
// caller that never comes cannot hang a test): requests that should decode side by side start
// their decoding together however the threads happen to be scheduled.
class StartGate {
 public:
  explicit StartGate(int n) : waiting_(n) {}
  void Arrive(absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    --waiting_;
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](int* waiting) { return *waiting <= 0; }, &waiting_),
                         timeout);
  }

 private:
  absl::Mutex mu_;
  int waiting_;
};

// The generated ids (the first from the prefill) or the first error; `cached` (optional) gets
// the prompt tokens the prefill found in its prefix cache. With a `gate`, the request waits there
// between its prefill and its decoding (a failed one arrives as it returns).
inline absl::StatusOr<std::vector<int>> RunPrefillThenDecode(PrefillEngine* prefill,
                                                             DecodeEngine* decode,
                                                             const GenerationRequest& r,
                                                             int* cached = nullptr,
                                                             StartGate* gate = nullptr) {
  struct Arrival {  // exactly once, on every path
    StartGate* gate;
    void Now() {
      if (gate) gate->Arrive();
      gate = nullptr;
    }
    ~Arrival() { Now(); }
  } arrival{gate};
  // A full worker, or one whose preempted requests go first, refuses with RESOURCE_EXHAUSTED;
  // the router's queue then waits and tries again (router/router.cc), and so does this.
  auto adm = decode->Admit(r);
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       !adm.ok() && adm.status().code() == absl::StatusCode::kResourceExhausted &&
       absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(5));
    adm = decode->Admit(r);
  }
  if (!adm.ok()) return adm.status();
  auto pre = prefill->Prefill(adm->handle, r.prompt, r.sampling, adm->target,
                              absl::Now() + absl::Seconds(30));
  if (!pre.ok()) {
    decode->Cancel(adm->handle);
    return pre.status();
  }
  if (cached) *cached = pre->cached_tokens;
  std::vector<int> out = {pre->first_token};
  arrival.Now();
  if (absl::Status s = decode->Start(adm->handle, pre->first_token); !s.ok()) {
    decode->Cancel(adm->handle);  // as the decode service's guard does
    return s;
  }
  for (;;) {
    DecodeEngine::Output o = decode->Next(adm->handle, absl::Seconds(10));
    out.insert(out.end(), o.tokens.begin(), o.tokens.end());
    if (!o.error.ok()) return o.error;
    if (o.finish) return out;
  }
}

// Every request through the pair at once, a thread each (prompts share prefill steps and decode
// steps): RunPrefillThenDecode's results, in order. With `start_together`, no request starts
// decoding before every prompt is prefilled, so all of them grow their KV at once (a test that
// needs the decode engine to preempt gets it however the threads are scheduled).
inline std::vector<absl::StatusOr<std::vector<int>>> RunConcurrently(
    PrefillEngine* prefill, DecodeEngine* decode, const std::vector<GenerationRequest>& reqs,
    bool start_together = false) {
  std::vector<absl::StatusOr<std::vector<int>>> got(reqs.size(), absl::UnknownError("not run"));
  StartGate gate(static_cast<int>(reqs.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      got[i] =
          RunPrefillThenDecode(prefill, decode, reqs[i], nullptr, start_together ? &gate : nullptr);
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

// RunConcurrently through the pair gives, request by request, the tokens of the engine alone
// (a Generator on `model`); returns the engine alone's outputs (empty if it failed).
inline std::vector<GenerationOutput> ExpectTokensOfTheEngineAlone(
    const Model* model, PrefillEngine* prefill, DecodeEngine* decode,
    const std::vector<GenerationRequest>& reqs, bool start_together = false) {
  Generator alone(model, nullptr, {});
  auto want = alone.Generate(reqs);
  EXPECT_TRUE(want.ok()) << want.status();
  if (!want.ok()) return {};
  const auto got = RunConcurrently(prefill, decode, reqs, start_together);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].status();
    if (got[i].ok()) {
      EXPECT_EQ(*got[i], (*want)[i].tokens) << "request " << i;
    }
  }
  return *std::move(want);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_SERVING_ENGINE_PAIR_H_
