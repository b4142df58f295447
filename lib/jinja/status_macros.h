// Status propagation helpers for the chat-template interpreter. The interpreter is recursive and
// nearly every step can fail (undefined attribute, type error, size limit), so these keep the
// error path to one line. Part of the Jinja engine, lib/jinja/.
#ifndef TANDEM_LIB_JINJA_STATUS_MACROS_H_
#define TANDEM_LIB_JINJA_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CT_CONCAT_INNER(a, b) a##b
#define CT_CONCAT(a, b) CT_CONCAT_INNER(a, b)

#define CT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ct_status_ = (expr);      \
    if (!ct_status_.ok()) return ct_status_; \
  } while (0)

#define CT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

// `lhs` may be a declaration: CT_ASSIGN_OR_RETURN(Value v, Eval(node));
#define CT_ASSIGN_OR_RETURN(lhs, expr) \
  CT_ASSIGN_OR_RETURN_IMPL(CT_CONCAT(ct_statusor_, __LINE__), lhs, expr)

#endif  // TANDEM_LIB_JINJA_STATUS_MACROS_H_
