/* The names of collectives (tdist/collective.h): kinds, the descriptors every rank must agree on,
 * and the message of a disagreement. They live in the transport layer, the lowest one that compares
 * descriptors (the tcp transport for each message, the same-host layer for each arrival), so that
 * it names a disagreement without calling up into the process group; the front end, the backends
 * and the mpi backend's exchange use the same names. */
#include <ctype.h>
#include <stdio.h>

#include <tdist/collective.h>

static const char *const kind_names[TD_COLL_KIND_COUNT] = {
    "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter",
    "reduce_scatter", "all_to_all", "barrier", "send", "recv",
};

const char *td_coll_kind_name(td_coll_kind kind)
{
    return (int)kind >= 0 && kind < TD_COLL_KIND_COUNT ? kind_names[kind] : "unknown";
}

int td_coll_desc_format(const td_coll_desc *d, char *out, size_t size)
{
    int kind = (int)(d->what & 0xff), dtype = (int)(d->what >> 8 & 0xff), reduce = (int)(d->what >> 16 & 0xff) - 1;
    int root = (int)(uint32_t)(d->what >> 32) - 1;
    char op[24] = "";
    if (reduce >= 0) {
        size_t i = 0;
        for (const char *n = td_reduce_op_name((td_reduce_op)reduce); *n && i + 1 < sizeof op; n++)
            op[i++] = (char)tolower((unsigned char)*n);
        op[i] = '\0';
    }
    const char *kname = td_coll_kind_name((td_coll_kind)kind);
    if (kind == TD_COLL_BARRIER)
        return snprintf(out, size, "%s()", kname);
    const char *dname = td_dtype_is_valid(dtype) ? td_dtype_name((td_dtype)dtype) : "unknown dtype";
    char count[40] = "";
    if (kind != TD_COLL_ALL_TO_ALL)
        snprintf(count, sizeof count, ", %llu element%s", (unsigned long long)d->count, d->count == 1 ? "" : "s");
    char rooted[24] = "";
    if (root >= 0)
        snprintf(rooted, sizeof rooted, ", root %d", root);
    return snprintf(out, size, "%s(%s%s%s%s%s)", kname, dname, count, *op ? ", " : "", op, rooted);
}

int td_coll_mismatch_format(char *out, size_t size, uint64_t seq, int rank_a, const char *a, int rank_b,
                            const char *b)
{
    char which[48] = "a collective";
    if (seq)
        snprintf(which, sizeof which, "collective #%llu", (unsigned long long)seq);
    return snprintf(out, size,
                    "Ranks disagree about %s: rank %d runs %s, rank %d runs %s; every rank must run the same "
                    "collectives with the same sizes",
                    which, rank_a, a, rank_b, b);
}
