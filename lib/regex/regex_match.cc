// Regex::FindAll: the matcher of a compiled Regex (regex_internal.h).
#include <algorithm>
#include <limits>
#include <string_view>
#include <vector>

#include "lib/regex/regex.h"
#include "lib/regex/regex_internal.h"
#include "lib/unicode/unicode.h"

namespace tandem {

using regex_internal::kMaxDepth;
using regex_internal::kMaxStepsPerAttempt;
using regex_internal::kUnbounded;
using regex_internal::kWordMask;
using regex_internal::MatchProperties;

// ---------------------------------------------------------------------------------------------
// Matching: recursive backtracking in continuation-passing style. MatchSeq matches seq[i..]
// at `pos` and then whatever `k` says comes next; it returns true as soon as the whole
// pattern matched (the end is then in match_end_), false once every choice failed.

namespace {

struct Subject {
  const uint32_t* cps;    // [n] code points
  const uint32_t* props;  // [n] unicode::Properties of each
  size_t n;
};

}  // namespace

class RegexMatcher {
 public:
  RegexMatcher(const Regex& re, const Subject& s) : re_(re), s_(s) {}

  // Tries a match starting exactly at `pos`; on success sets *end.
  bool MatchAt(size_t pos, size_t* end) {
    steps_ = 0;
    depth_ = 0;
    aborted_ = false;
    if (!MatchSeq(re_.root_, 0, pos, nullptr) || aborted_) return false;
    *end = match_end_;
    return true;
  }

 private:
  using Node = Regex::Node;
  using Kind = Node::Kind;

  struct Cont {
    enum class Kind { kSeq, kRepeat, kEndAt } kind;
    const Regex::Seq* seq = nullptr;  // kSeq: continue with seq[index..]
    size_t index = 0;
    const Node* node = nullptr;  // kRepeat: `count` iterations done, the last began at `mark`
    int count = 0;
    size_t mark = 0;  // kRepeat: iteration start; kEndAt: the required end position
    const Cont* next = nullptr;
  };

  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }

   private:
    int* depth_;
  };

  bool MatchOne(const Node& n, size_t pos) const {
    const uint32_t cp = s_.cps[pos];
    switch (n.kind) {
      case Kind::kLiteral:
        return n.icase ? unicode::SimpleFold(cp) == n.cp : cp == n.cp;
      case Kind::kClass:
        return re_.classes_[n.class_index].Matches(cp, s_.props[pos]);
      case Kind::kAny:
        return cp != '\n';
      default:
        return false;
    }
  }

  bool MayStart(const FirstCharFilter& f, size_t pos) const {
    if (f.any) return true;
    if (pos >= s_.n) return false;
    const uint32_t cp = s_.cps[pos];
    for (const auto& [lit, icase] : f.literals) {
      if ((icase ? unicode::SimpleFold(cp) : cp) == lit) return true;
    }
    for (int c : f.classes) {
      if (re_.classes_[c].Matches(cp, s_.props[pos])) return true;
    }
    return false;
  }

  bool IsWord(size_t pos) const { return pos < s_.n && (s_.props[pos] & kWordMask) != 0; }

  bool Continue(const Cont* k, size_t pos) {
    if (k == nullptr) {
      match_end_ = pos;
      return true;
    }
    switch (k->kind) {
      case Cont::Kind::kSeq:
        return MatchSeq(*k->seq, k->index, pos, k->next);
      case Cont::Kind::kRepeat:
        return RepeatStep(*k->node, k->count, k->mark, pos, k->next);
      case Cont::Kind::kEndAt:
        if (pos != k->mark) return false;
        match_end_ = pos;
        return true;
    }
    return false;
  }

  // `count` iterations of a general repeat are done, the last one spanning [mark, pos).
  bool RepeatStep(const Node& n, int count, size_t mark, size_t pos, const Cont* after) {
    // An empty iteration cannot make progress; like Oniguruma, stop iterating there.
    if (count > 0 && pos == mark) return Continue(after, pos);
    const bool can_more = n.max == kUnbounded || count < n.max;
    const bool can_stop = count >= n.min;
    const Cont again{Cont::Kind::kRepeat, nullptr, 0, &n, count + 1, pos, after};
    if (n.greed == Node::Greed::kLazy) {
      if (can_stop && Continue(after, pos)) return true;
      if (aborted_) return false;
      return can_more && MatchSeq(n.body, 0, pos, &again);
    }
    if (can_more && MatchSeq(n.body, 0, pos, &again)) return true;
    if (aborted_) return false;
    return can_stop && Continue(after, pos);
  }

  // Runs `body` at `pos` as an independent sub-match (lookaround, atomic group); returns
  // whether it matched and its end. The outer match's end is saved and restored.
  bool SubMatch(const Regex::Seq& body, size_t pos, const Cont* k, size_t* end) {
    const size_t saved = match_end_;
    const bool m = MatchSeq(body, 0, pos, k);
    *end = match_end_;
    match_end_ = saved;
    return m && !aborted_;
  }

  bool MatchSeq(const Regex::Seq& seq, size_t i, size_t pos, const Cont* k) {
    if (++steps_ > kMaxStepsPerAttempt || depth_ >= kMaxDepth) {
      aborted_ = true;
      return false;
    }
    DepthGuard guard(&depth_);
    for (; i < seq.size(); ++i) {
      const Node& n = re_.nodes_[seq[i]];
      switch (n.kind) {
        case Kind::kLiteral:
        case Kind::kClass:
        case Kind::kAny:
          if (pos < s_.n && MatchOne(n, pos)) {
            ++pos;
            continue;
          }
          return false;
        case Kind::kLineStart:
          if (pos == 0 || s_.cps[pos - 1] == '\n') continue;
          return false;
        case Kind::kLineEnd:
          if (pos == s_.n || s_.cps[pos] == '\n') continue;
          return false;
        case Kind::kTextStart:
          if (pos == 0) continue;
          return false;
        case Kind::kTextEnd:
          if (pos == s_.n) continue;
          return false;
        case Kind::kTextEndOrFinalNewline:
          if (pos == s_.n || (pos + 1 == s_.n && s_.cps[pos] == '\n')) continue;
          return false;
        case Kind::kWordBoundary:
        case Kind::kNotWordBoundary: {
          const bool boundary = (pos > 0 && IsWord(pos - 1)) != IsWord(pos);
          if (boundary == (n.kind == Kind::kWordBoundary)) continue;
          return false;
        }
        case Kind::kGroup: {
          const Cont rest{Cont::Kind::kSeq, &seq, i + 1, nullptr, 0, 0, k};
          for (size_t a = 0; a < n.alts.size(); ++a) {
            if (!MayStart(n.alt_filters[a], pos)) continue;
            if (MatchSeq(n.alts[a], 0, pos, &rest)) return true;
            if (aborted_) return false;
          }
          return false;
        }
        case Kind::kRepeat: {
          if (n.single_char) return RepeatChar(n, seq, i, pos, k);
          if (n.greed == Node::Greed::kPossessive) {
            // Greedy, then never give back: run it as an independent sub-match.
            Node greedy = n;
            greedy.greed = Node::Greed::kGreedy;
            size_t end;
            const bool m = RepeatStepEntry(greedy, pos, &end);
            if (!m) return false;
            pos = end;
            continue;
          }
          const Cont rest{Cont::Kind::kSeq, &seq, i + 1, nullptr, 0, 0, k};
          return RepeatStep(n, 0, pos, pos, &rest);
        }
        case Kind::kLookahead: {
          size_t end;
          const bool m = SubMatch(n.body, pos, nullptr, &end);
          if (aborted_) return false;
          if (m == n.negate) return false;
          continue;
        }
        case Kind::kLookbehind: {
          bool m = false;
          for (int w = n.min_width; w <= n.max_width && !m; ++w) {
            if (static_cast<size_t>(w) > pos) break;
            const Cont end_at{Cont::Kind::kEndAt, nullptr, 0, nullptr, 0, pos, nullptr};
            size_t end;
            m = SubMatch(n.body, pos - w, &end_at, &end);
            if (aborted_) return false;
          }
          if (m == n.negate) return false;
          continue;
        }
        case Kind::kAtomic: {
          size_t end;
          if (!SubMatch(n.body, pos, nullptr, &end)) return false;
          pos = end;
          continue;
        }
      }
    }
    return Continue(k, pos);
  }

  bool RepeatStepEntry(const Node& greedy, size_t pos, size_t* end) {
    const size_t saved = match_end_;
    const bool m = RepeatStep(greedy, 0, pos, pos, nullptr) && !aborted_;
    *end = match_end_;
    match_end_ = saved;
    return m;
  }

  // A repeat of one code-point matcher: count the run once, then try the continuation from
  // the longest (greedy) or shortest (lazy) candidate. No recursion per character.
  bool RepeatChar(const Node& n, const Regex::Seq& seq, size_t i, size_t pos, const Cont* k) {
    const Node& body = re_.nodes_[n.body[0]];
    const size_t avail = s_.n - pos;
    const size_t limit = n.max == kUnbounded ? avail : std::min(avail, static_cast<size_t>(n.max));
    const size_t min = static_cast<size_t>(n.min);
    if (n.greed == Node::Greed::kLazy) {
      size_t count = 0;
      while (count < min) {
        if (count >= limit || !MatchOne(body, pos + count)) return false;
        ++count;
      }
      while (true) {
        if (MatchSeq(seq, i + 1, pos + count, k)) return true;
        if (aborted_ || count >= limit || !MatchOne(body, pos + count)) return false;
        ++count;
      }
    }
    size_t count = 0;
    while (count < limit && MatchOne(body, pos + count)) ++count;
    if (count < min) return false;
    if (n.greed == Node::Greed::kPossessive) return MatchSeq(seq, i + 1, pos + count, k);
    for (size_t c = count;; --c) {
      if (MatchSeq(seq, i + 1, pos + c, k)) return true;
      if (aborted_ || c == min) return false;
    }
  }

  const Regex& re_;
  const Subject& s_;
  size_t match_end_ = 0;
  int64_t steps_ = 0;
  int depth_ = 0;
  bool aborted_ = false;
};

void Regex::FindAll(std::string_view text, std::vector<Match>* matches) const {
  // Per-thread scratch: FindAll runs once per pre-tokenizer piece, and reallocating these for
  // every piece would cost more than the matching.
  thread_local std::vector<uint32_t> cps, props;
  thread_local std::vector<size_t> offsets;
  cps.clear();
  props.clear();
  offsets.clear();
  size_t i = 0;
  while (i < text.size()) {
    offsets.push_back(i);
    const uint32_t cp = unicode::DecodeUtf8(text, &i);
    cps.push_back(cp);
    props.push_back(MatchProperties(cp));
  }
  offsets.push_back(text.size());
  const Subject subject{cps.data(), props.data(), cps.size()};
  RegexMatcher matcher(*this, subject);

  // Oniguruma's find_iter: search from `from`; an empty match right where the previous match
  // ended is skipped by moving on one character.
  size_t from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (from <= subject.n) {
    size_t begin = from, end = 0;
    bool found = false;
    for (; begin <= subject.n; ++begin) {
      if (matcher.MatchAt(begin, &end)) {
        found = true;
        break;
      }
    }
    if (!found) break;
    if (end == begin && have_last && last_end == end) {
      from = from + 1;
      continue;
    }
    matches->push_back({offsets[begin], offsets[end]});
    have_last = true;
    last_end = end;
    from = end;
  }
}

}  // namespace tandem
