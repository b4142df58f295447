#include "router/admission.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem {

std::optional<uint64_t> AdmissionLine::Join() {
  if (waiting() >= max_queued_) return std::nullopt;
  order_.push_back(next_ticket_);
  return next_ticket_++;
}

bool AdmissionLine::MayLook(uint64_t ticket) const {
  return order_.empty() || (ticket != 0 && order_.front() == ticket);
}

void AdmissionLine::Leave(uint64_t ticket) {
  if (ticket == 0) return;
  auto it = std::find(order_.begin(), order_.end(), ticket);
  if (it != order_.end()) order_.erase(it);
}

std::optional<std::string> NeverFits(int64_t largest_tokens, int64_t total_tokens) {
  if (largest_tokens <= 0 || largest_tokens >= total_tokens) return std::nullopt;
  return absl::StrFormat(
      "the request may reach %d tokens (prompt and max_tokens); the largest decode worker's KV "
      "cache holds %d",
      total_tokens, largest_tokens);
}

}  // namespace tandem
