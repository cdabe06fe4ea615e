/* The process's function registry (registry.h, tdist/rpc.h): a map from name to C function under
 * one mutex, shared by every agent of the process, as Python finds a function by its module and
 * name in every worker. Lookups copy the entry out under the lock, so unregistering never pulls a
 * function from under a call that already looked it up.
 *
 * Beside it, what a function uses to fail or read its arguments the way a Python function would:
 * td_rpc_raise (a typed error: base/error.h keeps the type beside the thread's message, where the
 * agent reads it back), td_rpc_bind (Python's argument binding and its TypeError messages), and worker
 * infos with PyTorch's name rules; and the type names of values (record tags named by the
 * application) with methods registered per type as "<Type>.<method>", which RRef proxies call. */
#include "rpc/registry.h"

#include <tdist/rref.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/map.h"

#define FUNCTION_NAME_MAX 255 /* longest registered name, in bytes */
#define BIND_MAX_PARAMS 64

static pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static td_map g_functions = TD_MAP_INIT; /* name -> rpc_function * */

static td_status check_function_name(const char *name)
{
    if (!name)
        return error_fmt(TD_ERR_INVALID, "RPC function name is NULL");
    size_t len = strnlen(name, FUNCTION_NAME_MAX + 1);
    if (len == 0 || len > FUNCTION_NAME_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC function name must be 1 to %d bytes long, got %s", FUNCTION_NAME_MAX,
                         len ? "a longer one" : "an empty one");
    return TD_OK;
}

static td_status register_function(const char *name, td_rpc_fn fn, td_rpc_async_fn async_fn, void *arg)
{
    TD_TRY(check_function_name(name));
    if (!fn && !async_fn)
        return error_fmt(TD_ERR_INVALID, "registering RPC function '%s': the function pointer is NULL", name);
    rpc_function *entry = TD_NEW(rpc_function);
    entry->fn = fn;
    entry->async_fn = async_fn;
    entry->arg = arg;
    size_t len = strlen(name);
    pthread_mutex_lock(&g_registry_mu);
    bool taken = map_get(&g_functions, name, len) != NULL;
    if (!taken)
        map_put(&g_functions, name, len, entry);
    pthread_mutex_unlock(&g_registry_mu);
    if (taken) {
        free(entry);
        return error_fmt(TD_ERR_ALREADY,
                         "RPC function '%s' is already registered in this process; unregister it first to replace it",
                         name);
    }
    return TD_OK;
}

td_status td_rpc_register(const char *name, td_rpc_fn fn, void *arg) { return register_function(name, fn, NULL, arg); }

td_status td_rpc_register_async(const char *name, td_rpc_async_fn fn, void *arg)
{
    return register_function(name, NULL, fn, arg);
}

td_status td_rpc_unregister(const char *name)
{
    TD_TRY(check_function_name(name));
    pthread_mutex_lock(&g_registry_mu);
    rpc_function *entry = map_remove(&g_functions, name, strlen(name));
    /* An empty registry holds no memory, so a process that unregisters everything ends clean. */
    if (entry && g_functions.len == 0)
        map_free(&g_functions, NULL);
    pthread_mutex_unlock(&g_registry_mu);
    if (!entry)
        return error_fmt(TD_ERR_NOT_FOUND, "no RPC function named '%s' is registered in this process", name);
    free(entry);
    return TD_OK;
}

bool rpc_registry_lookup(const char *name, rpc_function *out)
{
    if (!name || !out)
        return false;
    size_t len = strnlen(name, FUNCTION_NAME_MAX + 1);
    if (len == 0 || len > FUNCTION_NAME_MAX)
        return false;
    pthread_mutex_lock(&g_registry_mu);
    const rpc_function *entry = map_get(&g_functions, name, len);
    if (entry)
        *out = *entry;
    pthread_mutex_unlock(&g_registry_mu);
    return entry != NULL;
}

/* ---- types and methods (tdist/rref.h) ----------------------------------------------------- */

static td_map g_types = TD_MAP_INIT; /* record tag (4 bytes) -> type name (g_registry_mu) */

td_status td_rpc_register_type(uint32_t record_tag, const char *type_name)
{
    if (!type_name || !*type_name || strlen(type_name) > FUNCTION_NAME_MAX / 2)
        return error_fmt(TD_ERR_INVALID, "a type name must be 1 to %d bytes long", FUNCTION_NAME_MAX / 2);
    if (record_tag < TD_REC_USER)
        return error_fmt(TD_ERR_INVALID, "record tag %u is tdist's; application types take tags from %d up",
                         record_tag, TD_REC_USER);
    td_status st = TD_OK;
    pthread_mutex_lock(&g_registry_mu);
    const char *had = map_get(&g_types, &record_tag, sizeof record_tag);
    if (had && strcmp(had, type_name) != 0)
        st = error_fmt(TD_ERR_ALREADY, "record tag %u is already the type %s", record_tag, had);
    else if (!had)
        map_put(&g_types, &record_tag, sizeof record_tag, alloc_strdup(type_name));
    pthread_mutex_unlock(&g_registry_mu);
    return st;
}

const char *td_rpc_type_name(const td_value *v)
{
    switch (td_value_kind_of(v)) {
    case TD_VAL_NONE: return "NoneType";
    case TD_VAL_BOOL: return "bool";
    case TD_VAL_INT: return "int";
    case TD_VAL_DOUBLE: return "float";
    case TD_VAL_COMPLEX: return "complex";
    case TD_VAL_STRING: return "str";
    case TD_VAL_BYTES: return "bytes";
    case TD_VAL_TENSOR: return "Tensor";
    case TD_VAL_LIST: return "list";
    case TD_VAL_TUPLE: return "tuple";
    case TD_VAL_DICT: return "dict";
    default: break;
    }
    uint32_t tag = td_value_record_tag(v);
    switch (tag) {
    case TD_REC_WORKER_INFO: return "WorkerInfo";
    case TD_REC_RREF: return "RRef";
    default: break;
    }
    pthread_mutex_lock(&g_registry_mu);
    const char *name = map_get(&g_types, &tag, sizeof tag); /* never freed: stable */
    pthread_mutex_unlock(&g_registry_mu);
    return name ? name : "object";
}

static td_status register_method(const char *type_name, const char *method, td_rpc_fn fn, td_rpc_async_fn async_fn,
                                 void *arg)
{
    if (!type_name || !method)
        return error_fmt(TD_ERR_INVALID, "td_rpc_register_method: %s is NULL", type_name ? "method" : "type_name");
    char name[FUNCTION_NAME_MAX + 2];
    int n = snprintf(name, sizeof name, "%s.%s", type_name, method);
    if (n < 0 || n > FUNCTION_NAME_MAX)
        return error_fmt(TD_ERR_INVALID, "method %s.%s: the name is longer than %d bytes", type_name, method,
                         FUNCTION_NAME_MAX);
    return register_function(name, fn, async_fn, arg);
}

td_status td_rpc_register_method(const char *type_name, const char *method, td_rpc_fn fn, void *arg)
{
    return register_method(type_name, method, fn, NULL, arg);
}

td_status td_rpc_register_method_async(const char *type_name, const char *method, td_rpc_async_fn fn, void *arg)
{
    return register_method(type_name, method, NULL, fn, arg);
}

/* ---- raising typed errors ------------------------------------------------------------------ */

td_status td_rpc_raise(const char *type_name, const char *fmt, ...)
{
    char message[TD_ERROR_MAX];
    message[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
    }
    return error_set_typed(TD_ERR_REMOTE, type_name && *type_name ? type_name : "RuntimeError", message);
}

/* ---- binding arguments --------------------------------------------------------------------- */

typedef struct param {
    const char *name; /* into the params string; not NUL-terminated */
    int len;
    bool optional;
} param;

/* Splits "a, b, c=x" into parameters; a programming error in the spec is TD_ERR_INVALID. */
static td_status parse_params(const char *function, const char *spec, param *params, size_t *count)
{
    size_t n = 0;
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        const char *start = p;
        while (*p && *p != ',' && *p != '=' && *p != ' ' && *p != '\t')
            p++;
        size_t len = (size_t)(p - start);
        while (*p == ' ' || *p == '\t')
            p++;
        bool optional = *p == '=';
        while (*p && *p != ',')
            p++;
        if (len == 0)
            return error_fmt(TD_ERR_INVALID, "td_rpc_bind: parameter %zu of %s() in \"%s\" has no name", n + 1,
                             function, spec);
        if (n == BIND_MAX_PARAMS)
            return error_fmt(TD_ERR_INVALID, "td_rpc_bind: %s() has more than %d parameters", function,
                             BIND_MAX_PARAMS);
        if (n > 0 && params[n - 1].optional && !optional)
            return error_fmt(TD_ERR_INVALID, "td_rpc_bind: in \"%s\", parameter '%.*s' without a default follows one with a default",
                             spec, (int)len, start);
        for (size_t i = 0; i < n; i++)
            if ((size_t)params[i].len == len && memcmp(params[i].name, start, len) == 0)
                return error_fmt(TD_ERR_INVALID, "td_rpc_bind: duplicate parameter '%.*s' in \"%s\"", (int)len, start,
                                 spec);
        params[n].name = start;
        params[n].len = (int)len;
        params[n].optional = optional;
        n++;
        if (*p == ',') {
            p++;
            if (!*p)
                return error_fmt(TD_ERR_INVALID, "td_rpc_bind: \"%s\" ends with a comma", spec);
        }
    }
    *count = n;
    return TD_OK;
}

/* Python's "missing 3 required positional arguments: 'a', 'b', and 'c'". */
static td_status raise_missing(const char *function, const param *params, const size_t *missing, size_t n)
{
    char names[TD_ERROR_MAX / 2];
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < n && used < sizeof names; i++) {
        const char *sep = i == 0 ? "" : n == 2 ? " and " : i + 1 == n ? ", and " : ", ";
        int w = snprintf(names + used, sizeof names - used, "%s'%.*s'", sep, params[missing[i]].len,
                         params[missing[i]].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return td_rpc_raise("TypeError", "%s() missing %zu required positional argument%s: %s", function, n,
                        n == 1 ? "" : "s", names);
}

td_status td_rpc_bind(const char *function, const char *params, const td_value *args, const td_value *kwargs,
                      const td_value **out)
{
    if (!function)
        function = "function";
    if (!params || (!out && *params))
        return error_fmt(TD_ERR_INVALID, "td_rpc_bind: NULL %s for %s()", params ? "out" : "params", function);
    param spec[BIND_MAX_PARAMS];
    size_t n = 0;
    TD_TRY(parse_params(function, params, spec, &n));
    td_value_kind ak = td_value_kind_of(args);
    if (args && ak != TD_VAL_TUPLE && ak != TD_VAL_LIST)
        return error_fmt(TD_ERR_INVALID, "td_rpc_bind: args of %s() must be a tuple or a list, not %s", function,
                         td_value_kind_name(ak));
    if (kwargs && td_value_kind_of(kwargs) != TD_VAL_DICT)
        return error_fmt(TD_ERR_INVALID, "td_rpc_bind: kwargs of %s() must be a dict, not %s", function,
                         td_value_kind_name(td_value_kind_of(kwargs)));

    /* CPython's order (initialize_locals): positionals fill the first parameters, keywords are
     * matched next, and only then are too many positionals, and then missing ones, reported. */
    size_t nargs = td_value_len(args);
    for (size_t i = 0; i < n; i++)
        out[i] = i < nargs ? td_value_at(args, i) : NULL;
    size_t nkw = td_value_len(kwargs);
    for (size_t k = 0; k < nkw; k++) {
        const td_value *key = td_value_dict_key_at(kwargs, k);
        if (td_value_kind_of(key) != TD_VAL_STRING)
            return td_rpc_raise("TypeError", "%s() keywords must be strings", function);
        size_t klen;
        const char *kname = td_value_get_string(key, &klen);
        size_t j = 0;
        while (j < n && !((size_t)spec[j].len == klen && memcmp(spec[j].name, kname, klen) == 0))
            j++;
        if (j == n)
            return td_rpc_raise("TypeError", "%s() got an unexpected keyword argument '%s'", function, kname);
        if (out[j])
            return td_rpc_raise("TypeError", "%s() got multiple values for argument '%s'", function, kname);
        out[j] = td_value_dict_value_at(kwargs, k);
    }
    if (nargs > n) {
        size_t required = 0;
        while (required < n && !spec[required].optional)
            required++;
        char takes[96]; /* two size_t in the longer form */
        if (required < n)
            snprintf(takes, sizeof takes, "from %zu to %zu positional arguments", required, n);
        else
            snprintf(takes, sizeof takes, "%zu positional argument%s", n, n == 1 ? "" : "s");
        return td_rpc_raise("TypeError", "%s() takes %s but %zu %s given", function, takes, nargs,
                            nargs == 1 ? "was" : "were");
    }
    size_t missing[BIND_MAX_PARAMS], nmissing = 0;
    for (size_t i = 0; i < n; i++)
        if (!out[i] && !spec[i].optional)
            missing[nmissing++] = i;
    if (nmissing)
        return raise_missing(function, spec, missing, nmissing);
    return TD_OK;
}

/* ---- worker infos -------------------------------------------------------------------------- */

static bool worker_name_valid(const char *name, size_t len)
{
    if (len == 0 || len >= TD_RPC_MAX_NAME)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_' || c == ':';
        if (!ok)
            return false;
    }
    return true;
}

td_status td_worker_info_make(const char *name, int64_t id, td_worker_info *info)
{
    if (!info)
        return error_fmt(TD_ERR_INVALID, "td_worker_info_make: info is NULL");
    size_t len = name ? strnlen(name, TD_RPC_MAX_NAME) : 0;
    if (!name || !worker_name_valid(name, len))
        return error_fmt(TD_ERR_INVALID,
                         "Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than 128 chars, "
                         "but got %s",
                         name ? name : "(null)");
    /* PyTorch keeps worker ids in an int16 (worker_id_t). */
    if (id < INT16_MIN || id > INT16_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC worker id %lld out of bound of int16_t.", (long long)id);
    memset(info, 0, sizeof *info);
    memcpy(info->name, name, len);
    info->id = id;
    return TD_OK;
}

bool td_worker_info_equal(const td_worker_info *a, const td_worker_info *b)
{
    if (!a || !b)
        return a == b;
    return a->id == b->id && strncmp(a->name, b->name, TD_RPC_MAX_NAME) == 0;
}

td_value *td_worker_info_value(const td_worker_info *info)
{
    if (!info)
        return td_value_none();
    char name[TD_RPC_MAX_NAME];
    snprintf(name, sizeof name, "%.*s", TD_RPC_MAX_NAME - 1, info->name);
    return td_value_worker_info(name, info->id);
}

td_status td_worker_info_from_value(const td_value *v, td_worker_info *info)
{
    if (td_value_kind_of(v) != TD_VAL_RECORD || td_value_record_tag(v) != TD_REC_WORKER_INFO)
        return error_fmt(TD_ERR_INVALID, "expected a WorkerInfo (a TD_REC_WORKER_INFO record), got %s",
                         td_value_kind_of(v) == TD_VAL_RECORD ? "a record of another tag"
                                                              : td_value_kind_name(td_value_kind_of(v)));
    const td_value *name = td_value_at(v, 0), *id = td_value_at(v, 1);
    if (td_value_len(v) != 2 || td_value_kind_of(name) != TD_VAL_STRING || td_value_kind_of(id) != TD_VAL_INT)
        return error_fmt(TD_ERR_INVALID, "malformed WorkerInfo record: expected the fields (name: string, id: int)");
    size_t len;
    const char *str = td_value_get_string(name, &len);
    if (strlen(str) != len)
        return error_fmt(TD_ERR_INVALID, "malformed WorkerInfo record: the name holds a NUL byte");
    return td_worker_info_make(str, td_value_get_int(id), info);
}
