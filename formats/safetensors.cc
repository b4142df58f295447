#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem {

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit is 100 MB

const char* DTypeTag(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:  // safetensors files here hold f32, f16 or bf16 tensors
      return "?";
  }
}
}  // namespace

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  auto file_or = MappedFile::Open(path);
  if (!file_or.ok()) return file_or.status();
  return ParseSafetensors(*std::move(file_or));
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrFormat("%s: not a valid safetensors file: %s", path, why));
  };
  if (file->size() < 8) return corrupt("shorter than its 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > kMaxHeader || header_len > file->size() - 8) {
    return corrupt(absl::StrFormat("header length %d exceeds the file", header_len));
  }
  const char* header = file->data() + 8;
  nlohmann::json j = nlohmann::json::parse(header, header + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt("header is not a JSON object");
  const char* base = header + header_len;
  const uint64_t data_size = file->size() - 8 - header_len;

  SafetensorsFile out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return corrupt(absl::StrFormat("tensor \"%s\" has a malformed entry", it.key()));
    }
    const std::string dtype = t["dtype"].get<std::string>();
    uint64_t elem = 0;
    DType dt = DType::kF32;
    if (dtype == "F32") {
      elem = 4;
    } else if (dtype == "F16") {
      elem = 2;
      dt = DType::kF16;
    } else if (dtype == "BF16") {
      elem = 2;
      dt = DType::kBF16;
    }
    TensorView v;
    v.dtype = dt;
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned())
        return corrupt(absl::StrFormat("tensor \"%s\": bad shape", it.key()));
      const uint64_t dim = d.get<uint64_t>();
      // Each dimension is bounded too: after a 0 the product stays 0 whatever follows, and a
      // dimension past INT64_MAX would become a negative extent in TensorView::shape.
      if (dim > (uint64_t{1} << 48) || (dim != 0 && numel > (uint64_t{1} << 48) / dim)) {
        return corrupt(absl::StrFormat("tensor \"%s\": shape too large", it.key()));
      }
      numel *= dim;
      v.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return corrupt(absl::StrFormat("tensor \"%s\": bad data_offsets", it.key()));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return corrupt(
          absl::StrFormat("tensor \"%s\": data [%d, %d) outside the %d data bytes "
                          "(truncated file?)",
                          it.key(), begin, end, data_size));
    }
    if (elem == 0) {  // a dtype the engine does not use (I64 buffers, ...)
      out.skipped.push_back(it.key() + " (" + dtype + ")");
      continue;
    }
    if (end - begin != numel * elem) {
      return corrupt(absl::StrFormat("tensor \"%s\": %d bytes for %d %s elements", it.key(),
                                     end - begin, numel, dtype));
    }
    ranges.emplace_back(begin, end);
    v.data = base + begin;
    v.file = file;
    out.tensors.emplace(it.key(), std::move(v));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return corrupt("tensor data ranges overlap");
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const TensorProducer& produce) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeTag(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data to 8 bytes
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrFormat("cannot write %s", path));
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors) {
    const std::string bytes = produce(t);
    if (bytes.size() != static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype)) {
      return absl::InternalError(
          absl::StrFormat("tensor %s: producer gave %d bytes", t.name, bytes.size()));
    }
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  out.flush();
  if (!out) return absl::DataLossError(absl::StrFormat("short write to %s", path));
  return absl::OkStatus();
}

}  // namespace tandem
