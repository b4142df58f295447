#include "http/client_address.h"

#include <arpa/inet.h>

#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "router/request_id.h"
#include "rpc/api_keys.h"

namespace tandem {
namespace {

std::string_view Trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

// The pieces of `v` between `sep`s, trimmed; empty ones kept.
std::vector<std::string_view> Split(std::string_view v, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t at = v.find(sep);
    out.push_back(Trim(v.substr(0, at)));
    if (at == std::string_view::npos) return out;
    v.remove_prefix(at + 1);
  }
}

// An IPv4 or IPv6 address as 16 bytes (IPv4 mapped into ::ffff:0:0/96).
std::optional<std::array<uint8_t, 16>> ParseIp(std::string_view text) {
  const std::string s(text);
  std::array<uint8_t, 16> out{};
  in_addr v4{};
  if (::inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &v4, 4);
    return out;
  }
  if (::inet_pton(AF_INET6, s.c_str(), out.data()) == 1) return out;
  return std::nullopt;
}

// One element of a forwarding chain without its port, brackets or quotes ("[::1]:80" -> "::1",
// "1.2.3.4:80" -> "1.2.3.4").
std::string_view BareAddress(std::string_view v) {
  v = Trim(v);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    return close == std::string_view::npos ? v : v.substr(1, close - 1);
  }
  if (v.find(':') != v.rfind(':')) return v;  // IPv6 without brackets: no port
  return v.substr(0, v.find(':'));
}

// The addresses a proxy chain names, nearest the client first: X-Forwarded-For, else the for=
// parameters of Forwarded.
std::vector<std::string_view> ForwardedChain(const HttpRequest& head) {
  std::vector<std::string_view> chain;
  if (std::string_view xff = head.Header("x-forwarded-for"); !xff.empty()) {
    for (std::string_view hop : Split(xff, ',')) chain.push_back(BareAddress(hop));
    return chain;
  }
  for (std::string_view element : Split(head.Header("forwarded"), ',')) {
    for (std::string_view pair : Split(element, ';')) {
      if (pair.size() > 4 && absl::EqualsIgnoreCase(absl::string_view(pair.data(), 4), "for=")) {
        chain.push_back(BareAddress(pair.substr(4)));
      }
    }
  }
  return chain;
}

}  // namespace

absl::StatusOr<TrustedProxies> TrustedProxies::Parse(std::string_view list) {
  TrustedProxies proxies;
  for (std::string_view entry : Split(list, ',')) {
    if (entry.empty()) continue;
    std::string_view address = entry;
    int bits = -1;
    if (const size_t slash = entry.find('/'); slash != std::string_view::npos) {
      address = entry.substr(0, slash);
      const std::string_view digits = entry.substr(slash + 1);
      if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &bits)) bits = -2;
    }
    const std::optional<std::array<uint8_t, 16>> ip = ParseIp(address);
    const bool v4 = address.find(':') == std::string_view::npos;
    if (!ip || bits < -1 || bits > (v4 ? 32 : 128)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--trusted-proxies: \"%s\" is not an IP address or CIDR range", entry));
    }
    Range r;
    r.bytes = *ip;
    r.prefix_bits = bits < 0 ? 128 : (v4 ? 96 + bits : bits);
    proxies.ranges_.push_back(r);
  }
  return proxies;
}

bool TrustedProxies::Contains(std::string_view address) const {
  const std::optional<std::array<uint8_t, 16>> ip = ParseIp(address);
  if (!ip) return false;
  for (const Range& r : ranges_) {
    bool inside = true;
    for (int bit = 0; bit < r.prefix_bits && inside; bit += 8) {
      const int take = std::min(8, r.prefix_bits - bit);
      const uint8_t mask = static_cast<uint8_t>(0xff00 >> take);
      inside = ((*ip)[bit / 8] & mask) == (r.bytes[bit / 8] & mask);
    }
    if (inside) return true;
  }
  return false;
}

std::string ClientAddress(const HttpRequest& head, const TrustedProxies& proxies) {
  if (proxies.empty() || !proxies.Contains(head.peer)) return head.peer;
  const std::vector<std::string_view> chain = ForwardedChain(head);
  for (auto hop = chain.rbegin(); hop != chain.rend(); ++hop) {
    if (!ParseIp(*hop)) return head.peer;  // a chain we cannot read names nobody
    if (!proxies.Contains(*hop)) return std::string(*hop);
  }
  return chain.empty() ? head.peer : std::string(chain.front());
}

std::string TenantOf(const HttpRequest& head, const TrustedProxies& proxies, bool by_key) {
  if (std::string_view auth = head.Header("authorization"); by_key && !auth.empty()) {
    const absl::string_view key = ApiKeys::BearerToken(absl::string_view(auth.data(), auth.size()));
    return CallerNamespace(std::string_view(key.data(), key.size()), "");
  }
  return "addr:" + ClientAddress(head, proxies);
}

}  // namespace tandem
