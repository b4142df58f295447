// A bound on the text being tokenized at once, over every caller of one tokenizer. Encoding
// costs many times its input in transient memory (the llama.c tokenizer's merge heap and links
// take about 40 bytes per byte of text), so 24 concurrent 4 MB texts took a router to gigabytes.
// Texts of at least kEncodeBudgetMinBytes wait their turn while the bytes of such texts being
// encoded would pass the budget; shorter ones never wait. A text larger than the whole budget
// is encoded alone.
#ifndef TANDEM_TEXT_ENCODE_BUDGET_H_
#define TANDEM_TEXT_ENCODE_BUDGET_H_

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

#include "text/tokenizer.h"

namespace tandem {

inline constexpr size_t kEncodeBudgetMinBytes = size_t{64} << 10;

// Bytes of text granted at once; Acquire blocks until its bytes fit (or nothing else is held).
class EncodeBudget {
 public:
  explicit EncodeBudget(size_t bytes) : bytes_(bytes) {}
  void Acquire(size_t n);
  void Release(size_t n);
  size_t held() const;

 private:
  const size_t bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t held_ = 0;
};

// `inner` with its Encode under a budget of `bytes` (every other call passes through).
std::unique_ptr<Tokenizer> WithEncodeBudget(std::unique_ptr<Tokenizer> inner, size_t bytes);

}  // namespace tandem

#endif  // TANDEM_TEXT_ENCODE_BUDGET_H_
