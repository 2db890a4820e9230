// SPDX-License-Identifier: Apache-2.0
#include "strata/variable.hpp"

#include <utility>

#include "api/default_strategy.h"
#include "api/kernels.h"
#include "api/strategy_impl.h"
#include "api/variable_capture.h"
#include "ps/ps_internal.h"

namespace strata {

const char* synchronization_name(Synchronization s) {
  switch (s) {
    case Synchronization::AUTO: return "AUTO";
    case Synchronization::ON_WRITE: return "ON_WRITE";
    case Synchronization::ON_READ: return "ON_READ";
    case Synchronization::NONE: return "NONE";
  }
  return "UNKNOWN";
}

const char* aggregation_name(Aggregation a) {
  switch (a) {
    case Aggregation::NONE: return "NONE";
    case Aggregation::SUM: return "SUM";
    case Aggregation::MEAN: return "MEAN";
    case Aggregation::ONLY_FIRST_REPLICA: return "ONLY_FIRST_REPLICA";
  }
  return "UNKNOWN";
}

ReduceOp reduce_op_from_aggregation(Aggregation a) {
  if (a == Aggregation::SUM) return ReduceOp::SUM;
  if (a == Aggregation::MEAN) return ReduceOp::MEAN;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "could not convert variable aggregation ", aggregation_name(a),
               " to a ReduceOp; only SUM and MEAN have one (as in tf.distribute)");
}

struct Variable::State {
  std::shared_ptr<detail::StrategyImpl> strategy;
  strata_variable_t handle = nullptr;
  VariableOptions options;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;

  ~State() {
    if (handle) strategy->vt->variable_destroy(strategy->handle, handle);
  }
};

namespace {

// The C replica handle to use for `s` from this thread: this replica's
// inside run, NULL (cross-replica) otherwise. A variable of another strategy
// used inside run is an error, except the Default strategy's, which has one
// copy and is read and written cross-replica.
strata_replica_t replica_for(const detail::StrategyImpl& s, const std::string& name) {
  const detail::ThreadState& t = detail::tls();
  if (t.merge != nullptr || t.replica == nullptr) return nullptr;
  if (t.replica->impl() == &s) return t.replica->handle();
  STRATA_ENFORCE(s.is_default, STRATA_ERR_FAILED_PRECONDITION, "variable '", name,
                 "' belongs to strategy '", s.name, "' but is used inside a replica function of '",
                 t.replica->impl()->name, "'; use variables created under the running strategy's scope");
  return nullptr;
}

bool has_variable_ref(const detail::StrategyImpl& s);

thread_local detail::VariableCapture* t_capture = nullptr;

}  // namespace

namespace detail {

VariableCapture::VariableCapture(Mode mode, std::vector<RemoteVariable>* remotes)
    : mode_(mode), remotes_(remotes), outer_(t_capture) {
  t_capture = this;
}

VariableCapture::~VariableCapture() { t_capture = outer_; }

VariableCapture* VariableCapture::current() { return t_capture; }

bool keeps_variables_remotely(const StrategyImpl& s) { return has_variable_ref(s); }

void VariableCapture::check_all_bound() const {
  if (next_ >= remotes_->size()) return;
  const RemoteVariable& r = (*remotes_)[next_];
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "this process's model and optimizer created ", next_,
               " variable(s) but the chief's created ", remotes_->size(), "; the first one missing here is '",
               r.name(), "' ", dtype_name(r.dtype()), detail::shape_string(r.shape()),
               " (chief's); every role (chief and workers) must build the same model from the registered factory");
}

}  // namespace detail

Variable::Variable(const TensorView& initial, VariableOptions options) : state_(std::make_unique<State>()) {
  if (detail::VariableCapture* cap = detail::VariableCapture::current();
      cap != nullptr && cap->mode() == detail::VariableCapture::Mode::kBind) {
    // A worker building the chief's model: attach to the chief's variable
    // in the same position instead of creating one.
    const std::size_t i = cap->take();
    const std::string mine = "'" + options.name + "' " + dtype_name(initial.dtype()) + detail::shape_string(initial.shape());
    STRATA_ENFORCE(i < cap->remotes().size(), STRATA_ERR_INVALID_ARGUMENT, "variable ", mine, " (number ", i + 1,
                   " in creation order) has no counterpart: the chief's model and optimizer created only ",
                   cap->remotes().size(), " variable(s); every role (chief and workers) must build the same model "
                   "from the registered factory");
    const RemoteVariable& r = cap->remotes()[i];
    STRATA_ENFORCE(r.name() == options.name && r.dtype() == initial.dtype() && r.shape() == initial.shape(),
                   STRATA_ERR_INVALID_ARGUMENT, "variable number ", i + 1, " in creation order differs: this "
                   "process's is ", mine, ", the chief's is '", r.name(), "' ", dtype_name(r.dtype()),
                   detail::shape_string(r.shape()), "; every role (chief and workers) must build the same model from the "
                   "registered factory");
    attach(r);
    return;
  }
  detail::StrategyImpl& s = detail::current_impl();
  const detail::ThreadState& t = detail::tls();
  STRATA_ENFORCE(t.merge != nullptr || t.replica == nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "variable '", options.name,
                 "' created inside a replica function (replica context); create variables under "
                 "strategy.scope() before calling run, or inside merge_call");
  detail::check_host_compact(initial.dl(), "initial value");
  state_->strategy = s.shared_from_this();  // the strategy outlives its variables
  state_->options = std::move(options);
  state_->dtype = initial.dtype();
  state_->shape = initial.shape();
  strata_variable_desc desc{};
  STRATA_INIT_HEADER(&desc, strata_variable_desc);
  desc.name = state_->options.name.c_str();
  desc.synchronization = static_cast<std::uint32_t>(state_->options.synchronization);
  desc.aggregation = static_cast<std::uint32_t>(state_->options.aggregation);
  desc.trainable = state_->options.trainable ? 1 : 0;
  strata_error err;
  strata_error_init(&err);
  detail::CrossReplicaLock lock(s);
  detail::check(s.vt->variable_create(s.handle, &desc, &initial.dl(), &state_->handle, &err), err,
                ("creating variable '" + state_->options.name + "' in strategy '" + s.name + "'").c_str());
  if (detail::VariableCapture* cap = detail::VariableCapture::current();
      cap != nullptr && cap->mode() == detail::VariableCapture::Mode::kRecord && has_variable_ref(s)) {
    cap->remotes().push_back(remote());
    cap->take();
  }
}

namespace {
bool has_variable_ref(const detail::StrategyImpl& s) {
  return STRATA_HAS_FIELD(s.vt, strata_strategy_vtable, variable_ref) && s.vt->variable_ref != nullptr;
}
void append_bytes(void* user, const char* data, std::uint64_t len) {
  static_cast<std::string*>(user)->append(data, static_cast<std::size_t>(len));
}
}  // namespace

Variable::Variable(const RemoteVariable& remote) : state_(std::make_unique<State>()) { attach(remote); }

void Variable::attach(const RemoteVariable& remote) {
  STRATA_ENFORCE(remote.defined(), STRATA_ERR_INVALID_ARGUMENT,
                 "Variable(RemoteVariable): the RemoteVariable is empty; pass one the chief created");
  detail::StrategyImpl& s = detail::current_impl();
  const detail::ThreadState& t = detail::tls();
  const ps_detail::VariableInfo& info = *remote.info();
  STRATA_ENFORCE(t.merge != nullptr || t.replica == nullptr, STRATA_ERR_FAILED_PRECONDITION, "variable '",
                 info.name, "' attached inside a replica function; attach it before calling run");
  STRATA_ENFORCE(has_variable_ref(s), STRATA_ERR_INVALID_ARGUMENT, "variable '", info.name,
                 "' lives on the ps tasks but the current strategy '", s.name,
                 "' keeps its variables in this process; attach it under a parameter_server strategy's scope");
  state_->strategy = s.shared_from_this();
  state_->options.name = info.name;
  state_->options.synchronization = static_cast<Synchronization>(info.synchronization);
  state_->options.aggregation = static_cast<Aggregation>(info.aggregation);
  state_->options.trainable = info.trainable;
  state_->dtype = info.dtype;
  state_->shape = info.shape;
  ps_detail::Writer w;
  ps_detail::write_variable(w, info);
  const std::string ref = w.take();
  strata_variable_desc desc{};
  STRATA_INIT_HEADER(&desc, strata_variable_desc);
  desc.name = state_->options.name.c_str();
  desc.synchronization = info.synchronization;
  desc.aggregation = info.aggregation;
  desc.trainable = info.trainable ? 1 : 0;
  desc.attach_ref = ref.data();
  desc.attach_ref_len = ref.size();
  strata_error err;
  strata_error_init(&err);
  detail::CrossReplicaLock lock(s);
  detail::check(s.vt->variable_create(s.handle, &desc, nullptr, &state_->handle, &err), err,
                ("attaching to variable '" + info.name + "' in strategy '" + s.name + "'").c_str());
}

RemoteVariable Variable::remote() const {
  STRATA_ENFORCE(state_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "use of a moved-from Variable");
  detail::StrategyImpl& s = *state_->strategy;
  STRATA_ENFORCE(has_variable_ref(s), STRATA_ERR_FAILED_PRECONDITION, "variable '", state_->options.name,
                 "' belongs to strategy '", s.name,
                 "', whose variables live in this process only; create it under a parameter_server strategy's "
                 "scope to use it in scheduled functions");
  std::string ref;
  strata_error err;
  strata_error_init(&err);
  detail::check(s.vt->variable_ref(s.handle, state_->handle, &append_bytes, &ref, &err), err,
                ("referencing variable '" + state_->options.name + "'").c_str());
  ps_detail::Reader r(ref);
  return RemoteVariable(ps_detail::read_variable(r));
}

Variable::Variable(Variable&& o) noexcept = default;
Variable& Variable::operator=(Variable&& o) noexcept = default;
Variable::~Variable() = default;

Tensor Variable::value() const {
  STRATA_ENFORCE(state_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "use of a moved-from Variable");
  detail::StrategyImpl& s = *state_->strategy;
  strata_replica_t r = replica_for(s, state_->options.name);
  DLManagedTensor* out = nullptr;
  strata_error err;
  strata_error_init(&err);
  const std::string what = "reading variable '" + state_->options.name + "'";
  if (r == nullptr) {
    detail::CrossReplicaLock lock(s);
    detail::check(s.vt->variable_read(s.handle, state_->handle, nullptr, &out, &err), err, what.c_str());
  } else {
    detail::check(s.vt->variable_read(s.handle, state_->handle, r, &out, &err), err, what.c_str());
  }
  return Tensor::adopt(out);
}

std::optional<TensorView> Variable::read_view() const {
  STRATA_ENFORCE(state_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "use of a moved-from Variable");
  detail::StrategyImpl& s = *state_->strategy;
  // variable_view is a 1.1 field: absent from older plugins' tables.
  if (!STRATA_HAS_FIELD(s.vt, strata_strategy_vtable, variable_view) || s.vt->variable_view == nullptr)
    return std::nullopt;
  strata_replica_t r = replica_for(s, state_->options.name);
  DLTensor out{};
  strata_error err;
  strata_error_init(&err);
  detail::check(s.vt->variable_view(s.handle, state_->handle, r, &out, &err), err,
                ("viewing variable '" + state_->options.name + "'").c_str());
  // A copy in GPU memory is no host view: callers (checkpoints) read it
  // through value() instead, which copies it to the host.
  if (out.device.device_type == kDLCUDA) return std::nullopt;
  return TensorView(out);
}

void Variable::update(strata_var_update_op op, const TensorView& value) {
  STRATA_ENFORCE(state_ != nullptr, STRATA_ERR_FAILED_PRECONDITION, "use of a moved-from Variable");
  detail::StrategyImpl& s = *state_->strategy;
  strata_replica_t r = replica_for(s, state_->options.name);
  strata_error err;
  strata_error_init(&err);
  static const char* const kOps[] = {"assign", "assign_add", "assign_sub"};
  const std::string what = std::string(kOps[op]) + " of variable '" + state_->options.name + "'";
  if (r == nullptr) {
    detail::CrossReplicaLock lock(s);
    detail::check(s.vt->variable_update(s.handle, state_->handle, nullptr, op, &value.dl(), &err), err,
                  what.c_str());
  } else {
    detail::check(s.vt->variable_update(s.handle, state_->handle, r, op, &value.dl(), &err), err,
                  what.c_str());
  }
}

void Variable::assign(const TensorView& value) { update(STRATA_VAR_ASSIGN, value); }
void Variable::assign_add(const TensorView& value) { update(STRATA_VAR_ASSIGN_ADD, value); }
void Variable::assign_sub(const TensorView& value) { update(STRATA_VAR_ASSIGN_SUB, value); }

const std::string& Variable::name() const { return state_->options.name; }
DType Variable::dtype() const { return state_->dtype; }
const std::vector<std::int64_t>& Variable::shape() const { return state_->shape; }
Synchronization Variable::synchronization() const { return state_->options.synchronization; }
Aggregation Variable::aggregation() const { return state_->options.aggregation; }
bool Variable::trainable() const { return state_->options.trainable; }
Strategy& Variable::strategy() const { return *state_->strategy->view; }
detail::StrategyImpl* Variable::strategy_impl() const { return state_ ? state_->strategy.get() : nullptr; }
strata_variable_t Variable::handle() const { return state_ ? state_->handle : nullptr; }

}  // namespace strata
