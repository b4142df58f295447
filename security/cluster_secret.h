// The cluster secret: a key every process of one cluster holds (`--cluster-secret-file`), with
// which internal calls and KV connections prove that they come from the cluster. Proofs are
// HMAC-SHA256 over a fresh challenge or a timestamped nonce, so the secret itself never crosses
// the network and a recorded proof cannot be replayed.
#ifndef TANDEM_SECURITY_CLUSTER_SECRET_H_
#define TANDEM_SECURITY_CLUSTER_SECRET_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

class ClusterSecret {
 public:
  static constexpr size_t kMinBytes = 32;
  static constexpr size_t kMacBytes = 32;

  // The file's content with surrounding whitespace removed; INVALID_ARGUMENT naming
  // --cluster-secret-file when the file cannot be read or holds fewer than kMinBytes.
  static absl::StatusOr<ClusterSecret> Load(const std::string& path);
  static absl::StatusOr<ClusterSecret> FromText(std::string_view text);
  // A new random secret (64 hex characters).
  static ClusterSecret Generate();
  // Generate, written to `path` (created with mode 0600; an existing file is replaced).
  static absl::StatusOr<ClusterSecret> GenerateFile(const std::string& path);

  // HMAC-SHA256 keyed by the secret over `label`, a zero byte, then `message`: kMacBytes bytes.
  // The label keeps proofs made for one purpose from being valid for another.
  std::string Mac(std::string_view label, std::string_view message) const;
  // Whether `mac` is Mac(label, message), in time independent of where they differ.
  bool Verify(std::string_view label, std::string_view message, std::string_view mac) const;

  // A key for one purpose derived from the secret: HMAC-SHA256(secret, label, context), kMacBytes
  // bytes. Session keys are derived this way, so the secret itself keys nothing on the wire.
  std::string DeriveKey(std::string_view label, std::string_view context) const {
    return Mac(label, context);
  }

  const std::string& text() const { return key_; }

 private:
  explicit ClusterSecret(std::string key) : key_(std::move(key)) {}
  std::string key_;
};

// HMAC-SHA256 under any key, fed in pieces (a KV frame: its counter, header, payload).
class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  // Starts a new MAC under the same key (what Update fed before is dropped).
  void Reset();
  void Update(std::string_view bytes);
  // The MAC of everything fed since the last Reset (kMacBytes bytes); Reset before reuse.
  std::string Final();

 private:
  void* base_;  // EVP_MAC_CTX keyed once
  void* ctx_;   // the MAC in progress, a copy of base_
};

// SHA-256 of `bytes` (32 bytes).
std::string Sha256(std::string_view bytes);

// `n` bytes from the operating system's cryptographic random source.
std::string RandomBytes(size_t n);
// Equality in time independent of where the strings differ (their lengths may leak).
bool ConstantTimeEquals(std::string_view a, std::string_view b);
std::string HexEncode(std::string_view bytes);
// nullopt for an odd length or a non-hex character.
std::optional<std::string> HexDecode(std::string_view hex);

}  // namespace tandem

#endif  // TANDEM_SECURITY_CLUSTER_SECRET_H_
