// SPDX-License-Identifier: Apache-2.0
// Authentication of the libfabric transport (transports/libfabric/wire.h):
// the per-pair keys, and a stranger on the same provider (its own fabric,
// domain, address vector and endpoint, opened here with raw libfabric) that
// reads a rank's address from the store and posts forged control messages,
// forged goodbye/abort notices and data under guessed wire tags. Ranks run
// as threads over the host's in-process store, on "tcp;ofi_rxm" (iface lo)
// and "shm"; a provider that is absent skips.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "strata/error.hpp"
#include "strata/log.hpp"
#include "strata/plugin_host.hpp"
#include "transport_test_support.h"
#include "wire.h"

namespace strata {
namespace {

namespace lf = transport::libfabric;
using test::store_get;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using test::fill_pattern;
using test::pattern_mismatch;
using test::run_ranks;
using test::unique_name;
using Rank = test::TransportRank;

// ------------------------------------------------------------ pair keys ---

// Waits until another thread sets `flag`, for at most `limit` (the caller's
// checks then fail on what did not happen).
void wait_for_flag(const std::atomic<bool>& flag, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (!flag.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string key_hex(const lf::AuthKey& k) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t b : k) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

lf::AuthKey key_of(const std::string& secret, const std::string& comm, uint32_t src, uint32_t dst) {
  lf::AuthKey k{};
  EXPECT_TRUE(lf::pair_key(secret, comm, src, dst, &k));
  return k;
}

TEST(LibfabricAuthTest, PairKeysDifferPerPairAndPerCommunicator) {
  std::string s1, s2;
  ASSERT_TRUE(lf::random_secret(&s1));
  ASSERT_TRUE(lf::random_secret(&s2));
  ASSERT_EQ(s1.size(), lf::kSecretBytes);
  EXPECT_NE(s1, s2);
  // Every ordered pair of 8 ranks, in two communicators (other name, same
  // secret) and with another secret (same name): all distinct.
  std::set<std::string> seen;
  int n = 0;
  for (const auto& [secret, comm] : {std::pair<std::string, std::string>{s1, "job/a"}, {s1, "job/b"}, {s2, "job/a"}})
    for (uint32_t src = 0; src < 8; ++src)
      for (uint32_t dst = 0; dst < 8; ++dst) {
        if (src == dst) continue;
        seen.insert(key_hex(key_of(secret, comm, src, dst)));
        ++n;
      }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  // Deterministic (both ends derive the same key), and (src, dst) is not
  // (dst, src).
  EXPECT_EQ(key_of(s1, "job/a", 2, 5), key_of(s1, "job/a", 2, 5));
  EXPECT_NE(key_of(s1, "job/a", 2, 5), key_of(s1, "job/a", 5, 2));
  // The name and the ranks do not run into each other ("a" 1 vs "a\x01"...).
  EXPECT_NE(key_of(s1, "a", 1, 0), key_of(s1, std::string("a\x01", 2), 0, 0));

  // The derivation as wire.h documents it, computed independently.
  std::string msg = std::string("strata-lf-1") + '\0' + "job/a" + '\0';
  for (uint32_t v : {3u, 1u})
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ASSERT_NE(HMAC(EVP_sha256(), s1.data(), static_cast<int>(s1.size()),
                 reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len),
            nullptr);
  const lf::AuthKey k31 = key_of(s1, "job/a", 3, 1);
  EXPECT_EQ(std::memcmp(k31.data(), mac, lf::kAuthBytes), 0);

  EXPECT_TRUE(lf::same_key(k31.data(), k31.data()));
  lf::AuthKey flipped = k31;
  flipped[15] ^= 1;
  EXPECT_FALSE(lf::same_key(k31.data(), flipped.data()));

  // Tag masks: per communicator, and the mixed tags keep their uniqueness
  // and never take the control bit.
  uint64_t m1 = 0, m2 = 0, m3 = 0;
  ASSERT_TRUE(lf::data_tag_mask(s1, "job/a", &m1));
  ASSERT_TRUE(lf::data_tag_mask(s1, "job/b", &m2));
  ASSERT_TRUE(lf::data_tag_mask(s2, "job/a", &m3));
  EXPECT_NE(m1, m2);
  EXPECT_NE(m1, m3);
  std::set<uint64_t> tags;
  for (int src = 0; src < 4; ++src)
    for (uint64_t seq = 0; seq < 64; ++seq) {
      const uint64_t t = lf::data_wire_tag(src, seq, 64, 61, m1);
      EXPECT_EQ(t & lf::ctrl_wire_tag(64), 0u);
      EXPECT_NE(t, lf::data_wire_tag(src, seq, 64, 61, 0));
      tags.insert(t);
    }
  EXPECT_EQ(tags.size(), 4u * 64u);
}

// ------------------------------------------------------------- stranger ---


std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return out;
}

// An endpoint of the same provider that is no rank of the communicator: it
// knows a victim's address (from the store) but not the communicator's secret.
class Stranger {
 public:
  Stranger(const std::string& provider, const std::vector<uint8_t>& victim) {
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_TAGGED;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = ::strdup(provider.c_str());
    const bool ip = provider != "shm";
    int ret = fi_getinfo(FI_VERSION(1, 10), ip ? "127.0.0.1" : nullptr, nullptr, ip ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
    if (ret != 0) throw std::runtime_error(std::string("stranger: fi_getinfo: ") + fi_strerror(-ret));
    const uint64_t fmt = info_->ep_attr->mem_tag_format;
    tag_bits_ = fmt == 0 ? 64 : 64 - __builtin_clzll(fmt);
    check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
    check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
    fi_av_attr av_attr{};
    av_attr.type = info_->domain_attr->av_type;
    av_attr.count = 4;
    check(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_NONE;
    check(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
    check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
    check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind av");
    check(fi_enable(ep_), "fi_enable");
    if (fi_av_insert(av_, victim.data(), 1, &victim_, 0, nullptr) != 1)
      throw std::runtime_error("stranger: fi_av_insert");
  }
  ~Stranger() {
    for (fid_t f : {ep_ ? &ep_->fid : nullptr, av_ ? &av_->fid : nullptr, cq_ ? &cq_->fid : nullptr,
                    domain_ ? &domain_->fid : nullptr, fabric_ ? &fabric_->fid : nullptr})
      if (f != nullptr) fi_close(f);
    if (info_ != nullptr) fi_freeinfo(info_);
  }
  int tag_bits() const { return tag_bits_; }

  // Sends one tagged message and waits for its completion (the provider
  // then has it at, or on its way to, the victim).
  void send(uint64_t tag, const void* data, size_t len) {
    fi_context2 ctx{};
    const auto until = Clock::now() + std::chrono::seconds(10);
    ssize_t ret;
    while ((ret = fi_tsend(ep_, data, len, nullptr, victim_, tag, &ctx)) == -FI_EAGAIN) {
      poll();
      if (Clock::now() > until) throw std::runtime_error("stranger: fi_tsend stays EAGAIN");
    }
    if (ret != 0) throw std::runtime_error(std::string("stranger: fi_tsend: ") + fi_strerror(static_cast<int>(-ret)));
    while (!poll())
      if (Clock::now() > until) throw std::runtime_error("stranger: no send completion");
  }
  // A control message (its eager payload's size in `total` and, for a
  // whole message, in `chunk`, as the transport's own).
  void send_ctrl(lf::CtrlHeader h, const std::string& payload = "") {
    if (h.nchunks == 0) h.total = h.chunk = payload.size();
    std::vector<char> buf(sizeof h + payload.size());
    std::memcpy(buf.data(), &h, sizeof h);
    std::memcpy(buf.data() + sizeof h, payload.data(), payload.size());
    send(lf::ctrl_wire_tag(tag_bits_), buf.data(), buf.size());
  }

 private:
  static void check(int ret, const char* what) {
    if (ret != 0) throw std::runtime_error(std::string("stranger: ") + what + ": " + fi_strerror(-ret));
  }
  bool poll() {
    fi_cq_tagged_entry e;
    const ssize_t n = fi_cq_read(cq_, &e, 1);
    if (n == 1) return true;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq_, &err, 0);
      throw std::runtime_error(std::string("stranger: send failed: ") + fi_strerror(err.err));
    }
    return false;
  }
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_addr_t victim_ = FI_ADDR_UNSPEC;
  int tag_bits_ = 64;
};

struct ProviderCase {
  std::string label;
  std::string options;
  std::string provider;
};
void PrintTo(const ProviderCase& c, std::ostream* os) { *os << c.label; }

// Restores the log level and stops capturing stderr when a test ends.
struct StderrCapture {
  StderrCapture() : level(log_level()) {
    set_log_level("warn");
    ::testing::internal::CaptureStderr();
  }
  std::string take() {
    taken = true;
    return ::testing::internal::GetCapturedStderr();
  }
  ~StderrCapture() {
    if (!taken) ::testing::internal::GetCapturedStderr();
    set_log_level(level);
  }
  std::string level;
  bool taken = false;
};

class LibfabricAuth : public ::testing::TestWithParam<ProviderCase> {
 protected:
  void SetUp() override {
    PluginHost host;
    try {
      Rank probe(host, "libfabric", GetParam().options);
    } catch (const NotFoundError& e) {
      GTEST_SKIP() << GetParam().label << " is not available here: " << e.what();
    }
  }

  // Ranks 0 and 1 (threads) of a fresh communicator; once both joined, the
  // stranger reads rank 0's address from the store and runs `forge` against
  // it while rank 0 keeps driving progress; only then does rank 1 send,
  // in order on tag 7: an 8-byte eager message, a 16 KiB message split into
  // 4 data messages (max_message_bytes 4096), and another 8-byte one; rank 0
  // receives them, checks every byte, and answers on tag 9 (its sends to
  // rank 1 must still work). Returns what was logged.
  std::string exchange_with(const std::function<void(Stranger&)>& forge) {
    PluginHost host;
    const std::string name = unique_name("lf-auth");
    const std::string options = [&] {
      json o = json::parse(GetParam().options);
      o["max_message_bytes"] = 4096;
      return o.dump();
    }();
    std::atomic<bool> forged{false}, ready{false};
    std::string forge_error;
    StderrCapture capture;
    // Closed only after the ranks: shm endpoints of one process map each
    // other's memory.
    std::unique_ptr<Stranger> s;
    std::thread stranger([&] {
      try {
        const std::string addr = store_get(host.host_api(), name + "/lf/addr/0", 20000);
        s = std::make_unique<Stranger>(GetParam().provider, unhex(addr));
        forge(*s);
      } catch (const std::exception& e) {
        forge_error = e.what();
      }
      forged = true;
    });
    constexpr uint64_t kBig = 16384;
    std::string rank_error;
    try {
      run_ranks(2, [&](int rank) {
        Rank r(host, "libfabric", options);
        r.join(name, rank, 2);
        if (rank == 0) {
          struct Release {  // rank 1 waits for this, also when rank 0 fails
            std::atomic<bool>& flag;
            ~Release() { flag = true; }
          } release{ready};
          // Drive progress (a receive nobody sends yet) while the stranger
          // works, and a while after, so that what it sent has arrived.
          uint64_t last = 0;
          auto tail = r.irecv(1, 8, &last, 8);
          uint64_t n = 0;
          const auto until = Clock::now() + std::chrono::seconds(20);
          while (!forged.load() && Clock::now() < until) ASSERT_FALSE(r.test(tail, &n));
          const auto settle = Clock::now() + std::chrono::milliseconds(300);
          while (Clock::now() < settle) ASSERT_FALSE(r.test(tail, &n));
          ready = true;
          uint64_t a = 0, c = 0;
          std::vector<uint8_t> big(kBig, 0);
          auto ra = r.irecv(1, 7, &a, 8);
          auto rb = r.irecv(1, 7, big.data(), kBig);
          auto rc = r.irecv(1, 7, &c, 8);
          EXPECT_EQ(r.wait(ra), 8u);
          EXPECT_EQ(r.wait(rb), kBig);
          EXPECT_EQ(r.wait(rc), 8u);
          EXPECT_EQ(r.wait(tail), 8u);
          EXPECT_EQ(a, 0x1111111111111111ull);
          EXPECT_EQ(c, 0x3333333333333333ull);
          EXPECT_EQ(last, 0x4444444444444444ull);
          EXPECT_EQ(pattern_mismatch(big.data(), kBig, 1), kBig) << "the first byte of the split message that is not the real peer's";
          uint64_t reply = 0x5555;
          r.wait(r.isend(1, 9, &reply, 8));
        } else {
          wait_for_flag(ready, std::chrono::seconds(30));
          uint64_t a = 0x1111111111111111ull, c = 0x3333333333333333ull, d = 0x4444444444444444ull;
          std::vector<uint8_t> big(kBig);
          fill_pattern(big.data(), kBig, 1);
          auto sa = r.isend(0, 7, &a, 8);
          auto sb = r.isend(0, 7, big.data(), kBig);
          auto sc = r.isend(0, 7, &c, 8);
          auto sd = r.isend(0, 8, &d, 8);
          for (auto* q : {sa, sb, sc, sd}) r.wait(q);
          uint64_t reply = 0;
          EXPECT_EQ(r.wait(r.irecv(0, 9, &reply, 8)), 8u);
          EXPECT_EQ(reply, 0x5555u);
        }
      });
    } catch (const std::exception& e) {
      rank_error = e.what();
    }
    stranger.join();
    s.reset();
    EXPECT_EQ(forge_error, "");
    EXPECT_EQ(rank_error, "") << "a real rank failed";
    return capture.take();
  }
};

lf::CtrlHeader forged_header(uint64_t ctrl_seq, uint64_t kind) {
  lf::CtrlHeader h{};
  h.magic = lf::kCtrlMagic;
  h.src = 1;  // claims to be from rank 1
  h.ctrl_seq = ctrl_seq;
  h.tag = 7;
  h.kind = kind;
  std::memset(h.auth, 0xab, sizeof h.auth);  // the secret is unknown to it
  return h;
}

void expect_dropped_warning(const std::string& log) {
  EXPECT_NE(log.find("not signed with this communicator's key"), std::string::npos) << log;
  EXPECT_NE(log.find("claims to be from rank 1"), std::string::npos) << log;
}

// (a) Control messages with the right magic, a claimed source rank and the
// next sequence numbers that rank 0 expects from rank 1, but not its key:
// an eager message for the tag rank 0 is about to receive, and a split one.
TEST_P(LibfabricAuth, AForgedControlMessageIsDroppedAndLogged) {
  const std::string log = exchange_with([](Stranger& s) {
    lf::CtrlHeader h = forged_header(0, lf::kMsg);
    s.send_ctrl(h, "FORGED!!");
    h = forged_header(1, lf::kMsg);
    h.total = 16384;
    h.chunk = 4096;
    h.nchunks = 4;
    s.send_ctrl(h);
    s.send_ctrl(forged_header(2, lf::kMsg), "FORGED!!");
  });
  expect_dropped_warning(log);
}

// (b) A forged goodbye and a forged abort notice claiming to be rank 1 must
// not close rank 1 for rank 0 (a stranger could otherwise end any job).
TEST_P(LibfabricAuth, AForgedByeOrAbortDoesNotCloseThePeer) {
  for (uint64_t kind : {lf::kBye, lf::kAbort}) {
    SCOPED_TRACE(kind == lf::kBye ? "bye" : "abort");
    const std::string log = exchange_with([kind](Stranger& s) {
      s.send_ctrl(forged_header(0, kind), "forged by a stranger");
    });
    expect_dropped_warning(log);
    EXPECT_EQ(log.find("forged by a stranger"), std::string::npos) << log;
  }
}

// (c) Data under the wire tags that rank 1's split message would have in
// the unmixed layout (rank 1 above seq_bits, data sequence 0..3), sent
// before rank 0 posts its data receives: they must not land in its buffer.
TEST_P(LibfabricAuth, DataUnderAGuessedWireTagDoesNotLand) {
  exchange_with([](Stranger& s) {
    std::vector<uint8_t> junk(4096, 0xee);
    const int seq_bits = s.tag_bits() - 1 - 1;  // world 2: one rank bit
    for (uint64_t seq = 0; seq < 4; ++seq)
      s.send(lf::data_wire_tag(1, seq, s.tag_bits(), seq_bits, 0), junk.data(), junk.size());
  });
}

// (d) A control message signed with the right key but out of the wire
// format's order: a fragment (kFrag) with no fragmented message before it,
// as a peer running another version could send. The receiver fails that
// peer with DATA_LOSS naming it instead of delivering the bytes. (The
// stranger plays rank 1 with the pair key derived from the secret in the
// store, which only a member of the job can read.) The ranks exchange a
// message first, so rank 1's goodbye at the end travels on a connection that
// exists: libfabric 1.17's tcp provider leaks a connection it accepts while
// its endpoint is being closed (a goodbye sent to rank 0, which drops rank 1
// after the fragment, as rank 0 closes).
TEST_P(LibfabricAuth, AFragmentWithoutItsMessageIsDataLossNamingThePeer) {
  PluginHost host;
  const std::string name = unique_name("lf-frag");
  std::atomic<bool> done{false};
  std::atomic<bool> connected{false};
  std::string forge_error;
  StderrCapture capture;
  std::unique_ptr<Stranger> s;  // closed after the ranks (shm maps peers' memory)
  std::thread stranger([&] {
    try {
      const std::string addr = store_get(host.host_api(), name + "/lf/addr/0", 20000);
      const std::string secret = store_get(host.host_api(), name + "/lf/secret", 20000);
      lf::AuthKey key{};
      if (!lf::pair_key(secret, name, 1, 0, &key)) throw std::runtime_error("pair_key failed");
      s = std::make_unique<Stranger>(GetParam().provider, unhex(addr));
      wait_for_flag(connected, std::chrono::seconds(20));
      lf::CtrlHeader h = forged_header(1, lf::kFrag);  // after rank 1's one real message
      std::memcpy(h.auth, key.data(), sizeof h.auth);
      s->send_ctrl(h, "FRAGMENT");
    } catch (const std::exception& e) {
      forge_error = e.what();
    }
  });
  run_ranks(2, [&](int rank) {
    Rank r(host, "libfabric", GetParam().options);
    r.join(name, rank, 2);
    if (rank == 0) {
      uint64_t v = 0;
      EXPECT_EQ(r.wait(r.irecv(1, 6, &v, 8), 20000), 8u);
      EXPECT_EQ(v, 0x6666u);
      connected = true;
      try {
        r.wait(r.irecv(1, 7, &v, 8), 20000);
        ADD_FAILURE() << "a fragment without its message was delivered";
      } catch (const DataLossError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("a fragment that belongs to no message"), std::string::npos)
            << e.what();
      }
      done = true;
    } else {
      const uint64_t hello = 0x6666;
      r.wait(r.isend(0, 6, &hello, 8), 20000);
      wait_for_flag(done, std::chrono::seconds(30));
    }
  });
  stranger.join();
  s.reset();
  capture.take();
  EXPECT_EQ(forge_error, "");
}

INSTANTIATE_TEST_SUITE_P(Providers, LibfabricAuth,
                         ::testing::Values(ProviderCase{"tcp", R"({"provider": "tcp;ofi_rxm", "iface": "lo"})",
                                                        "tcp;ofi_rxm"},
                                           ProviderCase{"shm", R"({"provider": "shm"})", "shm"}),
                         [](const ::testing::TestParamInfo<ProviderCase>& i) { return i.param.label; });

}  // namespace
}  // namespace strata
