// SPDX-License-Identifier: Apache-2.0
// FabricLib: libfabric's exported functions, opened with dlopen the first
// time a caller needs them, shared by the libfabric transport plugin and
// strata-info. Header-only.
//
// Why. The plugin used to link libfabric, so the dynamic loader opened it,
// and the provider libraries it links (psm, psm2, infinipath), whenever a
// process scanned the plugin directory, whatever transport the job used.
// Their constructors took about 0.2 s per process here (mostly sleeping in
// libinfinipath); two multi-process test groups ran 1.5x as long. Now only a
// process that creates a libfabric transport, or asks strata-info about
// libfabric, pays for it.
//
// Which library: STRATA_LIBFABRIC_LIBRARY (a path or a file name) when set,
// else the soname found at build time (cmake/StrataLibfabricSymbols.cmake),
// "libfabric.so.1". Which functions: everything else libfabric offers is
// reached through its objects' operation tables (static inline in its
// headers); these six are the library's own symbols, each taken at the
// version the build's headers were made for (dlvsym), so that a newer
// libfabric gives the struct layouts our code reads.
//
// Threads: fabric_lib() opens the library once per process (a function-local
// static); the library is never closed (providers keep threads and signal
// handlers for the life of the process).
#pragma once

#include <dlfcn.h>
#include <rdma/fabric.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#ifndef STRATA_LIBFABRIC_SONAME
#define STRATA_LIBFABRIC_SONAME "libfabric.so.1"
#endif

namespace strata::transport::libfabric {

struct FabricLib {
  std::string library;  // what was opened (STRATA_LIBFABRIC_LIBRARY or the soname)
  std::string error;    // "" when every function was found; else what failed and what to do
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**) = nullptr;
  void (*freeinfo)(fi_info*) = nullptr;
  fi_info* (*dupinfo)(const fi_info*) = nullptr;
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*) = nullptr;
  const char* (*strerror)(int) = nullptr;
  uint32_t (*version)() = nullptr;

  bool ok() const { return error.empty(); }
};

namespace fabric_lib_detail {

#ifndef STRATA_LIBFABRIC_SYMBOL_VERSIONS
#define STRATA_LIBFABRIC_SYMBOL_VERSIONS ""
#endif

// The version of `name` the build's headers were made for, from
// STRATA_LIBFABRIC_SYMBOL_VERSIONS ("fi_getinfo@FABRIC_1.3 fi_fabric@FABRIC_1.1
// ..."); "" when the build did not find it.
inline std::string build_version(const std::string& name) {
  const std::string all = std::string(" ") + STRATA_LIBFABRIC_SYMBOL_VERSIONS + " ";
  const size_t at = all.find(" " + name + "@");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 2;
  return all.substr(from, all.find(' ', from) - from);
}

// `name` at the build's version, else the library's default version.
inline void* symbol(void* handle, const char* name) {
  const std::string version = build_version(name);
  if (!version.empty()) {
    if (void* p = ::dlvsym(handle, name, version.c_str())) return p;
  }
  return ::dlsym(handle, name);
}

inline FabricLib open_fabric_lib() {
  FabricLib lib;
  const char* env = std::getenv("STRATA_LIBFABRIC_LIBRARY");
  lib.library = env != nullptr && *env != '\0' ? env : STRATA_LIBFABRIC_SONAME;
  void* h = ::dlopen(lib.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = ::dlerror();
    lib.error = std::string("cannot open libfabric (") + lib.library + ": " + (why != nullptr ? why : "unknown error") +
                "); install it (apt-get install libfabric1)" +
                (env != nullptr && *env != '\0' ? " or fix STRATA_LIBFABRIC_LIBRARY, which names it"
                                                : " or set STRATA_LIBFABRIC_LIBRARY to its path") +
                ", or use another transport (tcp, shmem, auto)";
    return lib;
  }
  lib.getinfo = reinterpret_cast<decltype(lib.getinfo)>(symbol(h, "fi_getinfo"));
  lib.freeinfo = reinterpret_cast<decltype(lib.freeinfo)>(symbol(h, "fi_freeinfo"));
  lib.dupinfo = reinterpret_cast<decltype(lib.dupinfo)>(symbol(h, "fi_dupinfo"));
  lib.fabric = reinterpret_cast<decltype(lib.fabric)>(symbol(h, "fi_fabric"));
  lib.strerror = reinterpret_cast<decltype(lib.strerror)>(symbol(h, "fi_strerror"));
  lib.version = reinterpret_cast<decltype(lib.version)>(symbol(h, "fi_version"));
  std::string missing;
  for (auto [fn, name] : {std::pair<void*, const char*>{reinterpret_cast<void*>(lib.getinfo), "fi_getinfo"},
                          {reinterpret_cast<void*>(lib.freeinfo), "fi_freeinfo"},
                          {reinterpret_cast<void*>(lib.dupinfo), "fi_dupinfo"},
                          {reinterpret_cast<void*>(lib.fabric), "fi_fabric"},
                          {reinterpret_cast<void*>(lib.strerror), "fi_strerror"},
                          {reinterpret_cast<void*>(lib.version), "fi_version"}})
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  if (!missing.empty())
    lib.error = lib.library + " is not libfabric, or too old: it lacks " + missing +
                " (libfabric 1.5 or newer is needed; check STRATA_LIBFABRIC_LIBRARY)";
  // Kept open even then: closing a half-initialised libfabric is riskier than
  // leaving it mapped.
  return lib;
}

}  // namespace fabric_lib_detail

/// libfabric, opened on the first call (see above); check ok() first.
inline const FabricLib& fabric_lib() {
  static const FabricLib lib = fabric_lib_detail::open_fabric_lib();
  return lib;
}

}  // namespace strata::transport::libfabric
