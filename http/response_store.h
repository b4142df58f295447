// Stored responses of the Responses API (store, previous_response_id, GET and DELETE
// /v1/responses/{id}), held in the router's memory: each under its caller's scope (the API key
// where keys are checked: one tenant never reads another's), for `ttl` after it was made, and
// within `max_bytes` over all of them (the oldest go first). Lost when the router restarts.
// Thread-safe; the clock is the caller's.
#ifndef TANDEM_HTTP_RESPONSE_STORE_H_
#define TANDEM_HTTP_RESPONSE_STORE_H_

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {

struct StoredResponse {
  nlohmann::ordered_json object;    // the response object, as GET returns it
  nlohmann::ordered_json messages;  // the conversation so far as chat messages, its answer last
};

class ResponseStore {
 public:
  struct Limits {
    size_t max_bytes = size_t{64} << 20;
    absl::Duration ttl = absl::Hours(1);
  };
  explicit ResponseStore(Limits limits) : limits_(limits) {}

  void Put(const std::string& scope, const std::string& id, StoredResponse response,
           absl::Time now);
  // nullopt when there is none in `scope` (never stored, expired, evicted or deleted).
  std::optional<StoredResponse> Get(const std::string& scope, const std::string& id,
                                    absl::Time now);
  bool Delete(const std::string& scope, const std::string& id);

  size_t size() const;
  size_t bytes() const;
  const Limits& limits() const { return limits_; }

 private:
  struct Entry {
    StoredResponse response;
    size_t bytes = 0;
    absl::Time expires;
  };
  using Key = std::pair<std::string, std::string>;  // scope, id
  void DropLocked(const Key& key);
  void ExpireLocked(absl::Time now);

  const Limits limits_;
  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;
  std::deque<Key> order_;  // oldest first; keys already dropped are skipped
  size_t bytes_ = 0;
};

}  // namespace tandem::openai

#endif  // TANDEM_HTTP_RESPONSE_STORE_H_
