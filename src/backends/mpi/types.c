/* td_dtype and reduce ops as MPI sees them, for the mpi backend (mpi_impl.h).
 *
 * Most dtypes are MPI's own (MPI_C_BOOL, MPI_UINT8_T, MPI_INT8_T .. MPI_INT64_T, MPI_FLOAT,
 * MPI_DOUBLE, MPI_C_FLOAT_COMPLEX, MPI_C_DOUBLE_COMPLEX) and most reductions MPI's built-in ops,
 * which MPI implementations vectorize and may offload. Where MPI has no type (float16 and
 * bfloat16: a committed 2-byte contiguous type each) or where its op means something else than
 * tdist's kernel (MIN and MAX on floating types, whose NaN MPI need not propagate), the reduction
 * is a user-defined MPI op that runs tdist's own kernel (tensor.h td_reduce_kernel), so that every
 * backend gives the same results. bool reduces with MPI's logical ops: SUM and MAX are LOR,
 * PRODUCT and MIN are LAND, as tdist defines them. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include <tdist/tensor.h>

#include "backends/mpi/mpi_impl.h"
#include "base/error.h"

static MPI_Datatype g_f16 = MPI_DATATYPE_NULL, g_bf16 = MPI_DATATYPE_NULL;

/* One user-defined MPI op per (kind, dtype) pair that needs one: MPI calls it with inout := in op
 * inout; tdist's kernels take (dst, a, b) with dst == a allowed, and every op here commutes. */
enum { UOP_SUM, UOP_PRODUCT, UOP_MIN, UOP_MAX, UOP_KINDS };
enum { UDT_F16, UDT_BF16, UDT_F32, UDT_F64, UDT_TYPES };
static MPI_Op g_uops[UOP_KINDS][UDT_TYPES];
static const td_reduce_op uop_kind[UOP_KINDS] = {TD_SUM, TD_PRODUCT, TD_MIN, TD_MAX};
static const td_dtype udt_dtype[UDT_TYPES] = {TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64};
static td_reduce_fn g_kernels[UOP_KINDS][UDT_TYPES];

#define USER_OP(k, t)                                                                      \
    static void user_op_##k##_##t(void *in, void *inout, int *len, MPI_Datatype *type)     \
    {                                                                                      \
        (void)type;                                                                        \
        g_kernels[k][t](inout, inout, in, (size_t)*len);                                   \
    }
#define USER_OPS(k) USER_OP(k, UDT_F16) USER_OP(k, UDT_BF16) USER_OP(k, UDT_F32) USER_OP(k, UDT_F64)
USER_OPS(UOP_SUM)
USER_OPS(UOP_PRODUCT)
USER_OPS(UOP_MIN)
USER_OPS(UOP_MAX)

#define FNS(k) {user_op_##k##_UDT_F16, user_op_##k##_UDT_BF16, user_op_##k##_UDT_F32, user_op_##k##_UDT_F64}
static MPI_User_function *const user_fns[UOP_KINDS][UDT_TYPES] = {FNS(UOP_SUM), FNS(UOP_PRODUCT), FNS(UOP_MIN),
                                                                  FNS(UOP_MAX)};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static td_status g_init_status = TD_OK;
static char g_init_msg[512];

/* mpi_datatype's and mpi_reduce_op's answers (mpi_impl.h), worked out once at init: they are asked
 * on every call. */
MPI_Datatype mpi_dtypes[TD_DTYPE_COUNT];
MPI_Op mpi_ops[TD_REDUCE_OP_COUNT][TD_DTYPE_COUNT];
static MPI_Datatype datatype_lookup(td_dtype dtype);
static bool reduce_op_lookup(td_reduce_op kind, td_dtype dtype, MPI_Op *out);

static void types_init_once(void)
{
    int rc = MPI_Type_contiguous(2, MPI_BYTE, &g_f16);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&g_f16);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&g_bf16);
    for (int k = 0; k < UOP_KINDS && rc == MPI_SUCCESS; k++) {
        for (int t = 0; t < UDT_TYPES && rc == MPI_SUCCESS; t++) {
            g_kernels[k][t] = td_reduce_kernel(uop_kind[k], udt_dtype[t]);
            if (!g_kernels[k][t]) {
                g_init_status = error_fmt(TD_ERR_INTERNAL, "mpi backend: no reduce kernel for %s on %s",
                                         td_reduce_op_name(uop_kind[k]), td_dtype_name(udt_dtype[t]));
                snprintf(g_init_msg, sizeof g_init_msg, "%s", td_last_error());
                return;
            }
            rc = MPI_Op_create(user_fns[k][t], 1, &g_uops[k][t]);
        }
    }
    if (rc != MPI_SUCCESS) {
        g_init_status = mpi_error(rc, "mpi backend: creating the float16/bfloat16 datatypes and reduce ops");
        snprintf(g_init_msg, sizeof g_init_msg, "%s", td_last_error());
        return;
    }
    for (int t = 0; t < TD_DTYPE_COUNT; t++)
        mpi_dtypes[t] = datatype_lookup((td_dtype)t);
    for (int k = 0; k < TD_REDUCE_OP_COUNT; k++)
        for (int t = 0; t < TD_DTYPE_COUNT; t++)
            if (!reduce_op_lookup((td_reduce_op)k, (td_dtype)t, &mpi_ops[k][t]))
                mpi_ops[k][t] = MPI_OP_NULL;
    error_clear();
}

td_status mpi_types_init(void)
{
    mpi_enter();
    pthread_once(&g_once, types_init_once);
    mpi_leave();
    if (g_init_status != TD_OK)
        return error_set(g_init_status, g_init_msg);
    return TD_OK;
}

static MPI_Datatype datatype_lookup(td_dtype dtype)
{
    switch (dtype) {
    case TD_BOOL: return MPI_C_BOOL;
    case TD_UINT8: return MPI_UINT8_T;
    case TD_INT8: return MPI_INT8_T;
    case TD_INT16: return MPI_INT16_T;
    case TD_INT32: return MPI_INT32_T;
    case TD_INT64: return MPI_INT64_T;
    case TD_FLOAT16: return g_f16;
    case TD_BFLOAT16: return g_bf16;
    case TD_FLOAT32: return MPI_FLOAT;
    case TD_FLOAT64: return MPI_DOUBLE;
    case TD_COMPLEX64: return MPI_C_FLOAT_COMPLEX;
    case TD_COMPLEX128: return MPI_C_DOUBLE_COMPLEX;
    default: return MPI_DATATYPE_NULL;
    }
}

static int user_type_index(td_dtype dtype)
{
    switch (dtype) {
    case TD_FLOAT16: return UDT_F16;
    case TD_BFLOAT16: return UDT_BF16;
    case TD_FLOAT32: return UDT_F32;
    case TD_FLOAT64: return UDT_F64;
    default: return -1;
    }
}

static bool reduce_op_lookup(td_reduce_op kind, td_dtype dtype, MPI_Op *out)
{
    if (kind == TD_AVG || kind == TD_PREMUL_SUM) /* the front end resolves them into SUM */
        return false;
    if (td_reduce_check(kind, dtype) != TD_OK)
        return false;
    int ut = user_type_index(dtype);
    bool half = dtype == TD_FLOAT16 || dtype == TD_BFLOAT16;
    if (ut >= 0 && (half || kind == TD_MIN || kind == TD_MAX)) {
        for (int uk = 0; uk < UOP_KINDS; uk++) {
            if (uop_kind[uk] == kind) {
                *out = g_uops[uk][ut];
                return true;
            }
        }
        return false;
    }
    if (dtype == TD_BOOL) {
        switch (kind) {
        case TD_SUM:
        case TD_MAX:
        case TD_BOR: *out = MPI_LOR; return true;
        case TD_PRODUCT:
        case TD_MIN:
        case TD_BAND: *out = MPI_LAND; return true;
        case TD_BXOR: *out = MPI_LXOR; return true;
        default: return false;
        }
    }
    switch (kind) {
    case TD_SUM: *out = MPI_SUM; return true;
    case TD_PRODUCT: *out = MPI_PROD; return true;
    case TD_MIN: *out = MPI_MIN; return true;
    case TD_MAX: *out = MPI_MAX; return true;
    case TD_BAND: *out = MPI_BAND; return true;
    case TD_BOR: *out = MPI_BOR; return true;
    case TD_BXOR: *out = MPI_BXOR; return true;
    default: return false;
    }
}
