// Bearer API keys for the public APIs (gRPC Generation and the HTTP API): a file with one key
// per line ('#' starts a comment, blank lines ignored). A request is allowed when its
// `authorization` header is "Bearer KEY" for one of the keys. No gRPC here: both front ends use
// it.
#ifndef TANDEM_RPC_API_KEYS_H_
#define TANDEM_RPC_API_KEYS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

class ApiKeys {
 public:
  // No keys: every request is allowed (auth off).
  ApiKeys() = default;
  // Reads `path`. Errors: unreadable file, a file with no key, a key with whitespace inside or
  // shorter than 16 characters (the line number is named).
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  static absl::StatusOr<ApiKeys> Parse(absl::string_view text);

  bool enabled() const { return !keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // True when auth is off, or `authorization` is "Bearer <key>" (scheme case-insensitive) for
  // a known key. The key comparison takes the same time wherever the first difference is.
  bool Allows(absl::string_view authorization) const;
  // The key an `authorization` header value presents ("Bearer KEY", the scheme
  // case-insensitive, surrounding whitespace ignored); empty when it presents none.
  static absl::string_view BearerToken(absl::string_view authorization);

 private:
  std::vector<std::string> keys_;
};

}  // namespace tandem

#endif  // TANDEM_RPC_API_KEYS_H_
