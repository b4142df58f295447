// Bearer API keys for the public APIs (gRPC Generation and the HTTP API): a file with one key
// per line ('#' starts a comment, blank lines ignored), optionally followed by the key's limits:
//   KEY [max_concurrent=N] [max_n=N] [tokens_per_minute=N]
// A request is allowed when its `authorization` header is "Bearer KEY" for one of the keys. No
// gRPC here: both front ends use it.
#ifndef TANDEM_RPC_API_KEYS_H_
#define TANDEM_RPC_API_KEYS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// What one key may use (0: no limit): generations in flight at once (each choice of an HTTP
// request counts), choices per HTTP request (`n`, `best_of`), and tokens (prompt and generated)
// per minute.
struct KeyLimits {
  int max_concurrent = 0;
  int max_n = 0;
  int64_t tokens_per_minute = 0;
  bool any() const { return max_concurrent > 0 || max_n > 0 || tokens_per_minute > 0; }
};

class ApiKeys {
 public:
  // No keys: every request is allowed (auth off).
  ApiKeys() = default;
  // Reads `path`. Errors: unreadable file, a file with no key, a key with a character that is
  // not printable or shorter than 16 characters, a limit that is unknown or not a positive
  // number (the line number is named).
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  static absl::StatusOr<ApiKeys> Parse(absl::string_view text);

  bool enabled() const { return !keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // True when auth is off, or `authorization` is "Bearer <key>" (scheme case-insensitive) for
  // a known key. The key comparison takes the same time wherever the first difference is.
  bool Allows(absl::string_view authorization) const;
  // The limits of the key `authorization` presents; none (all 0) when auth is off or the key is
  // unknown.
  KeyLimits LimitsOf(absl::string_view authorization) const;
  // The key an `authorization` header value presents ("Bearer KEY", the scheme
  // case-insensitive, surrounding whitespace ignored); empty when it presents none.
  static absl::string_view BearerToken(absl::string_view authorization);

 private:
  // The index of the key `authorization` presents, or -1 (every key compared, in constant time).
  int Find(absl::string_view authorization) const;
  std::vector<std::string> keys_;
  std::vector<KeyLimits> limits_;  // keys_'s
};

}  // namespace tandem

#endif  // TANDEM_RPC_API_KEYS_H_
