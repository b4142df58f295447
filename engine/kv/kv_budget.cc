#include "engine/kv/kv_budget.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/quant.h"

namespace tandem {
namespace {

// Limits at or above this are how cgroup v1 says "none" (a page-rounded 2^63 - 1).
constexpr int64_t kNoLimit = int64_t{1} << 62;

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t MatrixBytes(const WeightRef& w) {
  if (w.data == nullptr) return 0;
  const size_t elem = DTypeSize(w.dtype);
  return elem > 0 ? w.rows * w.cols * static_cast<int64_t>(elem)
                  : w.rows * RowBytes(w.dtype, w.cols);
}

}  // namespace

std::optional<int64_t> ParseCgroupMemoryLimit(std::string_view text) {
  const absl::string_view v =
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  int64_t bytes = 0;
  if (v == "max" || !absl::SimpleAtoi(v, &bytes) || bytes <= 0 || bytes >= kNoLimit) {
    return std::nullopt;
  }
  return bytes;
}

std::optional<int64_t> ParseMemTotal(std::string_view meminfo) {
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(meminfo.data(), meminfo.size()), '\n')) {
    if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return std::nullopt;
    int64_t kb = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kb) || kb <= 0) return std::nullopt;
    return kb * 1024;
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> HostMemoryBytes() {
  std::optional<int64_t> limit;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (auto text = ReadFile(path)) {
      if (auto l = ParseCgroupMemoryLimit(*text)) {
        limit = limit ? std::min(*limit, *l) : *l;
      }
    }
  }
  if (auto meminfo = ReadFile("/proc/meminfo")) {
    if (auto total = ParseMemTotal(*meminfo)) limit = limit ? std::min(*limit, *total) : *total;
  }
  if (!limit) {
    return absl::InternalError(
        "--kv-memory-fraction: cannot read this host's memory (/proc/meminfo); give --kv-bytes");
  }
  return *limit;
}

int64_t WeightBytes(const ModelConfig& c, const ModelWeights& w) {
  int64_t bytes = MatrixBytes(w.token_embedding) + int64_t{c.dim} * 4;
  if (w.classifier.data != w.token_embedding.data) bytes += MatrixBytes(w.classifier);
  for (const LayerWeights& l : w.layers) {
    for (const WeightRef* m : l.Matrices()) bytes += MatrixBytes(*m);
    bytes += int64_t{2} * c.dim * 4;
    if (l.bq != nullptr) bytes += (int64_t{c.n_heads} + 2 * c.n_kv_heads) * c.head_dim * 4;
    if (l.q_norm != nullptr) bytes += int64_t{2} * c.head_dim * 4;
    if (l.post_attn_norm != nullptr) bytes += int64_t{2} * c.dim * 4;
  }
  return bytes;
}

int64_t KvBytesFromFraction(double fraction, int64_t memory, int64_t reserved) {
  return std::max<int64_t>(0,
                           static_cast<int64_t>(fraction * static_cast<double>(memory)) - reserved);
}

}  // namespace tandem
