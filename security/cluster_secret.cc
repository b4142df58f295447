#include "security/cluster_secret.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tandem {

absl::StatusOr<ClusterSecret> ClusterSecret::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--cluster-secret-file: cannot read %s: %s", path, std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  auto s = FromText(text.str());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--cluster-secret-file: %s: %s (make one with `openssl rand -hex 32 > %s`)",
                        path, s.status().message(), path));
  }
  return s;
}

absl::StatusOr<ClusterSecret> ClusterSecret::FromText(std::string_view text) {
  const std::string key(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  if (key.size() < kMinBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the secret has %d bytes; a cluster secret needs at least %d", key.size(), kMinBytes));
  }
  return ClusterSecret(key);
}

ClusterSecret ClusterSecret::Generate() { return ClusterSecret(HexEncode(RandomBytes(32))); }

absl::StatusOr<ClusterSecret> ClusterSecret::GenerateFile(const std::string& path) {
  ClusterSecret s = Generate();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot create %s: %s", path, std::strerror(errno)));
  }
  const std::string line = s.key_ + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return absl::InternalError(absl::StrFormat("cannot write %s", path));
  return s;
}

std::string ClusterSecret::Mac(std::string_view label, std::string_view message) const {
  std::string input;
  input.reserve(label.size() + 1 + message.size());
  input.append(label);
  input.push_back('\0');
  input.append(message);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

bool ClusterSecret::Verify(std::string_view label, std::string_view message,
                           std::string_view mac) const {
  return ConstantTimeEquals(Mac(label, message), mac);
}

namespace {

EVP_MAC_CTX* NewHmacContext(std::string_view key) {
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = hmac == nullptr ? nullptr : EVP_MAC_CTX_new(hmac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  if (ctx == nullptr || EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()),
                                     key.size(), params) != 1) {
    std::fprintf(stderr, "tandem: OpenSSL has no HMAC-SHA256\n");
    std::abort();
  }
  return ctx;
}

}  // namespace

HmacSha256::HmacSha256(std::string_view key)
    : base_(NewHmacContext(key)), ctx_(EVP_MAC_CTX_dup(static_cast<EVP_MAC_CTX*>(base_))) {}

HmacSha256::~HmacSha256() {
  EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(ctx_));
  EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(base_));
}

void HmacSha256::Reset() {
  EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(ctx_));
  ctx_ = EVP_MAC_CTX_dup(static_cast<EVP_MAC_CTX*>(base_));
}

void HmacSha256::Update(std::string_view bytes) {
  EVP_MAC_update(static_cast<EVP_MAC_CTX*>(ctx_),
                 reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

std::string HmacSha256::Final() {
  std::string out(ClusterSecret::kMacBytes, '\0');
  size_t len = 0;
  EVP_MAC_final(static_cast<EVP_MAC_CTX*>(ctx_), reinterpret_cast<unsigned char*>(out.data()), &len,
                out.size());
  out.resize(len);
  return out;
}

std::string Sha256(std::string_view bytes) {
  std::string out(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
         reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1) {
    return out;
  }
  // OpenSSL's generator failed to seed: read the kernel's directly.
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (errno != EINTR) {
      std::fprintf(stderr, "tandem: no cryptographic random source: %s\n", std::strerror(errno));
      std::abort();
    }
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HexEncode(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace tandem
