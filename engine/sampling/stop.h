// Stop strings over streamed text: text that could be the start of a stop string is held back
// until it is known not to be one, so a client never sees part of a stop string.
#ifndef TANDEM_ENGINE_SAMPLING_STOP_H_
#define TANDEM_ENGINE_SAMPLING_STOP_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  // Appends `delta`; returns the text now safe to emit. When a stop string appears, returns the
  // text before it and sets *stopped (the stop string itself is never emitted).
  std::string Add(std::string_view delta, bool* stopped);
  // The held-back text, at the end of a stream that did not stop on a string.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_SAMPLING_STOP_H_
