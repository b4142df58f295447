// Fuzzes the GGUF reader (formats/gguf.h) with whole files held in memory: the header, typed
// metadata (strings, arrays, nested arrays), tensor infos and the data. Every tensor the parser
// accepts must lie inside the file (its first and last bytes are read so ASan would catch one
// that does not, and a known quantized type's first block is dequantized); the model config
// and the tokenizer built from the metadata must refuse or accept, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "kernels/quant.h"
#include "text/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = tandem::MappedFile::FromString(
      "fuzz.gguf", std::string(reinterpret_cast<const char*>(data), size));
  auto parsed = tandem::GgufFile::Parse(file);
  if (!parsed.ok()) return 0;
  volatile char sink = 0;
  for (const auto& [name, t] : parsed->tensors()) {
    if (t.numel() < 0) __builtin_trap();
    const char* p = static_cast<const char*>(t.data);
    if (t.bytes > 0 && (p < file->data() || p + t.bytes > file->data() + file->size())) {
      __builtin_trap();
    }
    if (t.bytes > 0) sink = sink + p[0] + p[t.bytes - 1];
    if (t.dtype.has_value() && tandem::IsQuantized(*t.dtype) && !t.dims.empty() &&
        t.dims[0] % tandem::BlockElems(*t.dtype) == 0 &&
        static_cast<int64_t>(t.bytes) >= tandem::BlockBytes(*t.dtype)) {
      std::vector<float> block(tandem::BlockElems(*t.dtype));
      tandem::DequantizeRow(*t.dtype, t.data, block.data(), tandem::BlockElems(*t.dtype));
    }
  }
  (void)tandem::GgufModelConfig(*parsed);
  (void)tandem::GgufTokenizer(*parsed);
  return 0;
}
