// SPDX-License-Identifier: Apache-2.0
// The "libfabric" transport: point-to-point messages between the ranks of a
// communicator over libfabric reliable-datagram endpoints (FI_EP_RDM) with
// tagged messages, so one plugin drives verbs, efa, psm3, cxi, tcp;ofi_rxm
// and shm.
//
// Options (JSON object; unknown keys are rejected, listing the known ones):
//   "provider"          an fi_info provider name ("verbs;ofi_rxm", "efa",
//                       "tcp;ofi_rxm", "shm", ...). Default: the best FI_EP_RDM
//                       provider present: a NIC provider (verbs, efa, psm2/3,
//                       opx, cxi, ...) before tcp; udp, sockets and shm are
//                       used only when named. A named provider that is absent
//                       is NOT_FOUND, listing the providers that are present.
//   "domain"            fi_info domain name (e.g. "mlx5_0"); default: the first.
//   "iface"             network interface for IP-based providers (e.g. "lo"):
//                       its IPv4 address becomes the endpoint's source address.
//                       Ignored for shm.
//   "timeout_s"         deadline for comm_create and for wait given a negative
//                       timeout (default /timeouts/collective_s, else 300).
//   "max_message_bytes" largest single libfabric message; longer messages
//                       are split (default and maximum: the provider's
//                       max_msg_size).
//
// fi_getinfo hints (what `strata-info transports` must use to list the same
// providers): version FI_VERSION(1, 10); caps FI_TAGGED, plus
// FI_RMA | FI_WRITE | FI_REMOTE_WRITE on a first try (without them when that
// finds nothing); mode FI_CONTEXT | FI_CONTEXT2; ep_attr->type FI_EP_RDM;
// domain_attr->mr_mode FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
// FI_MR_PROV_KEY | FI_MR_ENDPOINT; domain_attr->threading FI_THREAD_DOMAIN;
// fabric_attr->prov_name / domain_attr->name from the options; with "iface":
// node = the interface's IPv4 address, flags FI_SOURCE.
//
// Model. Each communicator opens its own fabric, domain, address vector,
// completion queue and endpoint. comm_create publishes fi_getname() under
// "<name>/lf/addr/<rank>" and the process identity (boot id, pid, start
// time) under "<name>/lf/proc/<rank>", reads every other rank's within the
// deadline and inserts them into the AV. A message is a small control
// message (sender rank, user tag, size, per-pair sequence number, the
// pair's key; payloads up to 8 KiB + 256 B ride along) plus, for larger payloads,
// data messages sent straight from the user's buffer with a wire tag unique
// to (sender, data sequence). The receiver matches control messages to
// receives per (peer, user tag) in posting order, in the sender's order
// whatever order the provider delivers them in, then posts the data receive
// straight into the user's buffer. User tags never touch the provider's tag
// bits, so all 64 bits are usable and two different tags never match each
// other, whatever mem_tag_format reserves. Messages larger than max_message_bytes travel as
// several data messages. Control messages that fit the provider's
// tx_attr->inject_size are injected (fi_tinject: no completion; an eager
// isend is then complete when it returns); an eager payload whose control
// message would not fit travels as up to 3 inject-size control messages
// (kMsg with the first part, then kFrag: wire.h) when inject_size allows
// that for every eager size (shm: 4 KiB), since above inject_size shm
// has the receiver read the sender's memory (process_vm_readv) and
// acknowledge it; with a smaller inject_size (tcp;ofi_rxm: 64 bytes) every
// control message goes whole, as an operation. Requests and operations are
// pooled per communicator: a warm communicator allocates nothing per
// message. A receive smaller than its message fails with
// INVALID_ARGUMENT; the message is drained.
//
// Authentication (the same guarantee as the tcp transport's handshake).
// Endpoints are connectionless: any process that learns an address (from
// the store, or by scanning shm regions or ports) can post to it. So rank 0
// draws a random 32-byte secret per communicator (OpenSSL RAND_bytes) and
// publishes it through the host store under "<name>/lf/secret"; every rank
// reads it within comm_create's deadline and derives, once, a 16-byte key
// per ordered pair, HMAC-SHA256(secret, "strata-lf-1" | name | src | dst)
// truncated (transports/libfabric/wire.h). Every control message (messages,
// clear-to-send, goodbye and abort notices) carries its pair's key; the
// receiver checks its length and fields and then the key (constant time)
// before acting on it. A message that fails is dropped, counted and logged
// as a warning (at most every 10 s, naming the rank it claimed and "not
// signed with this communicator's key"); the rank it claims to be from is
// never failed or closed by it. Data messages carry wire tags mixed with 63
// (tag_bits - 1) random bits derived from the secret, so data sent under a
// guessed tag stays unmatched in the provider instead of landing in a
// posted receive. What this protects: only holders of the store's token
// (through the secret) can join a communicator's traffic, inject or
// reorder messages, or close a peer. What it does not: content is neither
// encrypted nor MACed per message, so an on-path observer of a real network
// (or a process that can read this host's shm regions) can read payloads,
// the pair keys and the wire tags and then forge; RMA writes are checked
// only by the provider's memory keys; and a stranger can still use up the
// provider's queues (unmatched messages, a flood of forged ones), which
// slows or stalls a communicator but never delivers forged data.
//
// Memory. Every posted operation gets its own fi_context2 (FI_CONTEXT/FI_CONTEXT2
// providers). Caps report STRATA_TRANSPORT_CAP_REQUIRES_MR when the provider
// asks for FI_MR_LOCAL. Buffers without a region (beyond the 8 KiB + 256 B that ride
// in control messages) are registered through a per-communicator cache keyed
// by page-aligned address range (64 entries, least recently used evicted
// when idle), whatever the provider needs, so that the registered path runs
// everywhere; when the provider does not need it and registration fails,
// the buffer goes unregistered. mem_register always registers with
// the domain (honouring FI_MR_PROV_KEY, FI_MR_ENDPOINT, FI_MR_VIRT_ADDR), and
// descriptors are passed to every send and receive whenever a region exists.
// RMA (caps STRATA_TRANSPORT_CAP_RMA when the provider has FI_RMA):
// mem_export serialises (address, key, length) and iwrite is fi_write. The
// cache cannot see memory freed and reused at the same address; deregister
// explicit regions before freeing.
//
// Progress and threads. Caps: P2P | MEM_HOST | THREAD_SAFE (+ RMA,
// REQUIRES_MR). One mutex serialises every libfabric call of a communicator;
// test() and wait() drive progress (fi_cq_read), so FI_PROGRESS_MANUAL
// providers work; test() never sleeps; wait() polls with back-off until its
// deadline. abort() only sets a flag (never blocks); every pending and later
// request then fails with ABORTED and the reason.
//
// Failures. An error completion fails that peer's requests with UNAVAILABLE
// naming its rank and fi_av_straddr address. comm_destroy sends every peer
// a goodbye and abort an abort notice (both after the messages sent before
// them); a peer that said either is closed, as a TCP close: what it sent
// before stays receivable, requests that still need it fail with
// UNAVAILABLE naming it (and, after an abort, its reason). Providers do not
// always report a dead peer (shm never does), so while requests are pending,
// peers on this host (same boot id) are checked every 100 ms: a process
// that is gone, a zombie, or whose pid was reused fails that peer with
// UNAVAILABLE. A stalled peer (SIGSTOP) or a dead remote one that the
// provider does not report ends in DEADLINE_EXCEEDED naming the peer at
// wait's deadline. shm lets endpoints of one process use each other's
// memory, so same-process members of a communicator on shm release their
// libfabric objects together, when the last of them is destroyed.
//
// Limits. A failed or cancelled receive whose data the provider had already
// started to place is cancelled (fi_cancel) but not waited for, except by
// cancel(), which waits up to 1 s; release such buffers only after the
// communicator is destroyed, or at least drive no other request of it
// before destroying it: a communicator that still holds such an operation
// is closed without driving the provider again (no goodbyes, no drain), so
// that destroying it never touches a buffer its caller has freed since (the
// ring frees nothing itself, but its caller may, once a collective fails).
#pragma once

#include <memory>
#include <string>

#include "strata/sdk/plugin.hpp"

struct fi_info;

namespace strata::transport::libfabric {

struct Options {
  std::string provider;  // "" = best present
  std::string domain;
  std::string iface;
  double timeout_s = 300;
  uint64_t max_message_bytes = 0;  // 0 = provider's max_msg_size
};

class LfComm;

class LibfabricTransport : public sdk::TransportBase {
 public:
  using Comm = LfComm;
  static constexpr const char* kSubsystem = "transport.libfabric";
  /// Chooses the provider (fi_getinfo) now, so a bad option fails here.
  LibfabricTransport(sdk::Host host, const char* options_json);
  ~LibfabricTransport() override;
  strata_transport_caps caps() override;
  std::unique_ptr<sdk::CommBase> comm_create(const char* name, int32_t rank, int32_t world_size,
                                             int64_t timeout_ms) override;

 private:
  sdk::Host host_;
  Options opts_;
  fi_info* info_ = nullptr;  // owned (fi_freeinfo); the chosen provider
  bool rma_ = false;
  bool mr_local_ = false;
};

/// "shm": the same transport on libfabric's shared-memory provider, under a
/// name of its own so that a job config, STRATA_TRANSPORT=shm, strata-bench
/// --transport shm or --switch-transport STEP:shm can pick the same-host path
/// without options. Takes the same options; "provider", when given, must be
/// "shm".
class ShmTransport : public LibfabricTransport {
 public:
  ShmTransport(sdk::Host host, const char* options_json);
};

}  // namespace strata::transport::libfabric
