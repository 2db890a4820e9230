// SPDX-License-Identifier: Apache-2.0
#include "ps/ps_host_api.h"

#include "host/host_state.h"
#include "ps/ps_internal.h"

namespace strata::ps_detail {
namespace {

template <class F>
strata_status_t guarded(strata_error* err, const char* fn, F&& f) {
  try {
    f();
    return STRATA_OK;
  } catch (const Error& e) {
    return detail::set_error(err, e.code(), e.what());
  } catch (const std::exception& e) {
    return detail::set_error(err, STRATA_ERR_INTERNAL, std::string(fn) + ": " + e.what());
  } catch (...) {
    return detail::set_error(err, STRATA_ERR_INTERNAL, std::string(fn) + " failed unexpectedly");
  }
}

// {"name": "fixed_shards", "num_shards": n} | {"name": "min_size",
// "min_shard_bytes", "max_shards", "bytes_per_string"} | {"name":
// "max_size", "max_shard_bytes", "max_shards", "bytes_per_string"}.
Partitioner partitioner_from_json(const json& p) {
  if (p.is_null()) return nullptr;
  STRATA_ENFORCE(p.is_object() && p.contains("name") && p["name"].is_string(), STRATA_ERR_INVALID_ARGUMENT,
                 "variable_partitioner must be an object with a \"name\" (fixed_shards, min_size or max_size), got ",
                 p.dump());
  const std::string name = p["name"].get<std::string>();
  auto i64 = [&](const char* key, std::int64_t dflt) {
    if (!p.contains(key)) return dflt;
    STRATA_ENFORCE(p[key].is_number_integer(), STRATA_ERR_INVALID_ARGUMENT, "variable_partitioner.", key,
                   " must be an integer, got ", p[key].dump());
    return p[key].get<std::int64_t>();
  };
  if (name == "fixed_shards") {
    STRATA_ENFORCE(p.contains("num_shards"), STRATA_ERR_INVALID_ARGUMENT,
                   "variable_partitioner fixed_shards needs \"num_shards\"");
    return FixedShardsPartitioner(i64("num_shards", 1));
  }
  if (name == "min_size")
    return MinSizePartitioner(i64("min_shard_bytes", 256 << 10), i64("max_shards", 1), i64("bytes_per_string", 16));
  if (name == "max_size") {
    STRATA_ENFORCE(p.contains("max_shard_bytes"), STRATA_ERR_INVALID_ARGUMENT,
                   "variable_partitioner max_size needs \"max_shard_bytes\"");
    return MaxSizePartitioner(i64("max_shard_bytes", 0), i64("max_shards", 0), i64("bytes_per_string", 16));
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown variable_partitioner '", name,
               "'; use fixed_shards, min_size or max_size");
}

std::shared_ptr<const VariableInfo> decode(const void* ref, uint64_t len) {
  STRATA_ENFORCE(ref != nullptr && len > 0, STRATA_ERR_INVALID_ARGUMENT,
                 "empty parameter-server variable reference; pass what ps_variable_create wrote");
  const std::string bytes(static_cast<const char*>(ref), static_cast<std::size_t>(len));
  Reader r(bytes);
  auto info = read_variable(r);
  STRATA_ENFORCE(r.at_end(), STRATA_ERR_DATA_LOSS, "parameter-server variable reference of ", len,
                 " bytes has trailing bytes; it was not written by this version of Strata");
  return info;
}

}  // namespace

strata_status_t host_ps_variable_create(const strata_host_api*, const char* name, const DLTensor* initial,
                                        const char* options_json, strata_write_fn write, void* user,
                                        strata_error* err) {
  return guarded(err, "ps_variable_create", [&] {
    STRATA_ENFORCE(initial != nullptr && write != nullptr, STRATA_ERR_INVALID_ARGUMENT,
                   "ps_variable_create: initial and write must not be NULL");
    const std::string vname = name != nullptr ? name : "";
    json o = json::object();
    if (options_json != nullptr && *options_json != '\0') {
      o = json::parse(options_json, nullptr, false);
      STRATA_ENFORCE(o.is_object(), STRATA_ERR_INVALID_ARGUMENT, "ps_variable_create: options are not a JSON object: ",
                     options_json);
    }
    const Partitioner part = partitioner_from_json(o.value("partitioner", json()));
    const Tensor value = Tensor::borrow(TensorView(*initial));  // create_variable copies it
    RemoteVariable rv = create_variable_on_coordinator(vname, value, part, o.value("synchronization", 0u),
                                                       o.value("aggregation", 0u), o.value("trainable", true));
    Writer w;
    write_variable(w, *rv.info());
    const std::string bytes = w.take();
    write(user, bytes.data(), bytes.size());
  });
}

strata_status_t host_ps_variable_read(const strata_host_api*, const void* ref, uint64_t ref_len,
                                      DLManagedTensor** out, strata_error* err) {
  return guarded(err, "ps_variable_read", [&] {
    STRATA_ENFORCE(out != nullptr, STRATA_ERR_INVALID_ARGUMENT, "ps_variable_read: out is NULL");
    RemoteVariable rv(decode(ref, ref_len));
    *out = rv.read().to_dlpack();
  });
}

strata_status_t host_ps_variable_update(const strata_host_api*, const void* ref, uint64_t ref_len, uint32_t op,
                                        const DLTensor* value, strata_error* err) {
  return guarded(err, "ps_variable_update", [&] {
    STRATA_ENFORCE(value != nullptr, STRATA_ERR_INVALID_ARGUMENT, "ps_variable_update: value is NULL");
    RemoteVariable rv(decode(ref, ref_len));
    const Tensor v = Tensor::borrow(TensorView(*value));  // no copy: the update reads it in place
    switch (op) {
      case kAssign: rv.assign(v); break;
      case kAssignAdd: rv.assign_add(v); break;
      case kAssignSub: rv.assign_sub(v); break;
      default:
        STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "ps_variable_update: unknown update op ", op,
                     "; use assign (0), assign_add (1) or assign_sub (2)");
    }
  });
}

}  // namespace strata::ps_detail
