// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every KV frame. Uses the
// SSE4.2 crc32 instruction when the CPU has it, else a table-driven software path; both give the
// same value. Written here because the Debian Abseil (20220623) has no absl/crc.
#ifndef TANDEM_LIB_CRC32C_CRC32C_H_
#define TANDEM_LIB_CRC32C_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace tandem {

// Continues `crc` (the value of a previous call, 0 to start) over `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(std::span<const char> data) {
  return Crc32cExtend(0, data.data(), data.size());
}

// The two implementations, exposed so tests can compare them. Crc32cHardwareExtend must only be
// called when Crc32cHardwareAvailable().
uint32_t Crc32cSoftwareExtend(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cHardwareExtend(uint32_t crc, const void* data, size_t n);
bool Crc32cHardwareAvailable();

}  // namespace tandem

#endif  // TANDEM_LIB_CRC32C_CRC32C_H_
