#include "text/encode_budget.h"

#include <utility>

namespace tandem {

void EncodeBudget::Acquire(size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return held_ == 0 || held_ + n <= bytes_; });
  held_ += n;
}

void EncodeBudget::Release(size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ -= n;
  }
  cv_.notify_all();
}

size_t EncodeBudget::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

namespace {

class BudgetedTokenizer : public Tokenizer {
 public:
  BudgetedTokenizer(std::unique_ptr<Tokenizer> inner, size_t bytes)
      : inner_(std::move(inner)), budget_(bytes) {}

  std::vector<int> Encode(std::string_view text, bool add_special_tokens) const override {
    if (text.size() < kEncodeBudgetMinBytes) return inner_->Encode(text, add_special_tokens);
    budget_.Acquire(text.size());
    struct Release {
      EncodeBudget& budget;
      size_t n;
      ~Release() { budget.Release(n); }
    } release{budget_, text.size()};
    return inner_->Encode(text, add_special_tokens);
  }
  std::string Decode(std::span<const int> ids) const override { return inner_->Decode(ids); }
  int vocab_size() const override { return inner_->vocab_size(); }
  int bos_id() const override { return inner_->bos_id(); }
  std::vector<int> eos_ids() const override { return inner_->eos_ids(); }
  bool IsSpecial(int id) const override { return inner_->IsSpecial(id); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  mutable EncodeBudget budget_;
};

}  // namespace

std::unique_ptr<Tokenizer> WithEncodeBudget(std::unique_ptr<Tokenizer> inner, size_t bytes) {
  return std::make_unique<BudgetedTokenizer>(std::move(inner), bytes);
}

}  // namespace tandem
