/*
 * A CUDA driver API client for the interposer's charging tests: each command
 * makes the driver consume device memory one way (VMM mappings, pools,
 * arrays, graphs, contexts) and prints what cuMemGetInfo_v2 and the fake
 * GPU (tesseraFakeStats) say at each step.
 *
 * Built three ways, like probe.c, which differ only in how the driver's
 * functions are found:
 *   -DLOADER_LINKED    linked against libcuda.so.1 (symbol interposition);
 *   -DLOADER_DLSYM     dlopen("libcuda.so.1") + dlsym of each versioned name;
 *   -DLOADER_PROCADDR  dlopen + dlsym("cuGetProcAddress_v2") only, then every
 *                      function by base name and CUDA version, as cudart does.
 *
 * Output is "key=value" lines: <step>_free and <step>_total from
 * cuMemGetInfo_v2, <step>_phys the fake GPU's physical usage; exit 1 on an
 * unexpected failure. Commands:
 *   vmm <bytes> <probe_bytes>     cuMemCreate, map, release (the mapping keeps it), retain
 *                                 the handle through the address, try cuMemCreate(probe_bytes),
 *                                 release the retained handle, unmap
 *   pool <which> <bytes> <max> <threshold>
 *                                 a pool (which: default, default_ptsz: the device's default pool
 *                                 through cuMemAllocAsync; created, created_ptsz: cuMemPoolCreate and
 *                                 cuMemAllocFromPoolAsync) with a release threshold: allocate until
 *                                 failure (full), free everything (freed), synchronise (synced),
 *                                 count plain cuMemAlloc_v2s that fit (plain_allocated), allocate from
 *                                 the pool again (again), free, synchronise and trim (trimmed); a
 *                                 created pool is then destroyed with a live allocation
 *                                 (destroyed_live) which is freed last (destroyed)
 *   array <kind> <width> <height> <depth> <format> <channels> <levels> <flags> <max>
 *                                 create arrays until failure or <max> (kind: 2d: cuArrayCreate_v2,
 *                                 depth and flags unused; 3d: cuArray3DCreate_v2; mipmap:
 *                                 cuMipmappedArrayCreate with <levels>) (full), destroy them (destroyed)
 *   graph <a> <b> <c>             graph memory: instantiate a graph allocating <a> bytes (inst1),
 *                                 launch it (launched1), instantiate one of <b> with params (inst2)
 *                                 and launch it, instantiate a captured cuMemAllocAsync of <c> with
 *                                 cuGraphInstantiate_v2 (inst3), destroy the first executable
 *                                 (destroyed1), instantiate its graph again (inst4) and destroy it,
 *                                 cuDeviceGraphMemTrim (trimmed), destroy everything and trim (end)
 *   context                       contexts: retain the primary context from a thread without one
 *                                 (primary; primary_rc and refused_phys if refused), cuCtxCreate_v2
 *                                 (created), retain and release the primary again (retained_twice,
 *                                 released_once), count 2 MiB cuMemAlloc_v2s that fit (filled),
 *                                 cuCtxCreate_v3 (v3) and _v4 (v4), destroy them (destroyed_v4,
 *                                 destroyed_v3), the last primary release (released)
 *   ctxhold                       retain the primary context, print ready=1, wait to be killed
 *   race <kinds> <rounds> <bytes> one thread per letter of <kinds>, each allocating and freeing
 *                                 <bytes> <rounds> times one way: p cuMemAlloc_v2, a cuMemAllocAsync,
 *                                 o cuMemAllocFromPoolAsync, x cuArrayCreate_v2 (1024 bytes wide),
 *                                 v cuMemCreate; starts when the file $PROBE_START exists, if set;
 *                                 prints ok, oom and other (unexpected results)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes;
    struct {
        int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
        int id;
    } location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef void *CUmemoryPool;
typedef struct {
    int allocType; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int handleTypes;
    struct {
        int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
        int id;
    } location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
    size_t Width, Height;
    int Format;
    unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
    unsigned long long flags;
    void *hUploadStream;
    void *hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

#define MIB (1ull << 20)
#define CUDA_ERROR_OUT_OF_MEMORY 2
/* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: the _ptsz variant. */
#define PER_THREAD 2
/* Not a driver flag: look the name up for this CUDA version (as cudart asks for a PFN_<name>_v<version>). */
#define AT(version) ((uint64_t)(version) << 32)
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5

/*
 * Every driver function used: X(name, parameters, base name for
 * cuGetProcAddress, its flags). The name is the versioned symbol.
 */
#define DRIVER(X)                                                                                        \
    X(cuInit, (unsigned), "cuInit", 0)                                                                   \
    X(cuDeviceGet, (CUdevice *, int), "cuDeviceGet", 0)                                                  \
    X(cuCtxCreate_v2, (CUcontext *, unsigned, CUdevice), "cuCtxCreate", AT(3020))                        \
    X(cuCtxCreate_v3, (CUcontext *, void *, int, unsigned, CUdevice), "cuCtxCreate", AT(11040))          \
    X(cuCtxCreate_v4, (CUcontext *, void *, unsigned, CUdevice), "cuCtxCreate", 0)                       \
    X(cuCtxDestroy_v2, (CUcontext), "cuCtxDestroy", 0)                                                   \
    X(cuCtxSetCurrent, (CUcontext), "cuCtxSetCurrent", 0)                                                \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain", 0)                  \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice), "cuDevicePrimaryCtxRelease", 0)                          \
    X(cuMemGetInfo_v2, (size_t *, size_t *), "cuMemGetInfo", 0)                                          \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long), \
      "cuMemCreate", 0)                                                                                  \
    X(cuMemRelease, (CUmemGenericAllocationHandle), "cuMemRelease", 0)                                   \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long),            \
      "cuMemAddressReserve", 0)                                                                          \
    X(cuMemAddressFree, (CUdeviceptr, size_t), "cuMemAddressFree", 0)                                    \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long), "cuMemMap", 0) \
    X(cuMemUnmap, (CUdeviceptr, size_t), "cuMemUnmap", 0)                                                \
    X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *), "cuMemRetainAllocationHandle", 0) \
    X(cuCtxSynchronize, (void), "cuCtxSynchronize", 0)                                                   \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t), "cuMemAlloc", 0)                                           \
    X(cuMemFree_v2, (CUdeviceptr), "cuMemFree", 0)                                                       \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, void *), "cuMemAllocAsync", 0)                            \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, void *), "cuMemAllocAsync", PER_THREAD)              \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, void *), "cuMemAllocFromPoolAsync", 0) \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, void *), "cuMemAllocFromPoolAsync", \
      PER_THREAD)                                                                                        \
    X(cuMemFreeAsync, (CUdeviceptr, void *), "cuMemFreeAsync", 0)                                        \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, void *), "cuMemFreeAsync", PER_THREAD)                          \
    X(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *), "cuMemPoolCreate", 0)                   \
    X(cuMemPoolDestroy, (CUmemoryPool), "cuMemPoolDestroy", 0)                                           \
    X(cuMemPoolTrimTo, (CUmemoryPool, size_t), "cuMemPoolTrimTo", 0)                                     \
    X(cuMemPoolSetAttribute, (CUmemoryPool, int, void *), "cuMemPoolSetAttribute", 0)                    \
    X(cuMemPoolGetAttribute, (CUmemoryPool, int, void *), "cuMemPoolGetAttribute", 0)                    \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice), "cuDeviceGetDefaultMemPool", 0)          \
    X(cuArrayCreate_v2, (void **, const CUDA_ARRAY_DESCRIPTOR *), "cuArrayCreate", 0)                    \
    X(cuArray3DCreate_v2, (void **, const CUDA_ARRAY3D_DESCRIPTOR *), "cuArray3DCreate", 0)              \
    X(cuMipmappedArrayCreate, (void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned), "cuMipmappedArrayCreate", 0) \
    X(cuArrayDestroy, (void *), "cuArrayDestroy", 0)                                                     \
    X(cuMipmappedArrayDestroy, (void *), "cuMipmappedArrayDestroy", 0)                                   \
    X(cuStreamCreate, (void **, unsigned), "cuStreamCreate", 0)                                         \
    X(cuStreamSynchronize, (void *), "cuStreamSynchronize", 0)                                          \
    X(cuStreamBeginCapture_v2, (void *, int), "cuStreamBeginCapture", 0)                                \
    X(cuStreamEndCapture, (void *, void **), "cuStreamEndCapture", 0)                                   \
    X(cuGraphCreate, (void **, unsigned), "cuGraphCreate", 0)                                           \
    X(cuGraphAddMemAllocNode, (void **, void *, void **, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *),          \
      "cuGraphAddMemAllocNode", 0)                                                                       \
    X(cuGraphAddMemFreeNode, (void **, void *, void **, size_t, CUdeviceptr), "cuGraphAddMemFreeNode", 0) \
    X(cuGraphInstantiateWithFlags, (void **, void *, unsigned long long), "cuGraphInstantiateWithFlags", 0) \
    X(cuGraphInstantiateWithParams, (void **, void *, CUDA_GRAPH_INSTANTIATE_PARAMS *),                  \
      "cuGraphInstantiateWithParams", 0)                                                                 \
    X(cuGraphInstantiate_v2, (void **, void *, void **, char *, size_t), "cuGraphInstantiate", AT(11080)) \
    X(cuGraphLaunch, (void *, void *), "cuGraphLaunch", 0)                                              \
    X(cuGraphExecDestroy, (void *), "cuGraphExecDestroy", 0)                                            \
    X(cuGraphDestroy, (void *), "cuGraphDestroy", 0)                                                    \
    X(cuDeviceGraphMemTrim, (CUdevice), "cuDeviceGraphMemTrim", 0)

static struct {
#define FIELD(name, params, base, flags) CUresult(*name) params;
    DRIVER(FIELD)
#undef FIELD
    CUresult (*stats)(CUdevice, unsigned long long *, unsigned long long *);
} cu;

static void die(const char *what, CUresult rc) {
    printf("FAIL %s rc=%d\n", what, rc);
    exit(1);
}

static __attribute__((unused)) void *need(void *p, const char *name) {
    if (!p) {
        printf("FAIL resolve %s\n", name);
        exit(1);
    }
    return p;
}

#if defined(LOADER_LINKED)
#define DECLARE(name, params, base, flags) CUresult name params;
DRIVER(DECLARE)
#undef DECLARE
CUresult tesseraFakeStats(CUdevice, unsigned long long *, unsigned long long *);

static void load(void) {
#define ASSIGN(name, params, base, flags) cu.name = name;
    DRIVER(ASSIGN)
#undef ASSIGN
    cu.stats = tesseraFakeStats;
}
#elif defined(LOADER_DLSYM)
static void load(void) {
    void *driver = need(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
#define ASSIGN(name, params, base, flags) cu.name = need(dlsym(driver, #name), #name);
    DRIVER(ASSIGN)
#undef ASSIGN
    cu.stats = need(dlsym(driver, "tesseraFakeStats"), "tesseraFakeStats");
}
#elif defined(LOADER_PROCADDR)
static CUresult (*get_proc_address)(const char *, void **, int, uint64_t, int *);

static void *lookup(const char *base, uint64_t flags) {
    void *p = NULL;
    int status = -1;
    int version = flags >> 32 ? (int)(flags >> 32) : 12090;
    CUresult rc = get_proc_address(base, &p, version, flags & 0xffffffffu, &status);
    if (rc != 0 || status != 0) die(base, rc);
    return need(p, base);
}

static void load(void) {
    void *driver = need(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
    get_proc_address = need(dlsym(driver, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
    /* The runtime re-resolves the lookup function itself through it. */
    get_proc_address = lookup("cuGetProcAddress", 0);
#define ASSIGN(name, params, base, flags) cu.name = lookup(base, flags);
    DRIVER(ASSIGN)
#undef ASSIGN
    cu.stats = need(dlsym(driver, "tesseraFakeStats"), "tesseraFakeStats");
}
#else
#error "define LOADER_LINKED, LOADER_DLSYM or LOADER_PROCADDR"
#endif

#define CHECK(call)                      \
    do {                                 \
        CUresult rc_ = cu.call;          \
        if (rc_) die(#call, rc_);        \
    } while (0)

static CUcontext context(int dev) {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, dev));
    CUcontext ctx;
    CHECK(cuCtxCreate_v2(&ctx, 0, d));
    return ctx;
}

/* What the current context's device looks like after <step>. */
static void info(const char *step) {
    size_t free_b = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free_b, &total));
    unsigned long long used = 0, peak = 0;
    CHECK(stats(0, &used, &peak));
    printf("%s_free=%zu\n%s_total=%zu\n%s_phys=%llu\n", step, free_b, step, total, step, used);
}

static int cmd_vmm(size_t bytes, size_t probe) {
    context(0);
    CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = 0}};
    CUmemGenericAllocationHandle handle, retained, other;
    CHECK(cuMemCreate(&handle, bytes, &prop, 0));
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CHECK(cuMemMap(va, bytes, 0, handle, 0));
    /* The usual idiom: the mapping keeps the memory, the handle can go. */
    CHECK(cuMemRelease(handle));
    info("mapped");
    CHECK(cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)(va + 4096)));
    printf("same_handle=%d\n", retained == handle);
    CUresult rc = cu.cuMemCreate(&other, probe, &prop, 0);
    printf("probe_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemRelease(other));
    CHECK(cuMemRelease(retained));
    info("retained_released");
    CHECK(cuMemUnmap(va, bytes));
    info("unmapped");
    CHECK(cuMemAddressFree(va, bytes));
    return 0;
}

/* The pool under test and how to allocate from it and free to it. */
static struct {
    CUmemoryPool pool;
    int created, per_thread;
} pool;

static CUresult pool_alloc(CUdeviceptr *p, size_t bytes) {
    if (pool.created)
        return pool.per_thread ? cu.cuMemAllocFromPoolAsync_ptsz(p, bytes, pool.pool, NULL)
                               : cu.cuMemAllocFromPoolAsync(p, bytes, pool.pool, NULL);
    return pool.per_thread ? cu.cuMemAllocAsync_ptsz(p, bytes, NULL) : cu.cuMemAllocAsync(p, bytes, NULL);
}

static void pool_free(CUdeviceptr p) {
    CUresult rc = pool.per_thread ? cu.cuMemFreeAsync_ptsz(p, NULL) : cu.cuMemFreeAsync(p, NULL);
    if (rc) die("cuMemFreeAsync", rc);
}

/* Allocates <bytes> until failure or <max>; returns the count, sets *last. */
static long fill(CUdeviceptr *ptrs, long max, size_t bytes, int plain, CUresult *last) {
    long n = 0;
    for (; n < max; n++) {
        *last = plain ? cu.cuMemAlloc_v2(&ptrs[n], bytes) : pool_alloc(&ptrs[n], bytes);
        if (*last) break;
    }
    return n;
}

static int cmd_pool(const char *which, size_t bytes, long max, unsigned long long threshold) {
    context(0);
    pool.created = !strncmp(which, "created", 7);
    pool.per_thread = strstr(which, "_ptsz") != NULL;
    if (pool.created) {
        CUmemPoolProps props = {.allocType = 1, .location = {.type = 1, .id = 0}};
        CHECK(cuMemPoolCreate(&pool.pool, &props));
    } else {
        CHECK(cuDeviceGetDefaultMemPool(&pool.pool, 0));
    }
    CHECK(cuMemPoolSetAttribute(pool.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CUdeviceptr *ptrs = calloc((size_t)max, sizeof *ptrs);
    CUresult last = 0;
    long n = fill(ptrs, max, bytes, 0, &last);
    unsigned long long reserved = 0;
    CHECK(cuMemPoolGetAttribute(pool.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    printf("allocated=%ld\nlast_rc=%d\nfull_reserved=%llu\n", n, last, reserved);
    info("full");
    for (long i = 0; i < n; i++) pool_free(ptrs[i]);
    /* Freed, but the pool gives memory back only when synchronised. */
    info("freed");
    CHECK(cuCtxSynchronize());
    info("synced");
    /* What plain allocations get now. */
    n = fill(ptrs, max, bytes, 1, &last);
    printf("plain_allocated=%ld\n", n);
    for (long i = 0; i < n; i++) CHECK(cuMemFree_v2(ptrs[i]));
    n = fill(ptrs, max, bytes, 0, &last);
    printf("again=%ld\nagain_rc=%d\n", n, last);
    for (long i = 0; i < n; i++) pool_free(ptrs[i]);
    CHECK(cuCtxSynchronize());
    CHECK(cuMemPoolTrimTo(pool.pool, 0));
    info("trimmed");
    if (pool.created) {
        /* Destroyed with a live allocation: the pool goes with it. */
        CHECK(cuMemPoolSetAttribute(pool.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
        n = fill(ptrs, 2, bytes, 0, &last);
        if (n != 2) die("pool_alloc", last);
        pool_free(ptrs[1]);
        CHECK(cuMemPoolDestroy(pool.pool));
        info("destroyed_live");
        pool_free(ptrs[0]);
        info("destroyed");
    }
    return 0;
}

static int cmd_array(const char *kind, size_t w, size_t h, size_t d, int format, unsigned channels,
                     unsigned levels, unsigned flags, long max) {
    context(0);
    void **arrays = calloc((size_t)max, sizeof *arrays);
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = w, .Height = h, .Format = format, .NumChannels = channels};
    CUDA_ARRAY3D_DESCRIPTOR d3 = {
        .Width = w, .Height = h, .Depth = d, .Format = format, .NumChannels = channels, .Flags = flags};
    int mipmap = !strcmp(kind, "mipmap");
    long n = 0;
    CUresult last = 0;
    for (; n < max; n++) {
        if (!strcmp(kind, "2d")) last = cu.cuArrayCreate_v2(&arrays[n], &d2);
        else if (!strcmp(kind, "3d")) last = cu.cuArray3DCreate_v2(&arrays[n], &d3);
        else if (mipmap) last = cu.cuMipmappedArrayCreate(&arrays[n], &d3, levels);
        else die("unknown kind", -1);
        if (last) break;
    }
    printf("allocated=%ld\nlast_rc=%d\n", n, last);
    info("full");
    for (long i = 0; i < n; i++) {
        if (mipmap) CHECK(cuMipmappedArrayDestroy(arrays[i]));
        else CHECK(cuArrayDestroy(arrays[i]));
    }
    info("destroyed");
    return 0;
}

/* A graph with one allocation of <bytes> on device 0 and its free. */
static void *graph_with(size_t bytes) {
    void *graph, *alloc, *free_node;
    CHECK(cuGraphCreate(&graph, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS params = {.poolProps = {.allocType = 1, .location = {.type = 1, .id = 0}},
                                         .bytesize = bytes};
    CHECK(cuGraphAddMemAllocNode(&alloc, graph, NULL, 0, &params));
    CHECK(cuGraphAddMemFreeNode(&free_node, graph, &alloc, 1, params.dptr));
    return graph;
}

static int cmd_graph(size_t a, size_t b, size_t c) {
    context(0);
    void *stream, *e1 = NULL, *e2 = NULL, *e3 = NULL, *e4 = NULL;
    CHECK(cuStreamCreate(&stream, 0));
    void *g1 = graph_with(a);
    CUresult rc = cu.cuGraphInstantiateWithFlags(&e1, g1, 0);
    printf("inst1_rc=%d\n", rc);
    info("inst1");
    if (!rc) {
        CHECK(cuGraphLaunch(e1, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    info("launched1");
    void *g2 = graph_with(b);
    CUDA_GRAPH_INSTANTIATE_PARAMS params = {0};
    rc = cu.cuGraphInstantiateWithParams(&e2, g2, &params);
    printf("inst2_rc=%d\n", rc);
    info("inst2");
    if (!rc) {
        CHECK(cuGraphLaunch(e2, stream));
        CHECK(cuStreamSynchronize(stream));
    } else {
        e2 = NULL;
    }
    /* A captured allocation is a graph allocation too. */
    void *g3;
    CUdeviceptr p;
    CHECK(cuStreamBeginCapture_v2(stream, 0));
    CHECK(cuMemAllocAsync(&p, c, stream));
    CHECK(cuMemFreeAsync(p, stream));
    CHECK(cuStreamEndCapture(stream, &g3));
    rc = cu.cuGraphInstantiate_v2(&e3, g3, NULL, NULL, 0);
    printf("inst3_rc=%d\n", rc);
    info("inst3");
    if (rc) e3 = NULL;
    /* Destroyed: its memory stays in the device's graph memory. */
    if (e1) CHECK(cuGraphExecDestroy(e1));
    info("destroyed1");
    rc = cu.cuGraphInstantiateWithFlags(&e4, g1, 0);
    printf("inst4_rc=%d\n", rc);
    info("inst4");
    if (!rc) CHECK(cuGraphExecDestroy(e4));
    CHECK(cuDeviceGraphMemTrim(0));
    info("trimmed");
    if (e2) CHECK(cuGraphExecDestroy(e2));
    if (e3) CHECK(cuGraphExecDestroy(e3));
    CHECK(cuGraphDestroy(g1));
    CHECK(cuGraphDestroy(g2));
    CHECK(cuGraphDestroy(g3));
    CHECK(cuDeviceGraphMemTrim(0));
    info("end");
    return 0;
}

static int cmd_context(void) {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, 0));
    /* The first context of the process, from a thread without one. */
    CUcontext primary, again, c1, c3, c4;
    CUresult rc = cu.cuDevicePrimaryCtxRetain(&primary, d);
    printf("primary_rc=%d\n", rc);
    if (rc) {
        unsigned long long used = 0, peak = 0;
        CHECK(stats(0, &used, &peak));
        printf("refused_phys=%llu\n", used);
        return 0;
    }
    CHECK(cuCtxSetCurrent(primary));
    info("primary");
    CHECK(cuCtxCreate_v2(&c1, 0, d));
    info("created");
    CHECK(cuDevicePrimaryCtxRetain(&again, d));
    printf("same_primary=%d\n", again == primary);
    info("retained_twice");
    CHECK(cuDevicePrimaryCtxRelease_v2(d));
    info("released_once");
    CUdeviceptr ptrs[64];
    long n = 0;
    while (n < 64 && cu.cuMemAlloc_v2(&ptrs[n], 2 * MIB) == 0) n++;
    printf("filled=%ld\n", n);
    while (n > 0) CHECK(cuMemFree_v2(ptrs[--n]));
    CHECK(cuCtxCreate_v3(&c3, NULL, 0, 0, d));
    info("v3");
    CHECK(cuCtxCreate_v4(&c4, NULL, 0, d));
    info("v4");
    CHECK(cuCtxSetCurrent(c1));
    CHECK(cuCtxDestroy_v2(c4));
    info("destroyed_v4");
    CHECK(cuCtxDestroy_v2(c3));
    info("destroyed_v3");
    /* The last release destroys the primary context. */
    CHECK(cuDevicePrimaryCtxRelease_v2(d));
    info("released");
    CHECK(cuCtxDestroy_v2(c1));
    return 0;
}

/* Holds a primary context until killed. */
static _Noreturn void cmd_ctxhold(void) {
    CHECK(cuInit(0));
    CUdevice d;
    CHECK(cuDeviceGet(&d, 0));
    CUcontext primary;
    CHECK(cuDevicePrimaryCtxRetain(&primary, d));
    printf("ready=1\n");
    fflush(stdout);
    for (;;) pause();
}

/* One racing thread: allocates and frees <bytes> one way, <rounds> times. */
struct racer {
    CUcontext ctx;
    char kind;
    long rounds;
    size_t bytes;
    long ok, oom, other;
};

static pthread_barrier_t racers;
static CUmemoryPool race_pool;

static CUresult race_alloc(char kind, size_t bytes, void **handle) {
    CUdeviceptr *p = (CUdeviceptr *)handle;
    switch (kind) {
    case 'p': return cu.cuMemAlloc_v2(p, bytes);
    case 'a': return cu.cuMemAllocAsync(p, bytes, NULL);
    case 'o': return cu.cuMemAllocFromPoolAsync(p, bytes, race_pool, NULL);
    case 'x': {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = bytes / 1024, .Format = 0x01, .NumChannels = 1};
        return cu.cuArrayCreate_v2(handle, &d);
    }
    case 'v': {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = 0}};
        return cu.cuMemCreate((CUmemGenericAllocationHandle *)handle, bytes, &prop, 0);
    }
    }
    die("unknown kind", -1);
    return -1;
}

static CUresult race_free(char kind, void *handle) {
    switch (kind) {
    case 'p': return cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)handle);
    case 'a':
    case 'o': return cu.cuMemFreeAsync((CUdeviceptr)(uintptr_t)handle, NULL);
    case 'x': return cu.cuArrayDestroy(handle);
    case 'v': return cu.cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)handle);
    }
    return -1;
}

static void *race(void *arg) {
    struct racer *r = arg;
    cu.cuCtxSetCurrent(r->ctx);
    pthread_barrier_wait(&racers);
    for (long i = 0; i < r->rounds; i++) {
        void *handle = NULL;
        CUresult rc = race_alloc(r->kind, r->bytes, &handle);
        if (rc == 0) {
            r->ok++;
            /* Hold it a moment, so that the threads' allocations overlap. */
            for (int y = 0; y < 4; y++) sched_yield();
            if (race_free(r->kind, handle)) r->other++;
            /* Now and then, let the default pool give back what it kept. */
            if (r->kind == 'a' && i % 64 == 0) cu.cuStreamSynchronize(NULL);
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            r->oom++;
        } else {
            r->other++;
        }
    }
    return NULL;
}

static int cmd_race(const char *kinds, long rounds, size_t bytes) {
    CUcontext ctx = context(0);
    CUmemPoolProps props = {.allocType = 1, .location = {.type = 1, .id = 0}};
    CHECK(cuMemPoolCreate(&race_pool, &props));
    const char *start_file = getenv("PROBE_START");
    while (start_file && access(start_file, F_OK) != 0) usleep(1000);
    int threads = (int)strlen(kinds);
    struct racer *rs = calloc((size_t)threads, sizeof *rs);
    pthread_t *ts = calloc((size_t)threads, sizeof *ts);
    pthread_barrier_init(&racers, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        rs[i] = (struct racer){.ctx = ctx, .kind = kinds[i], .rounds = rounds, .bytes = bytes};
        pthread_create(&ts[i], NULL, race, &rs[i]);
    }
    long ok = 0, oom = 0, other = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ts[i], NULL);
        ok += rs[i].ok;
        oom += rs[i].oom;
        other += rs[i].other;
    }
    /* The pools give back what they kept. */
    CHECK(cuCtxSynchronize());
    CHECK(cuMemPoolDestroy(race_pool));
    printf("ok=%ld\noom=%ld\nother=%ld\n", ok, oom, other);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage", -1);
    load();
    const char *c = argv[1];
    if (!strcmp(c, "vmm") && argc == 4) return cmd_vmm(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
    if (!strcmp(c, "array") && argc == 11)
        return cmd_array(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0),
                         (int)strtol(argv[6], NULL, 0), (unsigned)atoi(argv[7]), (unsigned)atoi(argv[8]),
                         (unsigned)strtoul(argv[9], NULL, 0), atol(argv[10]));
    if (!strcmp(c, "graph") && argc == 5)
        return cmd_graph(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
    if (!strcmp(c, "context") && argc == 2) return cmd_context();
    if (!strcmp(c, "ctxhold") && argc == 2) cmd_ctxhold();
    if (!strcmp(c, "race") && argc == 5) return cmd_race(argv[2], atol(argv[3]), strtoull(argv[4], NULL, 0));
    if (!strcmp(c, "pool") && argc == 6)
        return cmd_pool(argv[2], strtoull(argv[3], NULL, 0), atol(argv[4]), strtoull(argv[5], NULL, 0));
    die("usage", -1);
    return 1;
}
