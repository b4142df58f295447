#include "formats/gguf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/quant.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxCount = 1 << 24;  // tensors, metadata keys, array elements: sanity bounds
constexpr uint64_t kMaxString = 1 << 28;
constexpr int kMaxDims = 4;

// The ggml type ids of the dtypes Tandem computes with.
constexpr std::pair<uint32_t, DType> kGgmlTypes[] = {
    {0, DType::kF32},   {1, DType::kF16},   {2, DType::kQ4_0},  {3, DType::kQ4_1},
    {6, DType::kQ5_0},  {7, DType::kQ5_1},  {8, DType::kQ8_0},  {12, DType::kQ4_K},
    {13, DType::kQ5_K}, {14, DType::kQ6_K}, {30, DType::kBF16},
};

std::optional<DType> DTypeOfGgml(uint32_t t) {
  for (const auto& [id, dtype] : kGgmlTypes) {
    if (id == t) return dtype;
  }
  return std::nullopt;
}

// A bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const char* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }

  template <typename T>
  T Get(const char* what) {
    T v{};
    if (!Need(sizeof(T), what)) return v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string String(const char* what) {
    const uint64_t n = Get<uint64_t>(what);
    if (failed_) return {};
    if (n > kMaxString) return Fail(absl::StrFormat("%s: a string of %d bytes", what, n)), "";
    if (!Need(n, what)) return {};
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  bool Skip(uint64_t n, const char* what) {
    if (!Need(n, what)) return false;
    pos_ += n;
    return true;
  }
  void Fail(const std::string& why) {
    if (!failed_) error_ = why;
    failed_ = true;
  }

 private:
  bool Need(uint64_t n, const char* what) {
    if (failed_) return false;
    if (n > left()) {
      Fail(absl::StrFormat("truncated in %s (needs %d bytes at offset %d, the file has %d)", what,
                           n, pos_, size_));
      return false;
    }
    return true;
  }
  const char* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

int ScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// One number of type t as (double, int64).
void ReadNumber(Cursor& c, GgufType t, double* d, int64_t* i) {
  switch (t) {
    case GgufType::kUint8:
      *i = c.Get<uint8_t>("a uint8");
      break;
    case GgufType::kInt8:
      *i = c.Get<int8_t>("an int8");
      break;
    case GgufType::kBool:
      *i = c.Get<uint8_t>("a bool") != 0;
      break;
    case GgufType::kUint16:
      *i = c.Get<uint16_t>("a uint16");
      break;
    case GgufType::kInt16:
      *i = c.Get<int16_t>("an int16");
      break;
    case GgufType::kUint32:
      *i = c.Get<uint32_t>("a uint32");
      break;
    case GgufType::kInt32:
      *i = c.Get<int32_t>("an int32");
      break;
    case GgufType::kUint64:
      *i = static_cast<int64_t>(std::min<uint64_t>(c.Get<uint64_t>("a uint64"), INT64_MAX));
      break;
    case GgufType::kInt64:
      *i = c.Get<int64_t>("an int64");
      break;
    case GgufType::kFloat32:
      *d = c.Get<float>("a float32");
      *i = std::isfinite(*d) && std::trunc(*d) == *d && std::fabs(*d) < 9e18
               ? static_cast<int64_t>(*d)
               : 0;
      return;
    case GgufType::kFloat64:
      *d = c.Get<double>("a float64");
      *i = std::isfinite(*d) && std::trunc(*d) == *d && std::fabs(*d) < 9e18
               ? static_cast<int64_t>(*d)
               : 0;
      return;
    default:
      return;
  }
  *d = static_cast<double>(*i);
}

bool KnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

GgufValue ReadValue(Cursor& c, GgufType type, const std::string& key) {
  GgufValue v;
  v.type = type;
  if (type == GgufType::kString) {
    v.string = c.String("a string value");
  } else if (type == GgufType::kArray) {
    const uint32_t et = c.Get<uint32_t>("an array type");
    const uint64_t n = c.Get<uint64_t>("an array length");
    if (c.failed()) return v;
    if (!KnownType(et)) {
      c.Fail(absl::StrFormat("metadata \"%s\": unknown array element type %d", key, et));
      return v;
    }
    if (n > kMaxCount) {
      c.Fail(absl::StrFormat("metadata \"%s\": an array of %d elements", key, n));
      return v;
    }
    v.element_type = static_cast<GgufType>(et);
    if (v.element_type == GgufType::kString) {
      v.strings.reserve(n);
      for (uint64_t i = 0; i < n && !c.failed(); ++i)
        v.strings.push_back(c.String("an array string"));
    } else if (v.element_type == GgufType::kArray) {
      for (uint64_t i = 0; i < n && !c.failed(); ++i) {
        ReadValue(c, GgufType::kArray, key);  // nested: read past it, keep nothing
      }
    } else {
      const int size = ScalarSize(v.element_type);
      if (n * size > c.left()) {
        c.Fail(absl::StrFormat("metadata \"%s\": truncated array of %d elements", key, n));
        return v;
      }
      v.numbers.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        int64_t ignored = 0;
        ReadNumber(c, v.element_type, &v.numbers[i], &ignored);
      }
    }
  } else {
    ReadNumber(c, type, &v.number, &v.integer);
  }
  return v;
}

}  // namespace

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::optional<uint32_t> GgmlTypeOf(DType dtype) {
  for (const auto& [id, d] : kGgmlTypes) {
    if (d == dtype) return id;
  }
  return std::nullopt;
}

std::string GgmlTypeName(uint32_t ggml_type) {
  static const char* const kNames[] = {"F32",  "F16",  "Q4_0", "Q4_1", "type 4", "type 5",
                                       "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",   "Q3_K",
                                       "Q4_K", "Q5_K", "Q6_K", "Q8_K"};
  if (ggml_type < std::size(kNames)) return kNames[ggml_type];
  if (ggml_type == 30) return "BF16";
  return absl::StrFormat("type %d", ggml_type);
}

absl::StatusOr<GgufFile> GgufFile::Read(const std::string& path) {
  auto file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<GgufFile> GgufFile::Parse(std::shared_ptr<MappedFile> file) {
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrFormat("%s: not a valid GGUF file: %s", file->path(), why));
  };
  Cursor c(file->data(), file->size());
  if (c.Get<uint32_t>("the magic") != kMagic || c.failed()) {
    return corrupt("it does not start with \"GGUF\"");
  }
  GgufFile out;
  out.file_ = file;
  out.version_ = c.Get<uint32_t>("the version");
  if (c.failed()) return corrupt(c.error());
  if (out.version_ != 2 && out.version_ != 3) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s: GGUF version %d (Tandem reads versions 2 and 3)", file->path(), out.version_));
  }
  const uint64_t n_tensors = c.Get<uint64_t>("the tensor count");
  const uint64_t n_kv = c.Get<uint64_t>("the metadata count");
  if (c.failed()) return corrupt(c.error());
  if (n_tensors > kMaxCount || n_kv > kMaxCount) {
    return corrupt(absl::StrFormat("%d tensors and %d metadata keys", n_tensors, n_kv));
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.String("a metadata key");
    const uint32_t type = c.Get<uint32_t>("a metadata type");
    if (c.failed()) return corrupt(c.error());
    if (!KnownType(type)) {
      return corrupt(absl::StrFormat("metadata \"%s\" has unknown type %d", key, type));
    }
    GgufValue v = ReadValue(c, static_cast<GgufType>(type), key);
    if (c.failed()) return corrupt(c.error());
    out.metadata_[std::move(key)] = std::move(v);
  }
  uint64_t alignment = 32;
  if (const GgufValue* a = out.Find("general.alignment")) {
    if (!a->is_number() || a->integer <= 0 || a->integer > (1 << 20) ||
        (a->integer & (a->integer - 1)) != 0) {
      return corrupt("general.alignment must be a power of two");
    }
    alignment = static_cast<uint64_t>(a->integer);
  }
  struct Pending {
    GgufTensor tensor;
    uint64_t offset;
  };
  std::vector<Pending> pending;
  pending.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Pending p;
    p.tensor.name = c.String("a tensor name");
    const uint32_t n_dims = c.Get<uint32_t>("a tensor's dimension count");
    if (c.failed()) return corrupt(c.error());
    if (n_dims < 1 || n_dims > kMaxDims) {
      return corrupt(absl::StrFormat("tensor \"%s\" has %d dimensions", p.tensor.name, n_dims));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.Get<uint64_t>("a tensor dimension");
      if (c.failed()) return corrupt(c.error());
      if (dim == 0 || dim > (uint64_t{1} << 40) || numel > (uint64_t{1} << 42) / dim) {
        return corrupt(absl::StrFormat("tensor \"%s\" has dimension %d", p.tensor.name, dim));
      }
      numel *= dim;
      p.tensor.dims.push_back(static_cast<int64_t>(dim));
    }
    p.tensor.ggml_type = c.Get<uint32_t>("a tensor type");
    p.offset = c.Get<uint64_t>("a tensor offset");
    if (c.failed()) return corrupt(c.error());
    p.tensor.dtype = DTypeOfGgml(p.tensor.ggml_type);
    if (p.tensor.dtype) {
      const int64_t block = BlockElems(*p.tensor.dtype);
      if (p.tensor.dims[0] % block != 0) {
        return corrupt(absl::StrFormat("tensor \"%s\": rows of %d elements are not whole %s blocks",
                                       p.tensor.name, p.tensor.dims[0],
                                       GgmlTypeName(p.tensor.ggml_type)));
      }
      p.tensor.bytes = numel / block * BlockBytes(*p.tensor.dtype);
    }
    if (out.tensors_.contains(p.tensor.name) ||
        std::any_of(pending.begin(), pending.end(),
                    [&](const Pending& q) { return q.tensor.name == p.tensor.name; })) {
      return corrupt(absl::StrFormat("tensor \"%s\" appears twice", p.tensor.name));
    }
    pending.push_back(std::move(p));
  }
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > file->size()) return corrupt("truncated before the tensor data");
  const uint64_t data_size = file->size() - data_start;
  for (Pending& p : pending) {
    if (p.offset % alignment != 0) {
      return corrupt(
          absl::StrFormat("tensor \"%s\" is not aligned to %d bytes", p.tensor.name, alignment));
    }
    if (p.tensor.dtype && (p.offset > data_size || p.tensor.bytes > data_size - p.offset)) {
      return corrupt(absl::StrFormat(
          "tensor \"%s\" (%d bytes at offset %d) runs past the end of the file (%d bytes of data)",
          p.tensor.name, p.tensor.bytes, p.offset, data_size));
    }
    if (p.offset <= data_size) p.tensor.data = file->data() + data_start + p.offset;
    out.tensors_[p.tensor.name] = std::move(p.tensor);
  }
  return out;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::Tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<int64_t> GgufFile::Int(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrFormat("%s: no %s", path(), key));
  if (!v->is_number() || v->type == GgufType::kFloat32 || v->type == GgufType::kFloat64) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s must be an integer", path(), key));
  }
  return v->integer;
}

absl::StatusOr<double> GgufFile::Float(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrFormat("%s: no %s", path(), key));
  if (!v->is_number()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s must be a number", path(), key));
  }
  return v->number;
}

absl::StatusOr<std::string> GgufFile::String(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrFormat("%s: no %s", path(), key));
  if (v->type != GgufType::kString) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s must be a string", path(), key));
  }
  return v->string;
}

absl::StatusOr<int64_t> GgufFile::Int(const std::string& key, int64_t fallback) const {
  return Find(key) == nullptr ? absl::StatusOr<int64_t>(fallback) : Int(key);
}

absl::StatusOr<double> GgufFile::Float(const std::string& key, double fallback) const {
  return Find(key) == nullptr ? absl::StatusOr<double>(fallback) : Float(key);
}

absl::StatusOr<bool> GgufFile::Bool(const std::string& key, bool fallback) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s must be a bool", path(), key));
  }
  return v->integer != 0;
}

bool IsGgufFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), 4) && magic == kMagic;
}

}  // namespace tandem
