// GGUF, the single-file model format of llama.cpp (also Ollama's and LM Studio's), versions 2
// and 3: "GGUF", version, tensor count, metadata count, metadata key/values (typed scalars,
// strings, arrays), tensor infos (name, dims with the fastest-varying first, ggml type, offset),
// padding to `general.alignment` (32 by default), then the tensor data. Little-endian only.
// Tensors are used in place from a read-only mapping.
#ifndef TANDEM_FORMATS_GGUF_H_
#define TANDEM_FORMATS_GGUF_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/mapped_file.h"
#include "kernels/dtype.h"

namespace tandem {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// One metadata value. Numbers (and bools) are kept as double and, exactly, as int64 when
// integral; arrays of numbers in `numbers`, arrays of strings in `strings` (arrays of arrays are
// kept as empty arrays: nothing Tandem reads uses them).
struct GgufValue {
  GgufType type = GgufType::kUint8;
  double number = 0;
  int64_t integer = 0;
  std::string string;
  GgufType element_type = GgufType::kUint8;  // arrays
  std::vector<double> numbers;
  std::vector<std::string> strings;
  bool is_number() const { return type != GgufType::kString && type != GgufType::kArray; }
};

struct GgufTensor {
  std::string name;
  uint32_t ggml_type = 0;
  std::optional<DType> dtype;  // nullopt: a ggml type Tandem does not compute with
  std::vector<int64_t> dims;   // ne[0] (row length) first
  const void* data = nullptr;  // inside the mapping
  uint64_t bytes = 0;
  int64_t numel() const;
};

// The ggml type id of a dtype (nullopt for the ones GGUF files do not hold, e.g. fp8).
std::optional<uint32_t> GgmlTypeOf(DType dtype);

// The ggml type names Tandem reads ("F32", "Q4_K", ...); "type N" for others.
std::string GgmlTypeName(uint32_t ggml_type);

class GgufFile {
 public:
  // Every count, length and offset is checked against the file: a truncated or corrupt file is
  // INVALID_ARGUMENT naming what is wrong, never a read out of bounds.
  static absl::StatusOr<GgufFile> Read(const std::string& path);
  static absl::StatusOr<GgufFile> Parse(std::shared_ptr<MappedFile> file);

  uint32_t version() const { return version_; }
  const std::string& path() const { return file_->path(); }
  const std::shared_ptr<MappedFile>& file() const { return file_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }

  const GgufValue* Find(const std::string& key) const;
  const GgufTensor* Tensor(const std::string& name) const;
  // Typed metadata: NOT_FOUND when absent, INVALID_ARGUMENT naming the key when of another type.
  absl::StatusOr<int64_t> Int(const std::string& key) const;
  absl::StatusOr<double> Float(const std::string& key) const;
  absl::StatusOr<std::string> String(const std::string& key) const;
  // The same with a fallback for an absent key (a key of the wrong type is still an error).
  absl::StatusOr<int64_t> Int(const std::string& key, int64_t fallback) const;
  absl::StatusOr<double> Float(const std::string& key, double fallback) const;
  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const;

 private:
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
  std::shared_ptr<MappedFile> file_;
};

// Whether `path` names a GGUF file (by its first four bytes).
bool IsGgufFile(const std::string& path);

}  // namespace tandem

#endif  // TANDEM_FORMATS_GGUF_H_
