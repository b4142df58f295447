#include "lib/unicode/unicode.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tandem::unicode {
namespace {

std::string Utf8(std::initializer_list<uint32_t> cps) {
  std::string s;
  for (uint32_t cp : cps) AppendUtf8(cp, &s);
  return s;
}

std::string Normalized(NormalizationForm form, std::string s) {
  Normalize(form, &s);
  return s;
}

TEST(UnicodeTest, GeneralCategoriesAcrossPlanes) {
  EXPECT_EQ(Category('A'), GeneralCategory::kLu);
  EXPECT_EQ(Category(0x1D400), GeneralCategory::kLu);  // MATHEMATICAL BOLD CAPITAL A
  EXPECT_EQ(Category(0x4E2D), GeneralCategory::kLo);   // 中
  EXPECT_EQ(Category(0x20000), GeneralCategory::kLo);  // CJK Extension B
  EXPECT_EQ(Category(0xAC00), GeneralCategory::kLo);   // Hangul syllable
  EXPECT_EQ(Category(0x1F680), GeneralCategory::kSo);  // 🚀
  EXPECT_EQ(Category(0x0660), GeneralCategory::kNd);   // ARABIC-INDIC DIGIT ZERO
  EXPECT_EQ(Category(0x2160), GeneralCategory::kNl);   // ROMAN NUMERAL ONE
  EXPECT_EQ(Category(0x00B2), GeneralCategory::kNo);   // SUPERSCRIPT TWO
  EXPECT_EQ(Category(0x0301), GeneralCategory::kMn);
  EXPECT_EQ(Category(0xE0001), GeneralCategory::kCf);  // LANGUAGE TAG
  EXPECT_EQ(Category(0x10FFFF), GeneralCategory::kCn);
  EXPECT_EQ(Category(0xF0000), GeneralCategory::kCo);
  EXPECT_EQ(Category(0x110000), GeneralCategory::kCn);  // past the code space
  EXPECT_NE(UnicodeVersion()[0], '\0');
}

TEST(UnicodeTest, WhiteSpaceIsTheUnicodeProperty) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u,
                      0x200Au, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(IsWhiteSpace(cp)) << std::hex << cp;
  }
  for (uint32_t cp : {0x1Cu, 0x1Fu, 0x200Bu, 0xFEFFu, 0x180Eu, 0x61u}) {
    EXPECT_FALSE(IsWhiteSpace(cp)) << std::hex << cp;
  }
}

TEST(UnicodeTest, CombiningClassAndFolding) {
  EXPECT_EQ(CombiningClass(0x0301), 230);
  EXPECT_EQ(CombiningClass(0x0323), 220);
  EXPECT_EQ(CombiningClass('a'), 0);
  EXPECT_EQ(SimpleFold('S'), static_cast<uint32_t>('s'));
  EXPECT_EQ(SimpleFold(0x017F), static_cast<uint32_t>('s'));  // LATIN SMALL LETTER LONG S
  EXPECT_EQ(SimpleFold(0x212A), static_cast<uint32_t>('k'));  // KELVIN SIGN
  EXPECT_EQ(SimpleFold(0x0391), 0x03B1u);                     // Greek Alpha
}

TEST(UnicodeTest, Nfc) {
  using F = NormalizationForm;
  EXPECT_EQ(Normalized(F::kNfc, "plain ascii"), "plain ascii");
  EXPECT_EQ(Normalized(F::kNfc, Utf8({'e', 0x0301})), Utf8({0x00E9}));
  EXPECT_EQ(Normalized(F::kNfc, Utf8({0x212B})), Utf8({0x00C5}));                  // ANGSTROM SIGN
  EXPECT_EQ(Normalized(F::kNfc, Utf8({0x1100, 0x1161, 0x11A8})), Utf8({0xAC01}));  // Hangul
  // Marks out of canonical order are reordered, then composed: a + dot below + circumflex.
  EXPECT_EQ(Normalized(F::kNfc, Utf8({'a', 0x0302, 0x0323})), Utf8({0x1EAD}));
  // A composition exclusion stays decomposed.
  EXPECT_EQ(Normalized(F::kNfc, Utf8({0x0958})), Utf8({0x0915, 0x093C}));
  // Already NFC, non-ASCII: untouched.
  EXPECT_EQ(Normalized(F::kNfc, "中文 한국어 🚀"), "中文 한국어 🚀");
  EXPECT_EQ(Normalized(F::kNfc, Utf8({0x0301, 'a'})), Utf8({0x0301, 'a'}));  // leading mark
}

TEST(UnicodeTest, OtherForms) {
  using F = NormalizationForm;
  EXPECT_EQ(Normalized(F::kNfd, Utf8({0x00E9})), Utf8({'e', 0x0301}));
  EXPECT_EQ(Normalized(F::kNfd, Utf8({0xAC01})), Utf8({0x1100, 0x1161, 0x11A8}));
  EXPECT_EQ(Normalized(F::kNfkc, Utf8({0xFB01})), "fi");  // ﬁ ligature
  EXPECT_EQ(Normalized(F::kNfkc, Utf8({0x2460})), "1");   // ①
  EXPECT_EQ(Normalized(F::kNfkd, Utf8({0x1E9B, 0x0323})), Utf8({'s', 0x0323, 0x0307}));
}

// NFC only rewrites spans around characters that fail its quick check; the result must equal
// composing the full decomposition, and be stable.
TEST(UnicodeTest, NfcSpansAgreeWithFullAlgorithm) {
  using F = NormalizationForm;
  std::mt19937 rng(99);
  const uint32_t kPool[] = {'a',    'e',    'o',    ' ',    0x00E9, 0x0301, 0x0300, 0x0323, 0x0302,
                            0x0308, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x212B, 0x0958, 0x093C, 0x0915,
                            0x4E2D, 0x05B0, 0x05B7, 0x0F71, 0x0F72, 0x1E9B, 0x1F80, 0x0345};
  std::uniform_int_distribution<size_t> pick(0, std::size(kPool) - 1);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    for (int i = 0, n = iter % 12; i < n; ++i) AppendUtf8(kPool[pick(rng)], &s);
    const std::string nfc = Normalized(F::kNfc, s);
    EXPECT_EQ(nfc, Normalized(F::kNfc, Normalized(F::kNfd, s)));
    EXPECT_EQ(nfc, Normalized(F::kNfc, nfc));
    EXPECT_EQ(Normalized(F::kNfd, nfc), Normalized(F::kNfd, s));
  }
}

TEST(UnicodeTest, Utf8Validation) {
  EXPECT_EQ(FindInvalidUtf8("ok é 中 🚀"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xC3"), 2u);            // truncated
  EXPECT_EQ(FindInvalidUtf8("a\xC0\xAF"), 1u);         // overlong
  EXPECT_EQ(FindInvalidUtf8("\xED\xA0\x80"), 0u);      // surrogate
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(FindInvalidUtf8(std::string("a\0b", 3)), std::string_view::npos);
  // One U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy.
  EXPECT_EQ(ToValidUtf8("a\xE4\xB8z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(ToValidUtf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8("a\xE4\xB8"), "a\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8("a\xE4\xB8", /*keep_incomplete_tail=*/true), "a\xE4\xB8");
}

}  // namespace
}  // namespace tandem::unicode
