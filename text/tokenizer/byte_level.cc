#include "text/tokenizer/byte_level.h"

#include <array>

#include "lib/unicode/unicode.h"

namespace tandem::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of the character for each byte
  std::array<int16_t, 512> char_to_byte;      // all mapped characters are below U+0200
};

const Tables& GetTables() {
  static const Tables* const tables = [] {
    auto* t = new Tables();
    t->char_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? b : 256 + next++;
      unicode::AppendUtf8(cp, &t->byte_to_utf8[b]);
      t->char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

void AppendMapped(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  out->reserve(out->size() + 2 * bytes.size());
  for (char c : bytes) {
    const std::string& mapped = t.byte_to_utf8[static_cast<unsigned char>(c)];
    if (mapped.size() == 1) {
      out->push_back(mapped[0]);
    } else {
      out->append(mapped);
    }
  }
}

int CharToByte(uint32_t cp) { return cp < 512 ? GetTables().char_to_byte[cp] : -1; }

}  // namespace tandem::byte_level
