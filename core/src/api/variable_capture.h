// SPDX-License-Identifier: Apache-2.0
// Internal: how the Trainer ties a worker's model to the chief's under the
// parameter_server strategy (not in the C ABI, not installed). While a
// VariableCapture is active on a thread, every strata::Variable constructed
// from an initial value on that thread is either
//  - recorded (kRecord, the chief): its RemoteVariable, in creation order,
//    when its strategy keeps variables on the ps tasks; or
//  - bound (kBind, a worker): attached to the next RemoteVariable of the
//    chief's list instead of being created, after checking that name,
//    shape and dtype agree (InvalidArgumentError naming both sides).
// Variables attached with Variable(RemoteVariable) are neither.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "strata/coordinator.hpp"

namespace strata::detail {

struct StrategyImpl;
/// Whether `s` keeps its variables outside this process (on ps tasks),
/// i.e. its variables have a RemoteVariable.
bool keeps_variables_remotely(const StrategyImpl& s);

class VariableCapture {
 public:
  enum class Mode { kRecord, kBind };
  /// kRecord: `remotes` is filled. kBind: `remotes` is the chief's list,
  /// consumed in order. Nests (the innermost is active).
  VariableCapture(Mode mode, std::vector<RemoteVariable>* remotes);
  ~VariableCapture();
  VariableCapture(const VariableCapture&) = delete;
  VariableCapture& operator=(const VariableCapture&) = delete;

  /// The capture active on this thread, or nullptr.
  static VariableCapture* current();

  Mode mode() const { return mode_; }
  std::vector<RemoteVariable>& remotes() { return *remotes_; }
  /// Variables constructed so far under this capture (bound or recorded).
  std::size_t count() const { return next_; }
  std::size_t take() { return next_++; }
  /// kBind: InvalidArgumentError when the chief's list has variables left.
  void check_all_bound() const;

 private:
  Mode mode_;
  std::vector<RemoteVariable>* remotes_;
  std::size_t next_ = 0;
  VariableCapture* outer_;
};

}  // namespace strata::detail
