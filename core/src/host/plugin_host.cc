// SPDX-License-Identifier: Apache-2.0
// strata::PluginHost: discovery, loading, validation and instance creation.
//
// Nothing a plugin hands us is trusted before it is checked: descriptor and
// vtable sizes, kinds, names and required function pointers are validated
// before init is called, and every call into plugin code is wrapped so that
// a C++ exception escaping a plugin becomes an error instead of a crash.
#include "strata/plugin_host.hpp"

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <system_error>
#include <type_traits>

#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>

#include "host/host_state.h"
#include "log.h"
#include "store/store_protocol.h"
#include "store/store_server.h"
#include "store/tcp_store_client.h"
#include "strata/config.h"
#include "strata/config.hpp"

namespace fs = std::filesystem;

namespace strata {

// ---------------------------------------------------------------- kinds

const char* kind_name(strata_plugin_kind kind) {
  switch (kind) {
    case STRATA_KIND_STRATEGY: return "strategy";
    case STRATA_KIND_CROSS_DEVICE_OPS: return "cross_device_ops";
    case STRATA_KIND_TRANSPORT: return "transport";
    case STRATA_KIND_CLUSTER_RESOLVER: return "cluster_resolver";
    case STRATA_KIND_INPUT_PIPELINE: return "input_pipeline";
  }
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown plugin kind ", static_cast<int>(kind),
               "; valid kinds are 1 (strategy) to 5 (input_pipeline)");
}

strata_plugin_kind kind_from_name(const std::string& name) {
  if (name == "strategy") return STRATA_KIND_STRATEGY;
  if (name == "cross_device_ops") return STRATA_KIND_CROSS_DEVICE_OPS;
  if (name == "transport") return STRATA_KIND_TRANSPORT;
  if (name == "cluster_resolver" || name == "resolver") return STRATA_KIND_CLUSTER_RESOLVER;
  if (name == "input_pipeline" || name == "input") return STRATA_KIND_INPUT_PIPELINE;
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "unknown plugin kind '", name,
               "'; valid kinds are strategy, cross_device_ops, transport, cluster_resolver "
               "(resolver), input_pipeline (input)");
}

namespace {

using detail::logger;

constexpr const char* kBuiltinPath = "<builtin>";
// Majors probed besides 1, newest first, only to explain a mismatch.
constexpr int kNewestMajorProbed = 9;

// Room for any kind's vtable at the size this host was compiled with.
union AnyVtable {
  strata_strategy_vtable strategy;
  strata_cross_device_ops_vtable cdo;
  strata_transport_vtable transport;
  strata_resolver_vtable resolver;
  strata_input_vtable input;
};

struct VtableHeader {
  STRATA_STRUCT_HEADER;
};

uint32_t current_vtable_size(strata_plugin_kind kind) {
  switch (kind) {
    case STRATA_KIND_STRATEGY: return STRATA_STRATEGY_VTABLE_STRUCT_SIZE;
    case STRATA_KIND_CROSS_DEVICE_OPS: return STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE;
    case STRATA_KIND_TRANSPORT: return STRATA_TRANSPORT_VTABLE_STRUCT_SIZE;
    case STRATA_KIND_CLUSTER_RESOLVER: return STRATA_RESOLVER_VTABLE_STRUCT_SIZE;
    case STRATA_KIND_INPUT_PIPELINE: return STRATA_INPUT_VTABLE_STRUCT_SIZE;
  }
  return 0;
}

uint32_t min_vtable_size(strata_plugin_kind kind) {
  switch (kind) {
    case STRATA_KIND_STRATEGY: return STRATA_STRATEGY_VTABLE_STRUCT_SIZE_1_0;
    case STRATA_KIND_CROSS_DEVICE_OPS: return STRATA_CROSS_DEVICE_OPS_VTABLE_STRUCT_SIZE_1_0;
    case STRATA_KIND_TRANSPORT: return STRATA_TRANSPORT_VTABLE_STRUCT_SIZE_1_0;
    case STRATA_KIND_CLUSTER_RESOLVER: return STRATA_RESOLVER_VTABLE_STRUCT_SIZE_1_0;
    case STRATA_KIND_INPUT_PIPELINE: return STRATA_INPUT_VTABLE_STRUCT_SIZE_1_0;
  }
  return 0;
}

bool known_kind(uint32_t kind) {
  return kind >= STRATA_KIND_STRATEGY && kind <= STRATA_KIND_INPUT_PIPELINE;
}

// The functions each kind's header marks Required (plus destroy/close and
// mem_deregister, without which the host could not clean up).
#define STRATA_REQ(T, f) {#f, offsetof(T, f)}
struct RequiredField {
  const char* name;
  std::size_t offset;
};
std::vector<RequiredField> required_fields(strata_plugin_kind kind) {
  switch (kind) {
    case STRATA_KIND_STRATEGY: {
      using T = strata_strategy_vtable;
      return {STRATA_REQ(T, create), STRATA_REQ(T, destroy), STRATA_REQ(T, describe), STRATA_REQ(T, run),
              STRATA_REQ(T, replica_id_in_sync_group), STRATA_REQ(T, replica_all_reduce),
              STRATA_REQ(T, replica_all_gather), STRATA_REQ(T, replica_merge_call),
              STRATA_REQ(T, reduce_to), STRATA_REQ(T, gather_to), STRATA_REQ(T, variable_create),
              STRATA_REQ(T, variable_destroy), STRATA_REQ(T, variable_read), STRATA_REQ(T, variable_update)};
    }
    case STRATA_KIND_CROSS_DEVICE_OPS: {
      using T = strata_cross_device_ops_vtable;
      return {STRATA_REQ(T, create), STRATA_REQ(T, destroy), STRATA_REQ(T, all_reduce),
              STRATA_REQ(T, reduce), STRATA_REQ(T, broadcast), STRATA_REQ(T, all_gather)};
    }
    case STRATA_KIND_TRANSPORT: {
      using T = strata_transport_vtable;
      return {STRATA_REQ(T, create), STRATA_REQ(T, destroy), STRATA_REQ(T, get_caps),
              STRATA_REQ(T, comm_create), STRATA_REQ(T, comm_destroy), STRATA_REQ(T, comm_abort),
              STRATA_REQ(T, mem_register), STRATA_REQ(T, mem_deregister), STRATA_REQ(T, isend),
              STRATA_REQ(T, irecv), STRATA_REQ(T, test), STRATA_REQ(T, wait), STRATA_REQ(T, cancel)};
    }
    case STRATA_KIND_CLUSTER_RESOLVER: {
      using T = strata_resolver_vtable;
      return {STRATA_REQ(T, create), STRATA_REQ(T, destroy), STRATA_REQ(T, describe), STRATA_REQ(T, master)};
    }
    case STRATA_KIND_INPUT_PIPELINE: {
      using T = strata_input_vtable;
      return {STRATA_REQ(T, open), STRATA_REQ(T, close), STRATA_REQ(T, shard_info), STRATA_REQ(T, shard),
              STRATA_REQ(T, next)};
    }
  }
  return {};
}
#undef STRATA_REQ

bool fn_at(const void* table, std::size_t offset) {
  void* p = nullptr;
  std::memcpy(&p, static_cast<const char*>(table) + offset, sizeof(p));
  return p != nullptr;
}

// Validate a vtable and return the reason it is unusable ("" when fine).
std::pair<strata_status_t, std::string> check_vtable(strata_plugin_kind kind, const void* vtable) {
  const auto* h = static_cast<const VtableHeader*>(vtable);
  const uint32_t need = min_vtable_size(kind);
  if (h->struct_size < need)
    return {STRATA_ERR_ABI_MISMATCH,
            detail::str_cat(kind_name(kind), " vtable struct_size ", h->struct_size, " < ", need,
                            " required by ABI 1.0; rebuild the plugin against the Strata 1.x headers")};
  // Only fields both sides know are checked; Required ones are all within 1.0.
  for (const auto& f : required_fields(kind))
    if (!fn_at(vtable, f.offset))
      return {STRATA_ERR_INVALID_ARGUMENT,
              detail::str_cat("required function '", f.name, "' of the ", kind_name(kind),
                              " vtable is NULL; implement it (see strata/c/*.h)")};
  if (kind == STRATA_KIND_CROSS_DEVICE_OPS) {
    const auto* v = static_cast<const strata_cross_device_ops_vtable*>(vtable);
    if ((v->all_reduce_start == nullptr) != (v->request_wait == nullptr))
      return {STRATA_ERR_INVALID_ARGUMENT,
              "cross_device_ops all_reduce_start and request_wait must be both set or both NULL"};
  }
  return {STRATA_OK, ""};
}

bool valid_component_name(const char* name) {
  if (!name || !*name) return false;
  for (const char* p = name; *p; ++p)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return false;
  return true;
}

// libstrata-<kind>-<name>.so -> (kind, name), when the kind part is known.
std::optional<std::pair<strata_plugin_kind, std::string>> parse_file_name(const std::string& file) {
  static const std::regex re("^libstrata-([a-z_]+)-(.+)\\.so$");
  std::smatch m;
  if (!std::regex_match(file, m, re)) return std::nullopt;
  try {
    return std::make_pair(kind_from_name(m[1].str()), m[2].str());
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string exception_text(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception type";
  }
}

std::string threw_message(const std::string& path, const char* call, std::exception_ptr e) {
  return detail::str_cat("plugin ", path, " threw a C++ exception across the C ABI from ", call, " (",
                         exception_text(e),
                         "); plugins must return a status (the SDK adapter does this)");
}

// Directory holding libstrata_core.so, found through one of our own symbols.
std::string core_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kind_name), &info) == 0 || !info.dli_fname) return "";
  std::error_code ec;
  fs::path p = fs::canonical(fs::path(info.dli_fname), ec);
  if (ec) p = fs::path(info.dli_fname);
  return p.parent_path().string();
}

// dlopen maps a truncated ELF file and then faults (SIGBUS) touching the
// pages past its end, so check that every segment and table the headers
// promise is really in the file before handing it to the loader. Returns
// the problem, or "" when the file is fine or not ELF at all (dlopen then
// reports it).
std::string check_elf_extents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot be opened for reading; check its permissions";
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr eh{};
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof(eh))) return "";
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return "";
  auto beyond = [&](uint64_t off, uint64_t len) { return off > size || len > size - off; };
  const uint64_t ph_bytes = static_cast<uint64_t>(eh.e_phnum) * eh.e_phentsize;
  const uint64_t sh_bytes = static_cast<uint64_t>(eh.e_shnum) * eh.e_shentsize;
  auto truncated = [&](const std::string& what, uint64_t end) {
    return detail::str_cat("is truncated or corrupt: its ", what, " ends at byte ", end, " but the file has ", size,
                           " bytes; reinstall or rebuild the plugin");
  };
  if (beyond(eh.e_phoff, ph_bytes)) return truncated("program header table", eh.e_phoff + ph_bytes);
  if (eh.e_shoff && beyond(eh.e_shoff, sh_bytes)) return truncated("section header table", eh.e_shoff + sh_bytes);
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) return "";
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    in.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<uint64_t>(i) * sizeof(ph)));
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof(ph))) return truncated("program header table", size + 1);
    if (ph.p_type == PT_LOAD && beyond(ph.p_offset, ph.p_filesz))
      return truncated(detail::str_cat("loadable segment ", i), ph.p_offset + ph.p_filesz);
  }
  return "";
}

// Whether the file starts with the ELF magic. dlopen's own answer for a
// text file ("invalid ELF header") reaches us wrapped by Boost.DLL with an
// unrelated errno, so the common case of a stray file gets a plain answer.
// An unreadable file counts as ELF here so that check_elf_extents reports
// the permission problem instead.
bool has_elf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return true;
  char magic[SELFMAG] = {};
  if (!in.read(magic, SELFMAG)) return false;
  return std::memcmp(magic, ELFMAG, SELFMAG) == 0;
}

// Boost.DLL appends the text of an errno that dlopen never set (typically
// ": Bad file descriptor") after dlerror's message; it only misleads.
std::string without_errno_suffix(std::string what) {
  const std::string noise = ": " + std::generic_category().message(EBADF);
  if (what.size() > noise.size() && what.compare(what.size() - noise.size(), noise.size(), noise) == 0)
    what.resize(what.size() - noise.size());
  return what;
}

std::vector<std::string> split_path_list(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ':'))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- records

namespace detail {

struct Component {
  strata_plugin_kind kind{};
  std::string name;
  std::string version;
  const void* source = nullptr;  // the table as the plugin (or builtin) defined it
  AnyVtable vtable;  // normalized copy: fields beyond the plugin's struct_size are NULL
};

// Fill comp.vtable from `source`: today's full layout, zero (NULL) beyond the
// plugin's own struct_size, so callers test pointers and never sizes.
void normalize_vtable(Component& comp, strata_plugin_kind kind, const void* source) {
  comp.source = source;
  std::memset(&comp.vtable, 0, sizeof(comp.vtable));
  const uint32_t have = static_cast<const VtableHeader*>(source)->struct_size;
  const uint32_t cur = current_vtable_size(kind);
  std::memcpy(&comp.vtable, source, std::min(have, cur));
  // struct_size is the first field of every vtable; memcpy keeps this free of type punning.
  std::memcpy(&comp.vtable, &cur, sizeof cur);
}

// One loaded library (or one builtin). Kept alive by the host and by every
// instance made from it; unloads (after shutdown) when the last one drops it.
struct Library {
  std::string path;
  std::string abi;
  std::string library_name;
  std::string library_version;
  std::optional<boost::dll::shared_library> lib;
  const strata_plugin_desc* desc = nullptr;
  bool initialized = false;
  std::shared_ptr<HostShared> shared;  // the table the plugin was given outlives it
  std::vector<std::unique_ptr<Component>> components;

  Library() = default;
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (initialized && desc && desc->shutdown) {
      try {
        desc->shutdown();
      } catch (...) {
        // Nothing to report to at this point; the library is going away anyway.
      }
    }
  }
};

}  // namespace detail

using detail::Component;
using detail::Library;

// ---------------------------------------------------------------- instance

PluginInstance::PluginInstance(strata_plugin_kind kind, const void* vtable, void* handle,
                               std::string name, std::shared_ptr<void> keep_alive)
    : kind_(kind), vtable_(vtable), handle_(handle), name_(std::move(name)), keep_alive_(std::move(keep_alive)) {}

PluginInstance::PluginInstance(PluginInstance&& o) noexcept
    : kind_(o.kind_), vtable_(o.vtable_), handle_(o.handle_), name_(std::move(o.name_)),
      keep_alive_(std::move(o.keep_alive_)) {
  o.handle_ = nullptr;
  o.vtable_ = nullptr;
}

PluginInstance& PluginInstance::operator=(PluginInstance&& o) noexcept {
  if (this != &o) {
    reset();
    kind_ = o.kind_;
    vtable_ = o.vtable_;
    handle_ = o.handle_;
    name_ = std::move(o.name_);
    keep_alive_ = std::move(o.keep_alive_);
    o.handle_ = nullptr;
    o.vtable_ = nullptr;
  }
  return *this;
}

PluginInstance::~PluginInstance() { reset(); }

void* PluginInstance::release() {
  void* h = handle_;
  handle_ = nullptr;
  return h;
}

void PluginInstance::reset() {
  if (handle_ && vtable_) {
    try {
      switch (kind_) {
        case STRATA_KIND_STRATEGY:
          vtable_as<strata_strategy_vtable>()->destroy(static_cast<strata_strategy_t>(handle_));
          break;
        case STRATA_KIND_CROSS_DEVICE_OPS:
          vtable_as<strata_cross_device_ops_vtable>()->destroy(static_cast<strata_cross_device_ops_t>(handle_));
          break;
        case STRATA_KIND_TRANSPORT:
          vtable_as<strata_transport_vtable>()->destroy(static_cast<strata_transport_t>(handle_));
          break;
        case STRATA_KIND_CLUSTER_RESOLVER:
          vtable_as<strata_resolver_vtable>()->destroy(static_cast<strata_resolver_t>(handle_));
          break;
        case STRATA_KIND_INPUT_PIPELINE:
          vtable_as<strata_input_vtable>()->close(static_cast<strata_input_t>(handle_));
          break;
      }
    } catch (...) {
      try {
        logger("host")->error("{} '{}': destroy threw a C++ exception across the C ABI ({}); "
                              "plugins must not throw",
                              kind_name(kind_), name_, exception_text(std::current_exception()));
      } catch (...) {
      }
    }
  }
  handle_ = nullptr;
  vtable_ = nullptr;
  keep_alive_.reset();
}

// ---------------------------------------------------------------- host

struct PluginHost::Impl {
  struct Entry {
    std::shared_ptr<Library> lib;
    const Component* comp = nullptr;
    bool explicit_ = false;
  };
  struct Rejection {
    strata_status_t code = STRATA_ERR_INTERNAL;
    std::string reason;
    std::vector<PluginInfo> infos;
  };

  std::shared_ptr<detail::HostShared> shared = std::make_shared<detail::HostShared>();
  mutable std::recursive_mutex mu;
  std::vector<std::string> order;  // canonical paths in load order (builtins too)
  std::map<std::string, std::shared_ptr<Library>> libraries;
  std::map<std::string, Rejection> rejected;
  std::map<std::pair<int, std::string>, Entry> registry;
  std::map<std::pair<int, std::string>, std::string> rejected_names;  // -> path
  std::vector<std::string> config_search_path;
  std::vector<std::string> explicit_paths;
  bool discovered = false;
  int builtin_count = 0;
  // The rendezvous store (connect_store); guarded by store_mu.
  mutable std::mutex store_mu;
  std::unique_ptr<store::StoreServer> store_server;
  std::string store_address;

  std::vector<std::string> dirs() const {
    std::vector<std::string> out = split_path_list(std::getenv("STRATA_PLUGIN_PATH"));
    out.insert(out.end(), config_search_path.begin(), config_search_path.end());
    const std::string core = core_library_dir();
    if (!core.empty()) out.push_back((fs::path(core) / STRATA_PLUGIN_SUBDIR).string());
    return out;
  }

  // Load and validate `path`. Throws Error(code, reason) without the path;
  // callers add it. Returns the library (already registered).
  std::shared_ptr<Library> load(const std::string& path, bool explicit_load);
  void reject(const std::string& path, strata_status_t code, const std::string& reason,
              std::vector<PluginInfo> infos, bool explicit_load);
  void scan();
  std::vector<PluginInfo> infos() const;
  std::string load_or_throw(const std::string& path);
  PluginInstance create(strata_plugin_kind kind, const std::string& name, const std::string& options_json,
                        const strata_input_context* ctx);
};

namespace {
std::string abi_string(uint32_t minor) { return detail::str_cat(STRATA_ABI_MAJOR, ".", minor); }
}  // namespace

std::shared_ptr<Library> PluginHost::Impl::load(const std::string& path, bool explicit_load) {
  auto lib = std::make_shared<Library>();
  lib->path = path;
  lib->shared = shared;
  auto fail = [](strata_status_t code, const std::string& reason) { detail::throw_status(code, reason); };

  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail(STRATA_ERR_NOT_FOUND, "not a regular file");
  if (!has_elf_magic(path))
    fail(STRATA_ERR_FAILED_PRECONDITION,
         "cannot be loaded: it is not a shared library (ELF header missing); remove it from the plugin "
         "directory or rebuild it");
  if (std::string bad = check_elf_extents(path); !bad.empty()) fail(STRATA_ERR_DATA_LOSS, bad);
  try {
    lib->lib.emplace(boost::dll::fs::path(path),
                     boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    fail(STRATA_ERR_FAILED_PRECONDITION,
         detail::str_cat("cannot be loaded: ", without_errno_suffix(e.what()),
                         "; check that it is a shared library for this platform and that its "
                         "dependencies are installed (ldd)"));
  }

  boost::dll::shared_library& so = *lib->lib;
  if (!so.has(STRATA_PLUGIN_ENTRY_V1_SYMBOL)) {
    for (int major = kNewestMajorProbed; major >= 2; --major) {
      const std::string sym = detail::str_cat("strata_plugin_entry_v", major);
      if (so.has(sym))
        fail(STRATA_ERR_ABI_MISMATCH,
             detail::str_cat("built for ABI major ", major, " (exports ", sym, "); this host supports major ",
                             STRATA_ABI_MAJOR, ": rebuild the plugin against Strata 1.x SDK"));
    }
    fail(STRATA_ERR_NOT_FOUND,
         "does not export strata_plugin_entry_v1: not a Strata plugin, or built without "
         "STRATA_EXPORT (use strata_add_plugin() from the SDK)");
  }
  auto& entry = so.get<std::remove_pointer_t<strata_plugin_entry_v1_fn>>(STRATA_PLUGIN_ENTRY_V1_SYMBOL);

  const strata_plugin_desc* desc = nullptr;
  strata_status_t st = STRATA_OK;
  try {
    st = entry(&shared->table.api, STRATA_ABI_MINOR, &desc);
  } catch (...) {
    fail(STRATA_ERR_INTERNAL, threw_message(path, "strata_plugin_entry_v1", std::current_exception()));
  }
  if (st != STRATA_OK)
    fail(st == STRATA_ERR_ABI_MISMATCH ? st : STRATA_ERR_FAILED_PRECONDITION,
         detail::str_cat("strata_plugin_entry_v1 failed with ", strata_status_string(st),
                         " (host ABI ", abi_string(STRATA_ABI_MINOR), ")"));
  if (!desc) fail(STRATA_ERR_INVALID_ARGUMENT, "strata_plugin_entry_v1 returned OK but no descriptor");
  if (desc->struct_size < STRATA_PLUGIN_DESC_STRUCT_SIZE_1_0)
    fail(STRATA_ERR_ABI_MISMATCH,
         detail::str_cat("plugin descriptor struct_size ", desc->struct_size, " < ", STRATA_PLUGIN_DESC_STRUCT_SIZE_1_0,
                         " required by ABI 1.0; rebuild the plugin against the Strata 1.x headers"));
  lib->desc = desc;
  lib->abi = abi_string(desc->abi_minor);
  lib->library_name = desc->library_name ? desc->library_name : "";
  lib->library_version = desc->library_version ? desc->library_version : "";
  if (desc->num_components == 0 || !desc->components)
    fail(STRATA_ERR_INVALID_ARGUMENT, "the descriptor lists no components");

  // A newer plugin's component structs may be bigger: step by its own size.
  const uint32_t stride = desc->components[0].struct_size;
  if (stride < STRATA_PLUGIN_COMPONENT_STRUCT_SIZE_1_0)
    fail(STRATA_ERR_ABI_MISMATCH,
         detail::str_cat("component struct_size ", stride, " < ", STRATA_PLUGIN_COMPONENT_STRUCT_SIZE_1_0,
                         " required by ABI 1.0; rebuild the plugin against the Strata 1.x headers"));
  std::vector<PluginInfo> infos;
  std::string problem;
  strata_status_t problem_code = STRATA_OK;
  for (uint32_t i = 0; i < desc->num_components; ++i) {
    const auto* c = reinterpret_cast<const strata_plugin_component*>(
        reinterpret_cast<const char*>(desc->components) + static_cast<std::size_t>(i) * stride);
    const std::string where = detail::str_cat("component ", i);
    if (c->struct_size != stride)
      fail(STRATA_ERR_INVALID_ARGUMENT, detail::str_cat(where, ": struct_size ", c->struct_size,
                                                        " differs from component 0's ", stride));
    if (!known_kind(c->kind))
      fail(STRATA_ERR_INVALID_ARGUMENT, detail::str_cat(where, ": unknown kind ", c->kind,
                                                        " (this host knows kinds 1..5)"));
    const auto kind = static_cast<strata_plugin_kind>(c->kind);
    if (!valid_component_name(c->name))
      fail(STRATA_ERR_INVALID_ARGUMENT,
           detail::str_cat(where, ": name '", c->name ? c->name : "(null)",
                           "' is invalid; names are non-empty [a-z0-9_]+"));
    PluginInfo info;
    info.path = path;
    info.kind = kind_name(kind);
    info.name = c->name;
    info.version = c->version ? c->version : "";
    info.abi = lib->abi;
    infos.push_back(info);
    rejected_names[{kind, c->name}] = path;
    if (!c->version)
      fail(STRATA_ERR_INVALID_ARGUMENT, detail::str_cat(kind_name(kind), " '", c->name, "': version is NULL"));
    if (!c->vtable)
      fail(STRATA_ERR_INVALID_ARGUMENT, detail::str_cat(kind_name(kind), " '", c->name, "': vtable is NULL"));
    auto [code, why] = check_vtable(kind, c->vtable);
    if (code != STRATA_OK && problem.empty()) {
      problem = detail::str_cat(kind_name(kind), " '", c->name, "': ", why);
      problem_code = code;
    }
    auto comp = std::make_unique<Component>();
    comp->kind = kind;
    comp->name = c->name;
    comp->version = info.version;
    normalize_vtable(*comp, kind, c->vtable);
    for (const auto& other : lib->components)
      if (other->kind == kind && other->name == comp->name)
        fail(STRATA_ERR_INVALID_ARGUMENT,
             detail::str_cat(kind_name(kind), " '", c->name, "' is listed twice in the descriptor"));
    lib->components.push_back(std::move(comp));
  }
  auto fail_with_infos = [&](strata_status_t code, const std::string& reason) {
    // Let the caller record per-component rows for this rejection.
    for (auto& inf : infos) inf.error = reason;
    reject(path, code, reason, infos, explicit_load);
    detail::throw_status(code, reason);
  };
  if (!problem.empty()) fail_with_infos(problem_code, problem);

  // Duplicates: the first library found keeps the name; explicit loads win.
  for (const auto& comp : lib->components) {
    auto it = registry.find({comp->kind, comp->name});
    if (it != registry.end() && !explicit_load)
      fail_with_infos(STRATA_ERR_ALREADY_EXISTS,
                      detail::str_cat("duplicate ", kind_name(comp->kind), " '", comp->name,
                                      "': already provided by ", it->second.lib->path,
                                      "; remove one of them or set STRATA_PLUGIN_PATH"));
  }

  if (desc->init) {
    strata_error err;
    strata_error_init(&err);
    strata_status_t ist = STRATA_OK;
    try {
      ist = desc->init(&shared->table.api, &err);
    } catch (...) {
      fail_with_infos(STRATA_ERR_INTERNAL, threw_message(path, "init", std::current_exception()));
    }
    if (ist != STRATA_OK) {
      err.message[sizeof(err.message) - 1] = '\0';
      fail_with_infos(ist, detail::str_cat("init failed with ", strata_status_string(ist), ": ",
                                           err.message[0] ? err.message : "(no message)"));
    }
  }
  lib->initialized = true;

  std::string provided;
  for (const auto& comp : lib->components) {
    auto key = std::make_pair(static_cast<int>(comp->kind), comp->name);
    auto it = registry.find(key);
    if (it != registry.end())
      logger("host")->info("{} '{}' from {} (explicit) takes precedence over {}", kind_name(comp->kind),
                           comp->name, path, it->second.lib->path);
    registry[key] = Entry{lib, comp.get(), explicit_load};
    provided += detail::str_cat(provided.empty() ? "" : ", ", kind_name(comp->kind), " '", comp->name, "' ",
                                comp->version);
  }
  libraries[path] = lib;
  order.push_back(path);
  logger("host")->info("loaded {} ({} {}, ABI {}): {}", path, lib->library_name, lib->library_version,
                       lib->abi, provided);
  return lib;
}

void PluginHost::Impl::reject(const std::string& path, strata_status_t code, const std::string& reason,
                              std::vector<PluginInfo> infos, bool explicit_load) {
  if (rejected.count(path)) return;
  if (infos.empty()) {
    PluginInfo info;
    info.path = path;
    info.error = reason;
    infos.push_back(info);
  }
  if (auto parsed = parse_file_name(fs::path(path).filename().string()))
    rejected_names.emplace(std::make_pair(static_cast<int>(parsed->first), parsed->second), path);
  rejected[path] = Rejection{code, reason, std::move(infos)};
  order.push_back(path);
  if (!explicit_load) logger("host")->warn("skipping {}: {}", path, reason);
}

void PluginHost::Impl::scan() {
  for (const auto& dir : dirs()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      logger("host")->debug("plugin directory {} does not exist; skipped", dir);
      continue;
    }
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string file = it->path().filename().string();
      if (file.rfind("libstrata-", 0) == 0 && file.size() > 3 && file.compare(file.size() - 3, 3, ".so") == 0)
        files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::error_code cec;
      if (!fs::is_regular_file(f, cec)) continue;
      fs::path canon = fs::canonical(f, cec);
      const std::string path = cec ? f.string() : canon.string();
      if (libraries.count(path) || rejected.count(path)) continue;
      try {
        load(path, /*explicit_load=*/false);
      } catch (const Error& e) {
        reject(path, e.code(), e.what(), {}, false);
      }
    }
  }
  discovered = true;
}

std::vector<PluginInfo> PluginHost::Impl::infos() const {
  std::vector<PluginInfo> out;
  for (const auto& path : order) {
    if (auto it = libraries.find(path); it != libraries.end()) {
      for (const auto& comp : it->second->components) {
        PluginInfo info;
        info.path = it->second->path;
        info.kind = kind_name(comp->kind);
        info.name = comp->name;
        info.version = comp->version;
        info.abi = it->second->abi;
        info.ok = true;
        out.push_back(info);
      }
    } else if (auto rj = rejected.find(path); rj != rejected.end()) {
      out.insert(out.end(), rj->second.infos.begin(), rj->second.infos.end());
    }
  }
  return out;
}

// Load `path` explicitly; on failure throw an Error carrying the path.
std::string PluginHost::Impl::load_or_throw(const std::string& raw) {
  std::error_code ec;
  if (!fs::exists(raw, ec))
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "plugin library ", raw,
                 " does not exist; fix the \"path\" in the config or remove it to use discovery");
  fs::path canon = fs::canonical(raw, ec);
  const std::string path = ec ? raw : canon.string();
  if (auto it = libraries.find(path); it != libraries.end()) {
    // Found earlier by discovery: make it win over same-named components.
    for (const auto& comp : it->second->components)
      registry[{comp->kind, comp->name}] = Entry{it->second, comp.get(), true};
    return path;
  }
  if (auto rj = rejected.find(path); rj != rejected.end())
    detail::throw_status(rj->second.code, detail::str_cat("cannot use plugin library ", path, ": ",
                                                          rj->second.reason));
  try {
    load(path, /*explicit_load=*/true);
  } catch (const Error& e) {
    reject(path, e.code(), e.what(), {}, true);
    detail::throw_status(e.code(), detail::str_cat("cannot use plugin library ", path, ": ", e.what()));
  }
  return path;
}

PluginHost& PluginHost::global() {
  // A static object (not a leaked pointer) so that LeakSanitizer sees it
  // freed; libraries with live instances stay loaded past its destruction
  // because every instance holds its library record.
  static PluginHost host;
  return host;
}

PluginHost::PluginHost() : impl_(std::make_unique<Impl>()) {
  std::lock_guard<std::mutex> lock(impl_->shared->host_mu);
  impl_->shared->host = this;
}

PluginHost::~PluginHost() {
  std::lock_guard<std::mutex> lock(impl_->shared->host_mu);
  impl_->shared->host = nullptr;
}

void PluginHost::set_config(const std::string& config_json) {
  Config cfg = Config::from_json(config_json, "plugin host config");
  auto doc = nlohmann::json::parse(cfg.json());
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  {
    std::lock_guard<std::mutex> clock(impl_->shared->config_mu);
    impl_->shared->config = doc;
  }
  impl_->config_search_path = cfg.search_path();
  impl_->explicit_paths.clear();
  for (const auto& part : Config::known_parts()) {
    const std::string p = cfg.path(part);
    if (!p.empty()) impl_->explicit_paths.push_back(p);
  }
  for (const auto& p : impl_->explicit_paths) impl_->load_or_throw(p);
}

std::vector<PluginInfo> PluginHost::discover() {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  impl_->scan();
  return impl_->infos();
}

void PluginHost::load_explicit(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  impl_->load_or_throw(path);
}

namespace {

// Call the kind's create/open; returns the handle or throws.
void* create_handle(const Component& comp, const std::string& path, const strata_host_api* api,
                    const std::string& options, const strata_input_context* ctx) {
  strata_error err;
  strata_error_init(&err);
  void* handle = nullptr;
  strata_status_t st = STRATA_OK;
  const char* opts = options.c_str();
  try {
    switch (comp.kind) {
      case STRATA_KIND_STRATEGY:
        st = comp.vtable.strategy.create(api, opts, reinterpret_cast<strata_strategy_t*>(&handle), &err);
        break;
      case STRATA_KIND_CROSS_DEVICE_OPS:
        st = comp.vtable.cdo.create(api, opts, reinterpret_cast<strata_cross_device_ops_t*>(&handle), &err);
        break;
      case STRATA_KIND_TRANSPORT:
        st = comp.vtable.transport.create(api, opts, reinterpret_cast<strata_transport_t*>(&handle), &err);
        break;
      case STRATA_KIND_CLUSTER_RESOLVER:
        st = comp.vtable.resolver.create(api, opts, reinterpret_cast<strata_resolver_t*>(&handle), &err);
        break;
      case STRATA_KIND_INPUT_PIPELINE:
        st = comp.vtable.input.open(api, opts, ctx, reinterpret_cast<strata_input_t*>(&handle), &err);
        break;
    }
  } catch (...) {
    STRATA_THROW(STRATA_ERR_INTERNAL, threw_message(path, "create", std::current_exception()));
  }
  if (st != STRATA_OK) {
    err.message[sizeof(err.message) - 1] = '\0';
    detail::throw_status(st, detail::str_cat(kind_name(comp.kind), " '", comp.name, "' (", path,
                                             "): ", err.message[0] ? err.message : strata_status_string(st)));
  }
  if (!handle)
    STRATA_THROW(STRATA_ERR_INTERNAL, kind_name(comp.kind), " '", comp.name, "' (", path,
                 ") returned OK from create but no instance; this is a plugin bug");
  return handle;
}

}  // namespace

PluginInstance PluginHost::create(strata_plugin_kind kind, const std::string& name,
                                  const std::string& options_json) {
  strata_input_context ctx{};
  STRATA_INIT_HEADER(&ctx, strata_input_context);
  ctx.num_input_pipelines = 1;
  ctx.input_pipeline_id = 0;
  ctx.num_replicas_in_sync = 1;
  return impl_->create(kind, name, options_json, &ctx);
}

PluginInstance PluginHost::create_input_pipeline(const std::string& name, const std::string& options_json,
                                                 const strata_input_context& ctx) {
  return impl_->create(STRATA_KIND_INPUT_PIPELINE, name, options_json, &ctx);
}

PluginInstance PluginHost::Impl::create(strata_plugin_kind kind, const std::string& name,
                                        const std::string& options_json, const strata_input_context* ctx) {
  Impl& impl = *this;
  const strata_host_api* api = &shared->table.api;
  const char* kname = kind_name(kind);  // validates kind
  Entry entry;
  {
    std::lock_guard<std::recursive_mutex> lock(impl.mu);
    const auto key = std::make_pair(static_cast<int>(kind), name);
    auto it = impl.registry.find(key);
    if (it == impl.registry.end()) {
      // A miss rescans, so plugins installed since the last scan are found.
      impl.scan();
      it = impl.registry.find(key);
    }
    if (it == impl.registry.end()) {
      if (auto rn = impl.rejected_names.find(key); rn != impl.rejected_names.end()) {
        auto rj = impl.rejected.find(rn->second);
        if (rj != impl.rejected.end())
          detail::throw_status(rj->second.code,
                               detail::str_cat(kname, " '", name, "' is unavailable: its library ", rn->second,
                                               " was rejected: ", rj->second.reason));
      }
      std::string names;
      for (const auto& [k, e] : impl.registry)
        if (k.first == kind) names += (names.empty() ? "" : ", ") + k.second;
      std::string dirs;
      for (const auto& d : impl.dirs()) dirs += (dirs.empty() ? "" : ", ") + d;
      STRATA_THROW(STRATA_ERR_NOT_FOUND, "no ", kname, " plugin named '", name, "'; available: ",
                   names.empty() ? "(none)" : names, "; searched: ", dirs.empty() ? "(no directories)" : dirs,
                   ". Install libstrata-", kname, "-", name,
                   ".so into one of them, add its directory to STRATA_PLUGIN_PATH, or name its file "
                   "with \"path\" in the config");
    }
    entry = it->second;
  }
  // Not under the lock: create may call back into the host (create_plugin).
  void* handle = create_handle(*entry.comp, entry.lib->path, api, options_json.empty() ? "{}" : options_json, ctx);
  return PluginInstance(kind, &entry.comp->vtable, handle, name, std::shared_ptr<void>(entry.lib));
}

bool PluginHost::detect(strata_plugin_kind kind, const std::string& name) {
  const char* kname = kind_name(kind);  // validates kind
  if (kind != STRATA_KIND_CLUSTER_RESOLVER)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "detect() exists only for cluster resolvers, not for ", kname,
                 " '", name, "'");
  Impl::Entry entry;
  {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    const auto key = std::make_pair(static_cast<int>(kind), name);
    auto it = impl_->registry.find(key);
    if (it == impl_->registry.end()) {
      impl_->scan();
      it = impl_->registry.find(key);
    }
    if (it == impl_->registry.end()) return false;
    entry = it->second;
  }
  // normalize_vtable left detect NULL when the plugin's table predates it.
  const strata_resolver_vtable& vt = entry.comp->vtable.resolver;
  if (vt.detect == nullptr) return false;
  return vt.detect(&impl_->shared->table.api) != 0;
}

const std::vector<std::string>& cluster_resolver_detect_order() {
  static const std::vector<std::string> order = {"slurm", "tf_config", "tpu"};
  return order;
}

ResolverChoice choose_cluster_resolver(PluginHost& host, const std::string& configured) {
  ResolverChoice c;
  if (!configured.empty()) {
    c.name = configured;
    c.reason = "named by the job config's cluster_resolver (or STRATA_CLUSTER_RESOLVER)";
    return c;
  }
  auto env_set = [](const char* v) {
    const char* e = std::getenv(v);
    return e != nullptr && e[0] != '\0';
  };
  for (const std::string& name : cluster_resolver_detect_order()) {
    // TF_CONFIG is read by core itself, so a missing tf_config plugin is a
    // clear NOT_FOUND at create time rather than a silent single process.
    const bool installed = name == "tf_config" || host.has_component(STRATA_KIND_CLUSTER_RESOLVER, name);
    bool yes = false;
    if (name == "tf_config") yes = env_set("TF_CONFIG");
    else if (installed) yes = host.detect(STRATA_KIND_CLUSTER_RESOLVER, name);
    std::string why;
    if (name == "slurm") {
      why = yes ? "SLURM_PROCID and SLURM_STEP_NODELIST are set (a task of a job step)"
                : env_set("SLURM_PROCID")
                    ? "SLURM_PROCID is set but SLURM_STEP_NODELIST is not: a batch script, not a job step; "
                      "start the program with srun for a distributed job"
                    : "SLURM_PROCID is not set";
      if (!yes && env_set("SLURM_PROCID") && installed)
        logger("cluster")->warn("slurm: {}", why);
    }
    else if (name == "tf_config") why = yes ? "TF_CONFIG is set" : "TF_CONFIG is not set";
    else if (name == "tpu")
      why = yes ? "a TPU variable (KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME or TPU_CONFIG) is set"
                : "none of KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, TPU_NAME, TPU_CONFIG is set";
    else why = yes ? "its detect() said yes" : "its detect() said no";
    if (!installed) why = "not installed (no libstrata-resolver-" + name + ".so found), skipped";
    c.probes.emplace_back(name, why);
    if (yes && c.name.empty()) {
      c.name = name;
      c.reason = "auto-detected: " + why;
    }
  }
  if (c.name.empty()) c.reason = "no cluster environment detected: a single process";
  return c;
}

bool PluginHost::has_component(strata_plugin_kind kind, const std::string& name) {
  kind_name(kind);  // validates kind
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  const auto key = std::make_pair(static_cast<int>(kind), name);
  if (impl_->registry.count(key) != 0) return true;
  impl_->scan();
  return impl_->registry.count(key) != 0;
}

void PluginHost::register_builtin(strata_plugin_kind kind, const std::string& name, const std::string& version,
                                  const void* vtable) {
  kind_name(kind);
  if (!valid_component_name(name.c_str()))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "builtin name '", name, "' is invalid; names are non-empty [a-z0-9_]+");
  if (!vtable) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "builtin ", kind_name(kind), " '", name, "': vtable is NULL");
  auto [code, why] = check_vtable(kind, vtable);
  if (code != STRATA_OK) detail::throw_status(code, detail::str_cat("builtin ", kind_name(kind), " '", name, "': ", why));

  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  const auto key = std::make_pair(static_cast<int>(kind), name);
  if (auto it = impl_->registry.find(key); it != impl_->registry.end()) {
    if (it->second.lib->path == kBuiltinPath) {
      // Same builtin registered again (e.g. two first calls racing): fine.
      if (it->second.comp->source == vtable) return;
      STRATA_THROW(STRATA_ERR_ALREADY_EXISTS, "builtin ", kind_name(kind), " '", name,
                   "' is already registered with a different vtable");
    }
    logger("host")->warn("builtin {} '{}' shadows the plugin from {}", kind_name(kind), name, it->second.lib->path);
  }
  auto lib = std::make_shared<Library>();
  // Unique key per builtin in `order`/`libraries`; shown as "<builtin>".
  lib->path = kBuiltinPath;
  lib->abi = abi_string(static_cast<const VtableHeader*>(vtable)->abi_minor);
  lib->shared = impl_->shared;
  lib->library_name = "strata_core";
  lib->library_version = STRATA_VERSION;
  auto comp = std::make_unique<Component>();
  comp->kind = kind;
  comp->name = name;
  comp->version = version;
  normalize_vtable(*comp, kind, vtable);
  lib->components.push_back(std::move(comp));
  lib->initialized = true;
  const std::string order_key = detail::str_cat(kBuiltinPath, "#", impl_->builtin_count++);
  impl_->registry[key] = Impl::Entry{lib, lib->components.back().get(), true};
  impl_->libraries[order_key] = lib;
  impl_->order.push_back(order_key);
}

const strata_host_api* PluginHost::host_api() { return &impl_->shared->table.api; }

std::vector<std::string> PluginHost::search_dirs() const {
  std::lock_guard<std::recursive_mutex> lock(impl_->mu);
  return impl_->dirs();
}

std::string PluginHost::last_collectives_json() const {
  nlohmann::json out = nlohmann::json::object();
  std::lock_guard<std::mutex> lock(impl_->shared->fingerprint_mu);
  for (const auto& [comm, fp] : impl_->shared->last_fingerprint) {
    out[comm] = {{"op", fp.op},
                 {"reduce_op", fp.reduce_op},
                 {"sequence", fp.sequence},
                 {"dtype", {{"code", fp.dtype.code}, {"bits", fp.dtype.bits}, {"lanes", fp.dtype.lanes}}},
                 {"count", fp.count},
                 {"rank", fp.rank},
                 {"peer", fp.peer}};
  }
  return out.dump();
}

bool PluginHost::abort_requested() const { return impl_->shared->abort.load(); }

void PluginHost::connect_store(const StoreConfig& cfg) {
  std::lock_guard<std::mutex> lock(impl_->store_mu);
  if (!impl_->store_address.empty())
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "connect_store: this process is already connected "
                 "to the rendezvous store at ", impl_->store_address, "; call connect_store once per process");
  std::string host;
  uint16_t port = 0;
  if (!store::split_host_port(cfg.address, &host, &port) || (port == 0 && !cfg.serve))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "connect_store: address '", cfg.address,
                 "' is not host:port", cfg.serve ? "" : " with a non-zero port",
                 "; use the chief's address from the cluster spec, e.g. \"10.0.0.1:29400\"");
  if (!(cfg.timeout_s > 0))
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "connect_store: timeout_s must be > 0, got ", cfg.timeout_s);
  std::string token = cfg.auth_token;
  if (token.empty()) {
    if (const char* env = std::getenv("STRATA_AUTH_TOKEN")) token = env;
  }
  if (token.empty()) {
    std::lock_guard<std::mutex> clock(impl_->shared->config_mu);
    const auto jp = nlohmann::json::json_pointer("/rendezvous/auth_token");
    if (impl_->shared->config.contains(jp) && impl_->shared->config[jp].is_string())
      token = impl_->shared->config[jp].get<std::string>();
  }
  // TLS: each of env STRATA_TLS_CERT/KEY/CA overrides config /rendezvous/tls/{cert,key,ca}.
  store::TlsConfig tls;
  {
    std::lock_guard<std::mutex> clock(impl_->shared->config_mu);
    const auto& config = impl_->shared->config;
    const auto pick = [&config](const char* env, const char* field) {
      if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return std::string(v);
      const auto jp = nlohmann::json::json_pointer(std::string("/rendezvous/tls/") + field);
      if (config.contains(jp) && config[jp].is_string()) return config[jp].get<std::string>();
      return std::string();
    };
    tls.cert = pick("STRATA_TLS_CERT", "cert");
    tls.key = pick("STRATA_TLS_KEY", "key");
    tls.ca = pick("STRATA_TLS_CA", "ca");
  }
  std::unique_ptr<store::StoreServer> server;
  std::string address = cfg.address;
  if (cfg.serve) {
    server = std::make_unique<store::StoreServer>(host, port, token, tls);
    address = store::join_host_port(host, server->port());
  }
  const auto timeout_ms = static_cast<int64_t>(cfg.timeout_s * 1000.0);
  auto client =
      std::make_shared<store::TcpStoreClient>(address, token, timeout_ms, &impl_->shared->abort, tls);
  if (!impl_->shared->set_remote_store(client))
    STRATA_THROW(STRATA_ERR_FAILED_PRECONDITION, "connect_store: a rendezvous store is already "
                 "connected; call connect_store once per process");
  {
    std::lock_guard<std::mutex> clock(impl_->shared->config_mu);
    const auto jp = nlohmann::json::json_pointer("/rendezvous/address");
    try {
      if (!impl_->shared->config.contains(jp)) impl_->shared->config[jp] = address;
    } catch (const nlohmann::json::exception&) {
      // /rendezvous is not an object in this config; the hint is optional.
    }
  }
  impl_->store_server = std::move(server);
  impl_->store_address = address;
  logger("host")->info("connected to the rendezvous store at {}{}{}", address, tls.enabled() ? " over TLS" : "",
                       cfg.serve ? " (serving)" : "");
}

std::string PluginHost::store_address() const {
  std::lock_guard<std::mutex> lock(impl_->store_mu);
  return impl_->store_address;
}

}  // namespace strata
