/* Large buffers on transparent huge pages (hugealloc.h): used for the collective layer's scratch,
 * and meant for anything large that other processes read or the reduce kernels stream through. */
#include "base/hugealloc.h"

#include <sys/mman.h>

#include "base/alloc.h"
#include "base/error.h"

td_status huge_try_alloc(size_t size, const char *what, void **out)
{
    if (size < TD_HUGE_PAGE)
        return alloc_try_aligned(64, size ? size : 64, what, out);
    size_t rounded = (size + TD_HUGE_PAGE - 1) & ~(TD_HUGE_PAGE - 1);
    TD_TRY(alloc_try_aligned(TD_HUGE_PAGE, rounded, what, out));
    /* Advice only: where huge pages are off or unavailable, the buffer works the same. */
    madvise(*out, rounded, MADV_HUGEPAGE);
    return TD_OK;
}
