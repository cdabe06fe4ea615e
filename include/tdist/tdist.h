/* tdist/tdist.h: the whole public API of tdist in one include.
 *
 * tdist is torch.distributed's runtime as a C library: process groups and collectives over a
 * key-value store rendezvous (pg.h, store.h), futures (future.h), tensors and values (tensor.h,
 * value.h), shared-memory tensors, queues and processes (mp.h), RPC (rpc.h, rref.h, profiler.h) and
 * the multi-device runtime (device.h: devices, streams, events, the caching allocator, comm
 * primitives). The test
 * harness (testing.h)
 * and the interface for writing backends (backend.h) are included separately. */
#ifndef TDIST_TDIST_H
#define TDIST_TDIST_H

#include <tdist/autograd.h>
#include <tdist/ddp.h>
#include <tdist/device.h>
#include <tdist/dist_autograd.h>
#include <tdist/dist_optim.h>
#include <tdist/future.h>
#include <tdist/mp.h>
#include <tdist/pg.h>
#include <tdist/profiler.h>
#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/status.h>
#include <tdist/store.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#endif
