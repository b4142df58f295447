// The KV cache a worker takes when no size is given (--kv-bytes 0): a stated fraction of the
// memory it may use (--kv-memory-fraction, like vLLM's gpu_memory_utilization) less the model's
// weights. On the CPU that memory is the process's cgroup limit where one is set (a container's
// memory limit), else the machine's; on a GPU, the device's.
#ifndef TANDEM_ENGINE_KV_KV_BUDGET_H_
#define TANDEM_ENGINE_KV_KV_BUDGET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/loaders/model_weights.h"

namespace tandem {

// A cgroup memory limit file's content: v2 `memory.max` ("max" or bytes), v1
// `memory.limit_in_bytes` (bytes; "no limit" is a value near 2^63). nullopt when unlimited or
// unreadable.
std::optional<int64_t> ParseCgroupMemoryLimit(std::string_view text);
// /proc/meminfo's MemTotal in bytes; nullopt when absent.
std::optional<int64_t> ParseMemTotal(std::string_view meminfo);

// The memory this process may use on the host: the smallest of its cgroup's limit (v2, then
// v1, at the standard mount points) and the machine's MemTotal. INTERNAL when neither can be
// read.
absl::StatusOr<int64_t> HostMemoryBytes();

// Bytes of the model's weights as loaded (matrices in their dtypes, norms and biases in f32).
int64_t WeightBytes(const ModelConfig& config, const ModelWeights& weights);

// fraction * memory - reserved, at least 0.
int64_t KvBytesFromFraction(double fraction, int64_t memory, int64_t reserved);

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_KV_BUDGET_H_
