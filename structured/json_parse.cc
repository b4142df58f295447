#include "structured/json_parse.h"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::structured {
namespace {

using Json = nlohmann::ordered_json;

// Below this many keys an object's keys are scanned; from it on they are hashed.
constexpr size_t kHashKeysFrom = 16;
// Values parsed between two polls of `cancelled`.
constexpr uint64_t kPollEvery = 4096;

// nlohmann's SAX interface (json_sax_dom_parser's, with a hash table per large object): builds
// the document top-down. A value's place is fixed while it is open: nothing is added to its
// parent until it closes, so the pointers in `stack_` stay valid.
class Builder {
 public:
  Builder(Json* root, const std::function<bool()>& cancelled)
      : root_(root), cancelled_(cancelled) {}

  bool null() { return Add(Json(nullptr)); }
  bool boolean(bool v) { return Add(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Add(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Add(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) { return Add(Json(v)); }
  bool string(Json::string_t& v) { return Add(Json(std::move(v))); }
  bool binary(Json::binary_t& /*v*/) { return false; }  // never in JSON text

  bool start_object(std::size_t /*unknown*/) {
    stack_.push_back(Frame(Place(Json(Json::value_t::object))));
    return Poll();
  }
  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    // The object as its vector of members (ordered_map's operator[] takes keys).
    Json::object_t::Container& members = *f.value->get_ptr<Json::object_t*>();
    size_t at = members.size();
    if (f.index != nullptr) {
      if (auto it = f.index->find(k); it != f.index->end()) at = it->second;
    } else {
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].first == k) {
          at = i;
          break;
        }
      }
    }
    if (at == members.size()) {
      if (f.index != nullptr) f.index->emplace(k, at);
      members.emplace_back(std::move(k), nullptr);
      if (f.index == nullptr && members.size() >= kHashKeysFrom) {
        f.index = std::make_unique<std::unordered_map<std::string, size_t>>();
        for (size_t i = 0; i < members.size(); ++i) f.index->emplace(members[i].first, i);
      }
    }
    f.slot = &members[at].second;  // a repeated key: the later value replaces the earlier
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*unknown*/) {
    stack_.push_back(Frame(Place(Json(Json::value_t::array))));
    return Poll();
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t /*byte*/, const std::string& /*token*/, const Exception& e) {
    error_ = e.what();
    return false;
  }

  bool was_cancelled() const { return was_cancelled_; }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    explicit Frame(Json* v) : value(v) {}
    Json* value;           // the open object or array
    Json* slot = nullptr;  // objects: where the value of the last key goes
    // Objects of kHashKeysFrom keys or more: key -> its index in the object.
    std::unique_ptr<std::unordered_map<std::string, size_t>> index;
  };

  // Puts `v` where the next value goes and returns where it is.
  Json* Place(Json v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Frame& f = stack_.back();
    if (f.value->is_array()) {
      Json::array_t& items = *f.value->get_ptr<Json::array_t*>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *f.slot = std::move(v);
    return f.slot;
  }
  bool Add(Json v) {
    Place(std::move(v));
    return Poll();
  }
  bool Poll() {
    if (!cancelled_ || ++values_ % kPollEvery != 0 || !cancelled_()) return true;
    was_cancelled_ = true;
    return false;
  }

  Json* root_;
  const std::function<bool()>& cancelled_;
  std::vector<Frame> stack_;
  uint64_t values_ = 0;
  bool was_cancelled_ = false;
  std::string error_;
};

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, const std::function<bool()>& cancelled) {
  Json root;
  Builder builder(&root, cancelled);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder);
  if (builder.was_cancelled()) {
    return absl::CancelledError("the client went away while its JSON was parsed");
  }
  if (!ok) {
    return absl::InvalidArgumentError(builder.error().empty() ? "malformed JSON" : builder.error());
  }
  return root;
}

}  // namespace tandem::structured
