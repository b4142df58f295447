#include "kv_transfer/nccl/framing.h"

#include "absl/strings/str_format.h"
#include "lib/crc32c/crc32c.h"

namespace tandem {

absl::StatusOr<KvFrameHeader> MakeNcclLayerHeader(const KvChunkHeader& chunk,
                                                  std::span<const char> payload, bool checksum,
                                                  uint64_t max_payload_bytes) {
  absl::StatusOr<uint64_t> want = KvChunkPayloadBytes(chunk, max_payload_bytes);
  if (!want.ok()) return want.status();
  if (payload.size() != *want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("nccl kv layer %d: payload is %d bytes, the header describes %d",
                        chunk.layer, payload.size(), *want));
  }
  KvFrameHeader h;
  h.kind = KvFrameKind::kData;
  h.chunk = chunk;
  h.payload_length = payload.size();
  h.payload_crc = checksum ? Crc32c(payload) : 0;
  return h;
}

NcclHeaderBytes EncodeNcclLayerHeader(KvFrameHeader h, uint64_t seq) {
  h.seq = seq;
  NcclHeaderBytes out;
  EncodeKvFrameHeader(h, std::span<char, kKvFrameHeaderBytes>(out));
  return out;
}

absl::StatusOr<NcclHeaderBytes> EncodeNcclLayerHeader(uint64_t seq, const KvChunkHeader& chunk,
                                                      std::span<const char> payload, bool checksum,
                                                      uint64_t max_payload_bytes) {
  absl::StatusOr<KvFrameHeader> h =
      MakeNcclLayerHeader(chunk, payload, checksum, max_payload_bytes);
  if (!h.ok()) return h.status();
  return EncodeNcclLayerHeader(*h, seq);
}

absl::StatusOr<KvFrameHeader> DecodeNcclLayerHeader(std::span<const char> bytes,
                                                    uint64_t expected_seq,
                                                    uint64_t max_payload_bytes) {
  if (bytes.size() != kKvFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("nccl kv header: %d bytes, expected %d",
                                                      bytes.size(), kKvFrameHeaderBytes));
  }
  absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(bytes, max_payload_bytes);
  if (!h.ok()) return h.status();
  if (h->kind != KvFrameKind::kData) {
    return absl::InvalidArgumentError("nccl kv header: kind must be DATA");
  }
  if (h->seq != expected_seq) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "nccl kv header: seq %d, expected %d (stream out of step)", h->seq, expected_seq));
  }
  return h;
}

absl::Status VerifyNcclPayload(const KvFrameHeader& h, std::span<const char> payload,
                               bool checksum) {
  if (payload.size() != h.payload_length) {
    return absl::InvalidArgumentError(absl::StrFormat("nccl kv payload: %d bytes, header says %d",
                                                      payload.size(), h.payload_length));
  }
  if (checksum && Crc32c(payload) != h.payload_crc) {
    return absl::DataLossError(
        absl::StrFormat("nccl kv payload: CRC32C mismatch (request %d layer %d)",
                        h.chunk.request_id, h.chunk.layer));
  }
  return absl::OkStatus();
}

}  // namespace tandem
