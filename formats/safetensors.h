// Reading and writing the safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// tensor bytes. Tensors are used in place from a read-only mapping.
#ifndef TANDEM_FORMATS_SAFETENSORS_H_
#define TANDEM_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/mapped_file.h"
#include "kernels/dtype.h"

namespace tandem {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping of `file`
  std::shared_ptr<MappedFile> file;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Parses one .safetensors file. Every tensor's dtype, shape and byte range are checked against
// the file (truncated or overlapping data is an error). Unsupported dtypes are an error only
// when such a tensor is used (they are kept out of the map and listed in `skipped`).
struct SafetensorsFile {
  std::map<std::string, TensorView> tensors;
  std::vector<std::string> skipped;
};
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
// The same for a file already open (or held in memory); errors name file->path().
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::shared_ptr<MappedFile> file);

// A tensor to write; its bytes come from a producer called once per tensor, in order, so a
// large model is written without holding it in memory.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};
// Returns the raw row-major bytes of `spec` (numel * DTypeSize bytes).
using TensorProducer = std::function<std::string(const TensorSpec& spec)>;
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const TensorProducer& produce);

}  // namespace tandem

#endif  // TANDEM_FORMATS_SAFETENSORS_H_
