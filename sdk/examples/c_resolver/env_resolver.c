/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A complete Strata plugin in plain C11: a ClusterResolver named
 * "env_example" that reads the cluster from two environment variables,
 *
 *   EXAMPLE_WORKERS="host1:2222,host2:2222"   (the worker addresses, in order)
 *   EXAMPLE_INDEX=1                           (this process's worker index)
 *
 * It shows what every plugin needs and nothing else: the one exported entry
 * symbol, a static descriptor, a vtable whose header carries struct_size and
 * abi_minor, statuses with messages that say what to fix, strings returned
 * through the caller's write callback, and logging only through the host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <strata/c/strata.h>

typedef struct env_resolver {
  const strata_host_api* host;
  char* workers; /* the EXAMPLE_WORKERS value, copied at create time */
  int index;
  int count;
} env_resolver;

static strata_status_t set_error(strata_error* err, strata_status_t code, const char* msg) {
  if (err) {
    err->code = code;
    snprintf(err->message, sizeof err->message, "%s", msg);
  }
  return code;
}

static strata_status_t env_create(const strata_host_api* host, const char* options_json,
                                  strata_resolver_t* out, strata_error* err) {
  (void)options_json; /* this example takes no options */
  const char* workers = getenv("EXAMPLE_WORKERS");
  const char* index = getenv("EXAMPLE_INDEX");
  if (!workers || !*workers)
    return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                     "EXAMPLE_WORKERS is not set: export EXAMPLE_WORKERS=\"host1:port,host2:port\"");
  char* end = NULL;
  long idx = index ? strtol(index, &end, 10) : 0;
  if (index && (*index == '\0' || *end != '\0'))
    return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                     "EXAMPLE_INDEX must be a whole number such as 0");
  int count = 1;
  for (const char* p = workers; *p; ++p) count += (*p == ',');
  if (idx < 0 || idx >= count)
    return set_error(err, STRATA_ERR_INVALID_ARGUMENT,
                     "EXAMPLE_INDEX is outside EXAMPLE_WORKERS: use 0 .. (number of workers - 1)");
  env_resolver* r = (env_resolver*)calloc(1, sizeof *r);
  if (!r) return set_error(err, STRATA_ERR_INTERNAL, "out of memory");
  r->host = host;
  size_t len = strlen(workers) + 1;
  r->workers = (char*)malloc(len);
  if (r->workers) memcpy(r->workers, workers, len);
  r->index = (int)idx;
  r->count = count;
  if (!r->workers) {
    free(r);
    return set_error(err, STRATA_ERR_INTERNAL, "out of memory");
  }
  host->log(host, STRATA_LOG_DEBUG, "resolver.env_example", "resolved cluster from EXAMPLE_WORKERS");
  *out = (strata_resolver_t)r;
  return STRATA_OK;
}

static void env_destroy(strata_resolver_t handle) {
  env_resolver* r = (env_resolver*)handle;
  if (!r) return;
  free(r->workers);
  free(r);
}

/* Writes the workers as a JSON array of strings. Addresses are host:port,
 * which need no JSON escaping. */
static void write_workers(const env_resolver* r, strata_write_fn write, void* user) {
  write(user, "[", 1);
  const char* p = r->workers;
  for (int i = 0; i < r->count; ++i) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (i) write(user, ",", 1);
    write(user, "\"", 1);
    write(user, p, len);
    write(user, "\"", 1);
    p = comma ? comma + 1 : p + len;
  }
  write(user, "]", 1);
}

static strata_status_t env_describe(strata_resolver_t handle, strata_write_fn write, void* user,
                                    strata_error* err) {
  (void)err;
  const env_resolver* r = (const env_resolver*)handle;
  char tail[256];
  write(user, "{\"cluster_spec\":{\"worker\":", 26);
  write_workers(r, write, user);
  int n = snprintf(tail, sizeof tail,
                   "},\"task_type\":\"worker\",\"task_id\":%d,\"rpc_layer\":null,"
                   "\"environment\":null,\"num_accelerators\":{},\"env_after\":{}}",
                   r->index);
  write(user, tail, (uint64_t)n);
  return STRATA_OK;
}

static strata_status_t env_master(strata_resolver_t handle, const char* task_type, int32_t task_id,
                                  const char* rpc_layer, strata_write_fn write, void* user,
                                  strata_error* err) {
  const env_resolver* r = (const env_resolver*)handle;
  if (task_type && strcmp(task_type, "worker") != 0)
    return set_error(err, STRATA_ERR_NOT_FOUND, "this cluster only has the job 'worker'");
  int id = task_type ? task_id : r->index;
  if (id < 0 || id >= r->count)
    return set_error(err, STRATA_ERR_NOT_FOUND, "task_id is outside the 'worker' job");
  const char* p = r->workers;
  for (int i = 0; i < id; ++i) p = strchr(p, ',') + 1;
  const char* comma = strchr(p, ',');
  if (rpc_layer && *rpc_layer) {
    write(user, rpc_layer, strlen(rpc_layer));
    write(user, "://", 3);
  }
  write(user, p, comma ? (uint64_t)(comma - p) : strlen(p));
  return STRATA_OK;
}

static int32_t env_detect(const strata_host_api* host) {
  (void)host;
  return getenv("EXAMPLE_WORKERS") != NULL;
}

static const strata_resolver_vtable kVtable = {
    .struct_size = sizeof(strata_resolver_vtable),
    .abi_minor = STRATA_ABI_MINOR,
    .ext = NULL,
    .create = env_create,
    .destroy = env_destroy,
    .describe = env_describe,
    .master = env_master,
    .detect = env_detect,
};

static const strata_plugin_component kComponents[] = {{
    .struct_size = sizeof(strata_plugin_component),
    .abi_minor = STRATA_ABI_MINOR,
    .ext = NULL,
    .kind = STRATA_KIND_CLUSTER_RESOLVER,
    .name = "env_example",
    .version = "1.0.0",
    .vtable = &kVtable,
}};

static const strata_plugin_desc kDesc = {
    .struct_size = sizeof(strata_plugin_desc),
    .abi_minor = STRATA_ABI_MINOR,
    .ext = NULL,
    .library_name = "Strata SDK example: env_example resolver (C)",
    .library_version = "1.0.0",
    .num_components = 1,
    .components = kComponents,
    .init = NULL,
    .shutdown = NULL,
};

STRATA_EXPORT strata_status_t strata_plugin_entry_v1(const strata_host_api* host,
                                                     uint32_t host_abi_minor,
                                                     const strata_plugin_desc** out) {
  (void)host;
  (void)host_abi_minor; /* this plugin needs nothing newer than ABI 1.0 */
  *out = &kDesc;
  return STRATA_OK;
}
