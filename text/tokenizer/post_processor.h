// tokenizer.json post-processors: TemplateProcessing, ByteLevel, Sequence, and the older
// BertProcessing / RobertaProcessing. They frame an encoded sequence with special tokens when
// the caller asks for them.
#ifndef TANDEM_TEXT_TOKENIZER_POST_PROCESSOR_H_
#define TANDEM_TEXT_TOKENIZER_POST_PROCESSOR_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/tokenizer/json_util.h"

namespace tandem {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Frames the ids of a single sequence; nothing changes without `add_special_tokens`.
  virtual void Process(std::vector<int>* ids, bool add_special_tokens) const = 0;
};

// From the "post_processor" object of tokenizer.json (not null). Unknown types are an error.
absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const json_util::Json& j,
                                                                 std::string_view where);

}  // namespace tandem

#endif  // TANDEM_TEXT_TOKENIZER_POST_PROCESSOR_H_
