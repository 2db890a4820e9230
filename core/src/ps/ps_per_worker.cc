// SPDX-License-Identifier: Apache-2.0
// Per-worker values on the worker side (tf's PerWorkerValues, per-worker
// datasets and iterators): the dataset function registry, this worker's
// table of values by id (filled by the coordinator's kPerWorkerCreate
// requests, which run before any later closure on this worker), and how a
// scheduled function resolves a per-worker argument to its own value.
//
// The table belongs to the process: a restarted worker starts empty and the
// coordinator creates every per-worker value there again (datasets start
// from their beginning, as in tf.distribute).
#include <map>

#include "log.h"
#include "ps/ps_internal.h"

namespace strata {

struct LocalIterator::Impl {
  std::mutex mu;  // closures on one worker run one at a time; this guards the rest
  DatasetIterator it;
  std::string what;  // "per-worker iterator 7 on worker task 1", for messages
  bool ended = false;
};

namespace ps_detail {
namespace {

std::mutex& dataset_registry_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, DatasetFunction>& dataset_registry() {
  static std::map<std::string, DatasetFunction> r;
  return r;
}

struct LocalValue {
  PerWorkerKind kind = PerWorkerKind::kValue;
  Value value;                     // kValue
  std::optional<Dataset> dataset;  // kDataset
  InputContext ctx;                // kDataset: the context its function got
  std::shared_ptr<LocalIterator::Impl> iterator;  // kIterator
};

std::mutex g_local_mu;
std::map<std::uint64_t, std::shared_ptr<LocalValue>> g_local;

const char* kind_name(PerWorkerKind k) {
  switch (k) {
    case PerWorkerKind::kValue: return "per-worker value";
    case PerWorkerKind::kDataset: return "per-worker dataset";
    case PerWorkerKind::kIterator: return "per-worker iterator";
  }
  return "per-worker value";
}

std::shared_ptr<LocalValue> find_local(std::uint64_t id, PerWorkerKind kind, const std::string& who) {
  std::lock_guard<std::mutex> l(g_local_mu);
  auto it = g_local.find(id);
  STRATA_ENFORCE(it != g_local.end(), STRATA_ERR_FAILED_PRECONDITION, kind_name(kind), " ", id,
                 " does not exist on ", who,
                 "; create it with ClusterCoordinator::create_per_worker_* and pass it to schedule() (a value "
                 "cannot be used outside the scheduled functions of the job that created it)");
  STRATA_ENFORCE(it->second->kind == kind, STRATA_ERR_INVALID_ARGUMENT, "per-worker value ", id, " on ", who,
                 " is a ", kind_name(it->second->kind), ", not a ", kind_name(kind));
  return it->second;
}

std::string this_worker() {
  auto rt = Runtime::current();
  return task_name(rt->job(), rt->index());
}

const PerWorkerRef& ref_arg(const Args& args, std::size_t i, PerWorkerKind kind) {
  STRATA_ENFORCE(i < args.size(), STRATA_ERR_INVALID_ARGUMENT, "the function was given ", args.size(),
                 " argument(s) but reads argument ", i, "; pass it to schedule()");
  const PerWorkerRef* p = std::get_if<PerWorkerRef>(&args[i]);
  STRATA_ENFORCE(p != nullptr, STRATA_ERR_INVALID_ARGUMENT, "argument ", i, " is a ", value_kind_name(args[i]),
                 ", not a ", kind_name(kind), "; pass the coordinator's ", kind_name(kind), " to schedule()");
  STRATA_ENFORCE(p->kind == kind, STRATA_ERR_INVALID_ARGUMENT, "argument ", i, " is a ", kind_name(p->kind),
                 ", not a ", kind_name(kind));
  return *p;
}

}  // namespace

void clear_per_worker_values() {
  std::map<std::uint64_t, std::shared_ptr<LocalValue>> gone;
  {
    std::lock_guard<std::mutex> l(g_local_mu);
    gone.swap(g_local);
  }
}  // destroyed here, outside the lock

std::string per_worker_create(const Runtime& rt, const std::string& payload) {
  const std::string who = task_name(rt.job(), rt.index());
  Reader r(payload);
  const std::uint64_t id = r.u64();
  const std::uint8_t k = r.u8();
  STRATA_ENFORCE(k <= static_cast<std::uint8_t>(PerWorkerKind::kIterator), STRATA_ERR_DATA_LOSS,
                 "unknown per-worker kind ", int(k));
  const PerWorkerKind kind = static_cast<PerWorkerKind>(k);
  const std::string fn = r.str();
  const std::uint64_t parent = r.u64();
  const std::uint64_t nargs = r.u64();
  Args args;
  for (std::uint64_t i = 0; i < nargs; ++i) args.push_back(r.value());
  auto v = std::make_shared<LocalValue>();
  v->kind = kind;
  const std::string where =
      kind == PerWorkerKind::kIterator
          ? detail::str_cat(kind_name(kind), " ", id, " (over per-worker dataset ", parent, ") on ", who)
          : detail::str_cat(kind_name(kind), " ", id, " ('", fn, "') on ", who);
  std::string reply;
  switch (kind) {
    case PerWorkerKind::kValue: {
      RemoteFunction f = find_function(fn);
      STRATA_ENFORCE(static_cast<bool>(f), STRATA_ERR_NOT_FOUND, who, " has no function '", fn,
                     "'; register it with STRATA_REGISTER_FUNCTION in the program the workers run");
      v->value = run_user(where, [&] { return f(args); });
      Writer w;
      w.value(v->value);
      reply = w.take();
      break;
    }
    case PerWorkerKind::kDataset: {
      DatasetFunction f;
      {
        std::lock_guard<std::mutex> l(dataset_registry_mu());
        auto it = dataset_registry().find(fn);
        if (it != dataset_registry().end()) f = it->second;
      }
      STRATA_ENFORCE(static_cast<bool>(f), STRATA_ERR_NOT_FOUND, who, " has no dataset function '", fn,
                     "'; register it with STRATA_REGISTER_DATASET_FN in the program the workers run");
      v->ctx.num_input_pipelines = rt.count("worker");
      v->ctx.input_pipeline_id = rt.index();
      v->ctx.num_replicas_in_sync = 1;
      v->dataset = run_user(where, [&] { return f(v->ctx); });
      Writer w;
      w.value(Value());
      reply = w.take();
      break;
    }
    case PerWorkerKind::kIterator: {
      auto ds = find_local(parent, PerWorkerKind::kDataset, who);
      auto impl = std::make_shared<LocalIterator::Impl>();
      impl->what = where;
      impl->it = run_user(where, [&] { return ds->dataset->make_iterator(ds->ctx); });
      v->iterator = std::move(impl);
      Writer w;
      w.value(Value());
      reply = w.take();
      break;
    }
  }
  {
    std::lock_guard<std::mutex> l(g_local_mu);
    g_local[id] = std::move(v);  // a re-creation (after a coordinator retry) replaces it
  }
  detail::logger("ps")->debug("{}: created {}", who, where);
  return reply;
}

}  // namespace ps_detail

// ---- registry and worker-side API ----

void register_dataset_function(const std::string& name, DatasetFunction fn) {
  STRATA_ENFORCE(!name.empty(), STRATA_ERR_INVALID_ARGUMENT, "a dataset function needs a non-empty name");
  STRATA_ENFORCE(static_cast<bool>(fn), STRATA_ERR_INVALID_ARGUMENT, "dataset function '", name, "' is empty");
  std::lock_guard<std::mutex> l(ps_detail::dataset_registry_mu());
  STRATA_ENFORCE(ps_detail::dataset_registry().count(name) == 0, STRATA_ERR_ALREADY_EXISTS, "dataset function '",
                 name, "' is registered twice; give each STRATA_REGISTER_DATASET_FN its own name");
  ps_detail::dataset_registry()[name] = std::move(fn);
}

DatasetFunction ps_detail::find_dataset_function(const std::string& name) {
  std::lock_guard<std::mutex> l(ps_detail::dataset_registry_mu());
  auto it = ps_detail::dataset_registry().find(name);
  return it == ps_detail::dataset_registry().end() ? DatasetFunction() : it->second;
}

std::vector<std::string> registered_dataset_functions() {
  std::lock_guard<std::mutex> l(ps_detail::dataset_registry_mu());
  std::vector<std::string> out;
  for (const auto& [k, v] : ps_detail::dataset_registry()) out.push_back(k);
  return out;
}

LocalIterator get_iterator(const Args& args, std::size_t i) {
  const PerWorkerRef& ref = ps_detail::ref_arg(args, i, PerWorkerKind::kIterator);
  return LocalIterator(ps_detail::find_local(ref.id, ref.kind, ps_detail::this_worker())->iterator);
}

const Value& get_per_worker_value(const Args& args, std::size_t i) {
  const PerWorkerRef& ref = ps_detail::ref_arg(args, i, PerWorkerKind::kValue);
  // The table keeps the value alive as long as the process (a value is
  // replaced only by its own re-creation, before any closure runs).
  return ps_detail::find_local(ref.id, ref.kind, ps_detail::this_worker())->value;
}

std::optional<Element> LocalIterator::get_next_as_optional() {
  STRATA_ENFORCE(impl_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "empty LocalIterator; get one with strata::get_iterator(args, i)");
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->ended) return std::nullopt;
  std::optional<Element> e = impl_->it.next();
  if (!e) impl_->ended = true;
  return e;
}

Element LocalIterator::get_next() {
  std::optional<Element> e = get_next_as_optional();
  if (!e)
    STRATA_THROW(STRATA_ERR_OUT_OF_RANGE, "End of sequence: ", impl_->what,
                 " has no more elements (tf's OutOfRangeError); repeat() the dataset, or stop scheduling "
                 "steps when join() raises OutOfRangeError");
  return std::move(*e);
}

}  // namespace strata
