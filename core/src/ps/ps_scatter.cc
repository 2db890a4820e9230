// SPDX-License-Identifier: Apache-2.0
// Scatter updates of remote variables (tf.Variable.scatter_add/sub/update
// with tf.IndexedSlices). The client checks every index and the values'
// shape against the whole variable (so an error names the variable's shape
// and the offending index, and nothing is sent), splits the rows by shard
// and sends each shard its rows with shard-local indices as one
// kVarScatterOnce request: the ps applies them under the shard's lock, at
// most once per request key.
#include <algorithm>
#include <cstring>

#include "api/kernels.h"
#include "ps/ps_internal.h"

namespace strata {
namespace ps_detail {
namespace {

template <class T>
void apply_row(char* dst, const char* src, std::int64_t n, std::uint32_t op) {
  for (std::int64_t i = 0; i < n; ++i) {
    T d, s;
    std::memcpy(&d, dst + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    std::memcpy(&s, src + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    d = static_cast<T>(op == kAssignAdd ? d + s : d - s);
    std::memcpy(dst + static_cast<std::size_t>(i) * sizeof(T), &d, sizeof(T));
  }
}

const char* op_name(std::uint32_t op) {
  return op == kAssign ? "scatter_update" : op == kAssignAdd ? "scatter_add" : "scatter_sub";
}

}  // namespace

void apply_scatter(Tensor& shard, std::uint64_t shard_id, Reader& r, const std::string& who) {
  const std::uint32_t op = r.u32();
  STRATA_ENFORCE(op == kAssign || op == kAssignAdd || op == kAssignSub, STRATA_ERR_INVALID_ARGUMENT, who,
                 ": unknown scatter op ", op);
  const std::uint64_t n = r.u64();
  const auto shape = shard.shape();
  STRATA_ENFORCE(!shape.empty(), STRATA_ERR_INVALID_ARGUMENT, who, ": shard ", shard_id,
                 " is a scalar; scatter updates need rank >= 1");
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  for (auto& i : idx) {
    i = r.i64();
    STRATA_ENFORCE(i >= 0 && i < shape[0], STRATA_ERR_INVALID_ARGUMENT, who, ": ", op_name(op), " of shard ",
                   shard_id, " (shape ", detail::shape_string(shape), "): row ", i, " is not in [0, ", shape[0], ")");
  }
  const Reader::TensorBytes rows = r.tensor_bytes();
  std::vector<std::int64_t> want = shape;
  want[0] = static_cast<std::int64_t>(n);
  STRATA_ENFORCE(rows.dtype == shard.dtype() && rows.shape == want, STRATA_ERR_INVALID_ARGUMENT, who, ": ",
                 op_name(op), " of shard ", shard_id, ": rows of ", dtype_name(rows.dtype), " ",
                 detail::shape_string(rows.shape), " do not fit the shard's ", dtype_name(shard.dtype()), " ", detail::shape_string(want));
  const std::size_t row_bytes = n == 0 ? 0 : rows.nbytes / static_cast<std::size_t>(n);
  const std::int64_t row_elems = static_cast<std::int64_t>(row_bytes / dtype_size(shard.dtype()));
  char* base = static_cast<char*>(shard.raw_data());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    char* dst = base + static_cast<std::size_t>(idx[k]) * row_bytes;
    const char* src = rows.data + k * row_bytes;
    if (op == kAssign) {
      std::memcpy(dst, src, row_bytes);
      continue;
    }
    switch (shard.dtype()) {
      case DType::kFloat32: apply_row<float>(dst, src, row_elems, op); break;
      case DType::kFloat64: apply_row<double>(dst, src, row_elems, op); break;
      case DType::kInt32: apply_row<std::int32_t>(dst, src, row_elems, op); break;
      case DType::kInt64: apply_row<std::int64_t>(dst, src, row_elems, op); break;
      case DType::kUInt8: apply_row<std::uint8_t>(dst, src, row_elems, op); break;
      default:
        STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, who, ": ", op_name(op), " of ", dtype_name(shard.dtype()),
                     " variables is not supported; use float32, float64, int32, int64 or uint8");
    }
  }
}

}  // namespace ps_detail

void RemoteVariable::scatter(std::uint32_t op, const IndexedSlices& slices) const {
  STRATA_ENFORCE(info_ != nullptr, STRATA_ERR_FAILED_PRECONDITION,
                 "empty RemoteVariable; create it with ClusterCoordinator::create_variable");
  const ps_detail::VariableInfo& v = *info_;
  const char* what = ps_detail::op_name(op);
  STRATA_ENFORCE(!v.shape.empty(), STRATA_ERR_INVALID_ARGUMENT, what, " of variable '", v.name,
                 "': it is a scalar (shape []); scatter updates need rank >= 1 (use assign/assign_add)");
  const Tensor& values = slices.values;
  STRATA_ENFORCE(values.defined(), STRATA_ERR_INVALID_ARGUMENT, what, " of variable '", v.name,
                 "': IndexedSlices.values is undefined; pass the rows to write");
  STRATA_ENFORCE(slices.indices.defined() && slices.indices.dtype() == DType::kInt64 &&
                     slices.indices.shape().size() == 1,
                 STRATA_ERR_INVALID_ARGUMENT, what, " of variable '", v.name,
                 "': IndexedSlices.indices must be an int64 vector [n]");
  STRATA_ENFORCE(slices.dense_shape.empty() || slices.dense_shape == v.shape, STRATA_ERR_INVALID_ARGUMENT, what,
                 " of variable '", v.name, "' of shape ", detail::shape_string(v.shape), ": IndexedSlices.dense_shape is ",
                 detail::shape_string(slices.dense_shape));
  const std::vector<std::int64_t> indices = Tensor::copy_of(TensorView(slices.indices)).to_vector<std::int64_t>();
  const std::int64_t n = static_cast<std::int64_t>(indices.size());
  std::vector<std::int64_t> want = v.shape;
  want[0] = n;
  STRATA_ENFORCE(values.dtype() == v.dtype && values.shape() == want, STRATA_ERR_INVALID_ARGUMENT, what,
                 " of variable '", v.name, "' of shape ", detail::shape_string(v.shape), " and dtype ", dtype_name(v.dtype),
                 ": values of shape ", detail::shape_string(values.shape()), " and dtype ", dtype_name(values.dtype()),
                 " do not match ", detail::shape_string(want), " (the number of indices, ", n,
                 ", followed by the variable's shape[1:])");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t x = indices[static_cast<std::size_t>(i)];
    STRATA_ENFORCE(x >= 0 && x < v.shape[0], STRATA_ERR_INVALID_ARGUMENT, what, " of variable '", v.name,
                   "' of shape ", detail::shape_string(v.shape), ": indices[", i, "] = ", x, " is not in [0, ", v.shape[0],
                   ")");
  }
  if (n == 0) return;
  Tensor staged;
  const char* base = static_cast<const char*>(values.raw_data());
  if (!TensorView(values).is_contiguous()) {
    staged = Tensor::copy_of(TensorView(values));
    base = static_cast<const char*>(staged.raw_data());
  }
  const std::size_t row_bytes = values.nbytes() / static_cast<std::size_t>(n);
  auto rt = ps_detail::Runtime::current();
  // Shards are contiguous row ranges in order: find each index's shard.
  std::vector<std::int64_t> starts;
  for (const auto& s : v.shards) starts.push_back(s.row_offset);
  std::vector<std::vector<std::int64_t>> rows_of(v.shards.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t x = indices[static_cast<std::size_t>(i)];
    const auto k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin() - 1);
    rows_of[k].push_back(i);
  }
  for (std::size_t k = 0; k < v.shards.size(); ++k) {
    if (rows_of[k].empty()) continue;
    const ps_detail::ShardRef& s = v.shards[k];
    std::string gathered;
    gathered.reserve(rows_of[k].size() * row_bytes);
    ps_detail::Writer w;
    ps_detail::Runtime::write_request_key(w, rt->request_key());
    w.u64(s.id);
    w.u32(op);
    w.u64(rows_of[k].size());
    for (std::int64_t i : rows_of[k]) {
      w.i64(indices[static_cast<std::size_t>(i)] - s.row_offset);
      gathered.append(base + static_cast<std::size_t>(i) * row_bytes, row_bytes);
    }
    std::vector<std::int64_t> shape = v.shape;
    shape[0] = static_cast<std::int64_t>(rows_of[k].size());
    w.tensor_raw(v.dtype, shape, gathered.data(), gathered.size());
    rt->ps_call(s.ps, ps_detail::kVarScatterOnce, w.take());
  }
}

void RemoteVariable::scatter_add(const IndexedSlices& slices) const { scatter(ps_detail::kAssignAdd, slices); }
void RemoteVariable::scatter_sub(const IndexedSlices& slices) const { scatter(ps_detail::kAssignSub, slices); }
void RemoteVariable::scatter_update(const IndexedSlices& slices) const { scatter(ps_detail::kAssign, slices); }

}  // namespace strata
