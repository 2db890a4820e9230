// SPDX-License-Identifier: Apache-2.0
// The byte format of DatasetIterator and DistributedIterator states. A
// state is opaque to users but crosses process restarts, so it is framed
// (magic, format number, length, CRC32C): a truncated or garbled file is a
// DataLossError before any field is interpreted, never a wrong position.
#include <cstring>
#include <utility>

#include "data/dataset_internal.h"
#include "strata/error.hpp"
#include "strata/sdk/records.hpp"

namespace strata::detail {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'I', 'T'};
constexpr std::uint64_t kFormat = 1;
// magic | u64 format | u64 payload length | u32 crc32c(kind + payload)
constexpr std::size_t kHeader = sizeof kMagic + 8 + 8 + 4;

void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

void StateWriter::u64(std::uint64_t v) { put_u64(buf_, v); }

void StateWriter::str(const std::string& s) {
  u64(s.size());
  buf_.append(s);
}

void StateWriter::strings(const std::vector<std::string>& v) {
  u64(v.size());
  for (const std::string& s : v) str(s);
}

void StateWriter::tensor(const Tensor& t) {
  const TensorView v(t);
  // A strided view (a map() may return one) is written compact.
  if (!v.is_contiguous()) return tensor(t.clone());
  u8(static_cast<std::uint8_t>(t.dtype()));
  const std::vector<std::int64_t> shape = t.shape();
  u64(shape.size());
  for (std::int64_t d : shape) i64(d);
  u64(t.nbytes());
  if (t.nbytes() > 0) buf_.append(static_cast<const char*>(v.raw_data()), t.nbytes());
}

void StateWriter::element(const Element& e) {
  u64(e.tensors.size());
  for (std::size_t i = 0; i < e.tensors.size(); ++i) {
    str(e.names.at(i));
    tensor(e.tensors[i]);
  }
}

std::string StateWriter::seal(const std::string& kind) const {
  std::string out(kMagic, sizeof kMagic);
  put_u64(out, kFormat);
  std::string body;
  put_u64(body, kind.size());
  body += kind;
  body += buf_;
  put_u64(out, body.size());
  const std::uint32_t crc = sdk::crc32c(body.data(), body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  return out + body;
}

StateReader::StateReader(const std::string& bytes, const std::string& kind) {
  auto loss = [&](const std::string& why) {
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved ", kind, " iterator state (", bytes.size(),
                 " bytes) is unusable: ", why, "; pass the bytes save_state() returned, unchanged");
  };
  if (bytes.size() < kHeader) loss("it is shorter than the state header");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) loss("it does not start with an iterator state's magic");
  const std::uint64_t format = get_u64(bytes.data() + sizeof kMagic);
  const std::uint64_t len = get_u64(bytes.data() + sizeof kMagic + 8);
  if (len != bytes.size() - kHeader)
    loss(str_cat("its header announces ", len, " bytes of content but ", bytes.size() - kHeader,
                 " follow (truncated or padded)"));
  std::uint32_t crc = 0;
  for (int i = 0; i < 4; ++i)
    crc |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[sizeof kMagic + 16 + i])) << (8 * i);
  if (sdk::crc32c(bytes.data() + kHeader, len) != crc) loss("its checksum does not match (corrupted)");
  if (format > kFormat)
    STRATA_THROW(STRATA_ERR_UNIMPLEMENTED, "the saved iterator state has format ", format,
                 " but this Strata reads format ", kFormat, "; restore it with the Strata version that saved it");
  if (format != kFormat) loss(str_cat("it announces format ", format));
  data_ = bytes.substr(kHeader);
  const std::string saved_kind = str();
  if (saved_kind != kind)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved state is a ", saved_kind, " iterator's, not a ", kind,
                 " iterator's; restore it with ", saved_kind, " iterator's restore_state");
}

const char* StateReader::take(std::size_t n) {
  if (n > data_.size() - pos_)
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state ends early (", n, " bytes wanted at offset ", pos_,
                 " of ", data_.size(), "); it was written by an incompatible build or damaged");
  const char* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

std::uint8_t StateReader::u8() { return static_cast<std::uint8_t>(*take(1)); }

std::uint64_t StateReader::u64() { return get_u64(take(8)); }

std::uint64_t StateReader::count(std::size_t min_bytes) {
  const std::uint64_t n = u64();
  if (n > (data_.size() - pos_) / (min_bytes == 0 ? 1 : min_bytes))
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state has a list of ", n, " entries at offset ", pos_,
                 " but only ", data_.size() - pos_, " bytes left; it is damaged");
  return n;
}

std::string StateReader::str() {
  const std::uint64_t n = count(1);
  const char* p = take(n);
  return std::string(p, n);
}

std::vector<std::string> StateReader::strings() {
  std::vector<std::string> v(count(8));
  for (std::string& s : v) s = str();
  return v;
}

Tensor StateReader::tensor() {
  const std::uint8_t d = u8();
  if (d > static_cast<std::uint8_t>(DType::kUInt8))
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state holds a tensor of unknown dtype ", int{d});
  const auto dtype = static_cast<DType>(d);
  std::vector<std::int64_t> shape(count(8));
  std::uint64_t numel = 1;
  for (std::int64_t& dim : shape) {
    dim = i64();
    if (dim < 0) STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state holds a tensor dimension ", dim);
    numel *= static_cast<std::uint64_t>(dim);
  }
  const std::uint64_t n = u64();
  if (n != numel * dtype_size(dtype))
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state holds a tensor of ", n, " bytes for ", numel, " ",
                 dtype_name(dtype), " values");
  const char* p = take(n);
  if (n == 0) return Tensor::zeros(shape, dtype);
  return Tensor::from_bytes(p, n, shape, dtype);
}

Element StateReader::element() {
  Element e;
  const std::uint64_t n = count(9);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::string name = str();
    e.names.push_back(std::move(name));
    e.tensors.push_back(tensor());
  }
  return e;
}

void StateReader::expect_end() const {
  if (pos_ != data_.size())
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "the saved iterator state has ", data_.size() - pos_,
                 " bytes after its end; it was written by an incompatible build or damaged");
}

void check_same_recipe(const std::vector<std::string>& saved, const std::vector<std::string>& mine, const char* what) {
  const std::size_t n = std::min(saved.size(), mine.size());
  for (std::size_t i = 0; i < n; ++i)
    if (saved[i] != mine[i])
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved ", what, " state is of a different dataset: transformation ",
                   i, " (counting from the source) is ", saved[i], " in the state but ", mine[i],
                   " here; restore into an iterator of the dataset the state was saved from");
  if (saved.size() != mine.size())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the saved ", what, " state is of a different dataset: it has ",
                 saved.size(), " transformations, this one ", mine.size(), " (the first ", n, " agree; the next is ",
                 saved.size() > n ? saved[n] + " in the state" : mine[n] + " here",
                 "); restore into an iterator of the dataset the state was saved from");
}

void save_input(StateWriter& w, ElementStream* up) {
  w.boolean(up != nullptr);
  if (up != nullptr) up->save(w);
}

void restore_input(StateReader& r, std::unique_ptr<ElementStream>& up) {
  const bool present = r.boolean();
  if (!present) {
    up.reset();
    return;
  }
  STRATA_ENFORCE(up != nullptr, STRATA_ERR_INTERNAL, "restoring an input that this stream has not opened");
  up->restore(r);
}

}  // namespace strata::detail
