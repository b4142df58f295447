// Fuzzes the safetensors parser (formats/safetensors.h) with whole files held in memory: the
// 8-byte header length, the JSON header and the tensor data. Every tensor the parser accepts
// must lie inside the file; its first and last bytes are read so ASan would catch a view that
// does not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/mapped_file.h"
#include "formats/safetensors.h"
#include "kernels/dtype.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = tandem::MappedFile::FromString(
      "fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  auto parsed = tandem::ParseSafetensors(file);
  if (!parsed.ok()) return 0;
  volatile char sink = 0;
  for (const auto& [name, t] : parsed->tensors) {
    if (t.numel() < 0) __builtin_trap();  // a dimension that does not fit int64
    for (int64_t d : t.shape) {
      if (d < 0) __builtin_trap();
    }
    const int64_t bytes = t.numel() * static_cast<int64_t>(tandem::DTypeSize(t.dtype));
    const char* p = static_cast<const char*>(t.data);
    if (p < file->data() || p + bytes > file->data() + file->size()) __builtin_trap();
    if (bytes > 0) sink = sink + p[0] + p[bytes - 1];
  }
  return 0;
}
