#include "router/request_id.h"

#include "security/cluster_secret.h"

namespace tandem {

std::string NewRequestId() { return "req-" + HexEncode(RandomBytes(16)); }

std::string CallerNamespace(std::string_view api_key, std::string_view peer) {
  if (!api_key.empty()) return "key:" + HexEncode(Sha256(api_key)).substr(0, 32);
  std::string out = "peer:";
  for (char c : peer) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

std::string ScopedRequestId(std::string_view caller, std::string_view client_id) {
  if (client_id.empty()) return NewRequestId();
  std::string out(caller.empty() ? std::string_view("local") : caller);
  out += '/';
  out.append(client_id);
  return out;
}

}  // namespace tandem
