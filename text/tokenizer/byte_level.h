// GPT-2's reversible byte <-> character mapping used by the ByteLevel pre-tokenizer and
// decoder: printable bytes map to themselves, the others to U+0100 and up, so every byte string
// becomes printable text a BPE vocabulary can hold.
#ifndef TANDEM_TEXT_TOKENIZER_BYTE_LEVEL_H_
#define TANDEM_TEXT_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::byte_level {

// Appends the mapped character of each byte of `bytes` to `out`.
void AppendMapped(std::string_view bytes, std::string* out);
// The byte a mapped character stands for, or -1 when `cp` is not one.
int CharToByte(uint32_t cp);

}  // namespace tandem::byte_level

#endif  // TANDEM_TEXT_TOKENIZER_BYTE_LEVEL_H_
