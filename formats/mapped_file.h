// A read-only memory mapping of a whole file; weights are used in place from it.
#ifndef TANDEM_FORMATS_MAPPED_FILE_H_
#define TANDEM_FORMATS_MAPPED_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  // `contents` held in memory as if it were the file `name` (tests and fuzz targets parse
  // file formats through this without touching the disk).
  static std::shared_ptr<MappedFile> FromString(std::string name, std::string contents);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const char* data_;
  size_t size_;
  bool mapped_ = true;  // false: data_ points into owned_
  std::string owned_;
};

absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace tandem

#endif  // TANDEM_FORMATS_MAPPED_FILE_H_
