/*
 * A CUDA driver API client for the interposer's LD_PRELOAD tests.
 *
 * Built three ways, which differ only in how the driver's functions are found
 * (the two dlopen variants also run against a real driver, e.g. on a GPU machine):
 *   -DLOADER_LINKED    linked against libcuda.so.1 (symbol interposition);
 *   -DLOADER_DLSYM     dlopen("libcuda.so.1") + dlsym of each versioned name;
 *   -DLOADER_PROCADDR  dlopen + dlsym("cuGetProcAddress_v2") only, then every
 *                      function by base name and CUDA version, as cudart does.
 *
 * Commands (output is "key=value" lines; exit 1 on an unexpected failure):
 *   init                            cuInit's result
 *   alloc <api> <bytes> <max>       allocate until failure or <max> (api: plain, managed),
 *                                   then free everything
 *   pitch <width> <height> <max>    the same with cuMemAllocPitch_v2 (element size 4)
 *   vmm <dev> <bytes> <max>         the same with cuMemCreate on device <dev>, from a
 *                                   thread without a current context
 *   meminfo <dev>                   cuMemGetInfo_v2 and cuDeviceTotalMem_v2
 *   hold <bytes>                    allocate, print ready=1, wait to be killed
 *   race <threads> <rounds> <bytes> <hold_us>
 *                                   allocate, hold, free in a loop from several threads;
 *                                   starts when the file $PROBE_START exists, if set
 *   fork <parent_bytes> <child_bytes>
 *                                   hold parent_bytes, fork a child that allocates
 *                                   child_bytes and exits without freeing, then allocate
 *                                   1 MiB chunks until failure
 *   async <bytes> <max> <per_thread>
 *                                   the same with cuMemAllocAsync/cuMemFreeAsync, or their
 *                                   _ptsz variants when per_thread is 1 (cuGetProcAddress
 *                                   loaders ask with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
 *                                   then synchronise the (per-thread) default stream
 *   bench <threads> <rounds> <bytes>
 *                                   time cuMemAlloc_v2 + cuMemFree_v2 pairs: p50/p99/mean ns
 *   stats <dev>                     the fake driver's physical usage and peak
 *   nvml <index>                    NVML memory info (v1 and v2), without touching CUDA;
 *                                   NVML is linked, or dlopen'ed by the dlsym loaders
 *   procs <index>                   NVML UUID, compute processes (v1, _v2, _v3: the size query with
 *                                   no buffer, then v<n>_pid_<i> and v<n>_used_<i>) and the
 *                                   processes with utilisation samples, without touching CUDA
 *   watch <index> <seconds>         every second, each process's NVML utilisation of the device over
 *                                   that second (watch_<i>_<pid>=<percent>), without launching
 *   lookup <name> <version>         cuGetProcAddress_v2's result and status
 *   launch <path> <seconds> <blocks>
 *                                   launch <blocks>-block grids for <seconds> through one path
 *                                   (kernel, ex, coop, graph, each also with _ptsz), synchronising
 *                                   the stream every 8 launches; print the NVML utilisation of
 *                                   each window ending at 1 s, 2 s, ... after the start (as
 *                                   soon after as a launch returns; window_<i>=<percent>), this
 *                                   process's own NVML utilisation in each window (own_<i>), how
 *                                   late a watchdog thread that sleeps 2 ms at a time woke at worst
 *                                   in each window (stall_<i>=<ms>: the host kept the process from
 *                                   running, which no limiter did) and the launch count.
 *                                   The plain paths use the legacy default stream, the _ptsz ones
 *                                   the per-thread default stream, graphs a created stream
 *                                   (a graph captures 4 launches of blocks/4 each); on device
 *                                   $PROBE_DEVICE (CUDA ordinal and NVML index, default 0)
 *   launchbench <threads> <rounds>  time cuLaunchKernel of one block, in batches of 10 (the clock
 *                                   may tick in 10 ns steps): p50/p99/mean ns per launch of <rounds>
 *                                   batches per thread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

#define CUDA_ERROR_OUT_OF_MEMORY 2

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                              void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, void *, void **, void **);
typedef CUresult (*coop_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                            void **);
typedef CUresult (*graph_fn)(void *, void *);
typedef CUresult (*sync_fn)(void *);

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;
typedef nvmlReturn_t (*nvml_procs_fn)(nvmlDevice_t, unsigned *, void *);

static struct {
    nvmlReturn_t (*nvmlInit_v2)(void);
    nvmlReturn_t (*nvmlDeviceGetHandleByIndex_v2)(unsigned, nvmlDevice_t *);
    nvmlReturn_t (*nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*nvmlDeviceGetUtilizationRates)(nvmlDevice_t, unsigned *);
    nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned);
    nvmlReturn_t (*nvmlDeviceGetProcessUtilization)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *,
                                                    unsigned long long);
    /* nvmlDeviceGetComputeRunningProcesses (v1 entries), _v2 and _v3 (nvmlProcessInfo_t). */
    nvml_procs_fn procs[3];
} nvml;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceTotalMem_v2)(size_t *, CUdevice);
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
    CUresult (*cuGetProcAddress_v2)(const char *, void **, int, uint64_t, int *);
    CUresult (*stats)(CUdevice, unsigned long long *, unsigned long long *);
    unsigned long long (*per_thread_calls)(void);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
    /* Execution; index 1 is the _ptsz variant. */
    launch_fn launch[2];
    launch_ex_fn launch_ex[2];
    coop_fn coop[2];
    graph_fn graph_launch[2];
    sync_fn stream_sync[2];
    CUresult (*cuStreamCreate)(void **, unsigned);
    CUresult (*cuStreamBeginCapture_v2)(void *, int);
    CUresult (*cuStreamEndCapture)(void *, void **);
    CUresult (*cuGraphInstantiateWithFlags)(void **, void *, unsigned long long);
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
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
CUresult tesseraFakeStats(CUdevice, unsigned long long *, unsigned long long *);
unsigned long long tesseraFakePerThreadCalls(void);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, void *);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, void *);

static void load_async(int per_thread) {
    cu.cuMemAllocAsync = per_thread ? cuMemAllocAsync_ptsz : cuMemAllocAsync;
    cu.cuMemFreeAsync = per_thread ? cuMemFreeAsync_ptsz : cuMemFreeAsync;
}

CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                        void **);
CUresult cuLaunchKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                             void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, void *, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, void *, void **, void **);
CUresult cuLaunchCooperativeKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   void *, void **);
CUresult cuLaunchCooperativeKernel_ptsz(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, void *, void **);
CUresult cuGraphLaunch(void *, void *);
CUresult cuGraphLaunch_ptsz(void *, void *);
CUresult cuStreamSynchronize(void *);
CUresult cuStreamSynchronize_ptsz(void *);
CUresult cuStreamCreate(void **, unsigned);
CUresult cuStreamBeginCapture_v2(void *, int);
CUresult cuStreamEndCapture(void *, void **);
CUresult cuGraphInstantiateWithFlags(void **, void *, unsigned long long);

static void load_exec(void) {
    cu.launch[0] = cuLaunchKernel;
    cu.launch[1] = cuLaunchKernel_ptsz;
    cu.launch_ex[0] = cuLaunchKernelEx;
    cu.launch_ex[1] = cuLaunchKernelEx_ptsz;
    cu.coop[0] = cuLaunchCooperativeKernel;
    cu.coop[1] = cuLaunchCooperativeKernel_ptsz;
    cu.graph_launch[0] = cuGraphLaunch;
    cu.graph_launch[1] = cuGraphLaunch_ptsz;
    cu.stream_sync[0] = cuStreamSynchronize;
    cu.stream_sync[1] = cuStreamSynchronize_ptsz;
    cu.cuStreamCreate = cuStreamCreate;
    cu.cuStreamBeginCapture_v2 = cuStreamBeginCapture_v2;
    cu.cuStreamEndCapture = cuStreamEndCapture;
    cu.cuGraphInstantiateWithFlags = cuGraphInstantiateWithFlags;
}

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t, unsigned *);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned);
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *,
                                             unsigned long long);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);

static void load_nvml(void) {
    nvml.nvmlDeviceGetUtilizationRates = nvmlDeviceGetUtilizationRates;
    nvml.nvmlDeviceGetUUID = nvmlDeviceGetUUID;
    nvml.nvmlDeviceGetProcessUtilization = nvmlDeviceGetProcessUtilization;
    nvml.procs[0] = (nvml_procs_fn)nvmlDeviceGetComputeRunningProcesses;
    nvml.procs[1] = (nvml_procs_fn)nvmlDeviceGetComputeRunningProcesses_v2;
    nvml.procs[2] = (nvml_procs_fn)nvmlDeviceGetComputeRunningProcesses_v3;
    nvml.nvmlInit_v2 = nvmlInit_v2;
    nvml.nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex_v2;
    nvml.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo;
    nvml.nvmlDeviceGetMemoryInfo_v2 = nvmlDeviceGetMemoryInfo_v2;
}

static void load(void) {
    cu.cuInit = cuInit;
    cu.cuDeviceGet = cuDeviceGet;
    cu.cuDeviceTotalMem_v2 = cuDeviceTotalMem_v2;
    cu.cuCtxCreate_v2 = cuCtxCreate_v2;
    cu.cuCtxSetCurrent = cuCtxSetCurrent;
    cu.cuMemAlloc_v2 = cuMemAlloc_v2;
    cu.cuMemAllocManaged = cuMemAllocManaged;
    cu.cuMemAllocPitch_v2 = cuMemAllocPitch_v2;
    cu.cuMemFree_v2 = cuMemFree_v2;
    cu.cuMemGetInfo_v2 = cuMemGetInfo_v2;
    cu.cuMemGetAllocationGranularity = cuMemGetAllocationGranularity;
    cu.cuMemCreate = cuMemCreate;
    cu.cuMemRelease = cuMemRelease;
    cu.cuGetProcAddress_v2 = cuGetProcAddress_v2;
    cu.stats = tesseraFakeStats;
    cu.per_thread_calls = tesseraFakePerThreadCalls;
}
#else
static void *driver;

#define SYM(field, name) cu.field = need(dlsym(driver, name), name)

static void load_nvml(void) {
    void *lib = need(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL), "libnvidia-ml.so.1");
    nvml.nvmlInit_v2 = need(dlsym(lib, "nvmlInit_v2"), "nvmlInit_v2");
    nvml.nvmlDeviceGetHandleByIndex_v2 = need(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"), "nvmlDeviceGetHandleByIndex_v2");
    nvml.nvmlDeviceGetMemoryInfo = need(dlsym(lib, "nvmlDeviceGetMemoryInfo"), "nvmlDeviceGetMemoryInfo");
    nvml.nvmlDeviceGetMemoryInfo_v2 = need(dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"), "nvmlDeviceGetMemoryInfo_v2");
    nvml.nvmlDeviceGetUtilizationRates = need(dlsym(lib, "nvmlDeviceGetUtilizationRates"), "nvmlDeviceGetUtilizationRates");
    nvml.nvmlDeviceGetUUID = need(dlsym(lib, "nvmlDeviceGetUUID"), "nvmlDeviceGetUUID");
    nvml.nvmlDeviceGetProcessUtilization =
        need(dlsym(lib, "nvmlDeviceGetProcessUtilization"), "nvmlDeviceGetProcessUtilization");
    nvml.procs[0] = need(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses"), "nvmlDeviceGetComputeRunningProcesses");
    nvml.procs[1] =
        need(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"), "nvmlDeviceGetComputeRunningProcesses_v2");
    nvml.procs[2] =
        need(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"), "nvmlDeviceGetComputeRunningProcesses_v3");
}

#if defined(LOADER_DLSYM)
static void load(void) {
    driver = need(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2");
    SYM(cuCtxCreate_v2, "cuCtxCreate_v2");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuMemAlloc_v2, "cuMemAlloc_v2");
    SYM(cuMemAllocManaged, "cuMemAllocManaged");
    SYM(cuMemAllocPitch_v2, "cuMemAllocPitch_v2");
    SYM(cuMemFree_v2, "cuMemFree_v2");
    SYM(cuMemGetInfo_v2, "cuMemGetInfo_v2");
    SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    SYM(cuMemCreate, "cuMemCreate");
    SYM(cuMemRelease, "cuMemRelease");
    SYM(cuGetProcAddress_v2, "cuGetProcAddress_v2");
    /* Only the fake driver has these; the dlopen loaders also run on a real one. */
    cu.stats = dlsym(driver, "tesseraFakeStats");
    cu.per_thread_calls = dlsym(driver, "tesseraFakePerThreadCalls");
}

static void load_async(int per_thread) {
    SYM(cuMemAllocAsync, per_thread ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
    SYM(cuMemFreeAsync, per_thread ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
}

static void load_exec(void) {
    SYM(launch[0], "cuLaunchKernel");
    SYM(launch[1], "cuLaunchKernel_ptsz");
    SYM(launch_ex[0], "cuLaunchKernelEx");
    SYM(launch_ex[1], "cuLaunchKernelEx_ptsz");
    SYM(coop[0], "cuLaunchCooperativeKernel");
    SYM(coop[1], "cuLaunchCooperativeKernel_ptsz");
    SYM(graph_launch[0], "cuGraphLaunch");
    SYM(graph_launch[1], "cuGraphLaunch_ptsz");
    SYM(stream_sync[0], "cuStreamSynchronize");
    SYM(stream_sync[1], "cuStreamSynchronize_ptsz");
    SYM(cuStreamCreate, "cuStreamCreate");
    SYM(cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2");
    SYM(cuStreamEndCapture, "cuStreamEndCapture");
    SYM(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
}
#elif defined(LOADER_PROCADDR)
#define CUDA_VERSION 12090
/* The version of the field's signature, as cudart asks for a PFN_<name>_v<version>. */
#define GPA_AT(field, name, version)                                         \
    do {                                                                     \
        void *p = NULL;                                                      \
        int status = -1;                                                     \
        CUresult rc = cu.cuGetProcAddress_v2(name, &p, version, 0, &status); \
        if (rc != 0 || status != 0) die("cuGetProcAddress_v2 " name, rc);    \
        cu.field = need(p, name);                                            \
    } while (0)
#define GPA(field, name) GPA_AT(field, name, CUDA_VERSION)

static void load(void) {
    driver = need(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
    SYM(cuGetProcAddress_v2, "cuGetProcAddress_v2");
    /* The runtime re-resolves the lookup function itself through it. */
    GPA(cuGetProcAddress_v2, "cuGetProcAddress");
    GPA(cuInit, "cuInit");
    GPA(cuDeviceGet, "cuDeviceGet");
    GPA(cuDeviceTotalMem_v2, "cuDeviceTotalMem");
    /* From CUDA 11.4 on, "cuCtxCreate" resolves to cuCtxCreate_v3 (then _v4). */
    GPA_AT(cuCtxCreate_v2, "cuCtxCreate", 3020);
    GPA(cuCtxSetCurrent, "cuCtxSetCurrent");
    GPA(cuMemAlloc_v2, "cuMemAlloc");
    GPA(cuMemAllocManaged, "cuMemAllocManaged");
    GPA(cuMemAllocPitch_v2, "cuMemAllocPitch");
    GPA(cuMemFree_v2, "cuMemFree");
    GPA(cuMemGetInfo_v2, "cuMemGetInfo");
    GPA(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    GPA(cuMemCreate, "cuMemCreate");
    GPA(cuMemRelease, "cuMemRelease");
    /* Only the fake driver has these; the dlopen loaders also run on a real one. */
    cu.stats = dlsym(driver, "tesseraFakeStats");
    cu.per_thread_calls = dlsym(driver, "tesseraFakePerThreadCalls");
}

static void load_async(int per_thread) {
    uint64_t flags = per_thread ? 2 /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */ : 0;
    void *p = NULL;
    int status = -1;
    CUresult rc = cu.cuGetProcAddress_v2("cuMemAllocAsync", &p, CUDA_VERSION, flags, &status);
    if (rc || status) die("cuGetProcAddress_v2 cuMemAllocAsync", rc);
    cu.cuMemAllocAsync = need(p, "cuMemAllocAsync");
    rc = cu.cuGetProcAddress_v2("cuMemFreeAsync", &p, CUDA_VERSION, flags, &status);
    if (rc || status) die("cuGetProcAddress_v2 cuMemFreeAsync", rc);
    cu.cuMemFreeAsync = need(p, "cuMemFreeAsync");
}

/* Index 1: asked for with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
#define GPA2(field, name)                                                                  \
    do {                                                                                   \
        for (int pt = 0; pt < 2; pt++) {                                                   \
            void *p = NULL;                                                                \
            int status = -1;                                                               \
            CUresult rc = cu.cuGetProcAddress_v2(name, &p, CUDA_VERSION, pt ? 2 : 0, &status); \
            if (rc != 0 || status != 0) die("cuGetProcAddress_v2 " name, rc);             \
            cu.field[pt] = need(p, name);                                                  \
        }                                                                                  \
    } while (0)

static void load_exec(void) {
    GPA2(launch, "cuLaunchKernel");
    GPA2(launch_ex, "cuLaunchKernelEx");
    GPA2(coop, "cuLaunchCooperativeKernel");
    GPA2(graph_launch, "cuGraphLaunch");
    GPA2(stream_sync, "cuStreamSynchronize");
    GPA(cuStreamCreate, "cuStreamCreate");
    GPA(cuStreamBeginCapture_v2, "cuStreamBeginCapture");
    GPA(cuStreamEndCapture, "cuStreamEndCapture");
    GPA(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
}
#else
#error "define LOADER_LINKED, LOADER_DLSYM or LOADER_PROCADDR"
#endif
#endif

static CUcontext context(int dev) {
    CUresult rc = cu.cuInit(0);
    if (rc) die("cuInit", rc);
    CUdevice d;
    if ((rc = cu.cuDeviceGet(&d, dev))) die("cuDeviceGet", rc);
    CUcontext ctx;
    if ((rc = cu.cuCtxCreate_v2(&ctx, 0, d))) die("cuCtxCreate_v2", rc);
    return ctx;
}

static int cmd_alloc(const char *api, size_t bytes, long max) {
    context(0);
    CUdeviceptr *ptrs = calloc((size_t)max, sizeof *ptrs);
    long n = 0;
    CUresult last = 0;
    for (; n < max; n++) {
        if (!strcmp(api, "plain")) last = cu.cuMemAlloc_v2(&ptrs[n], bytes);
        else if (!strcmp(api, "managed")) last = cu.cuMemAllocManaged(&ptrs[n], bytes, 1);
        else die("unknown api", -1);
        if (last) break;
    }
    printf("allocated=%ld\nlast_rc=%d\n", n, last);
    for (long i = 0; i < n; i++) {
        CUresult rc = cu.cuMemFree_v2(ptrs[i]);
        if (rc) die("cuMemFree_v2", rc);
    }
    return 0;
}

static int cmd_async(size_t bytes, long max, int per_thread) {
    context(0);
    load_async(per_thread);
    CUdeviceptr *ptrs = calloc((size_t)max, sizeof *ptrs);
    long n = 0;
    CUresult last = 0;
    for (; n < max; n++) {
        last = cu.cuMemAllocAsync(&ptrs[n], bytes, NULL);
        if (last) break;
    }
    printf("allocated=%ld\nlast_rc=%d\n", n, last);
    for (long i = 0; i < n; i++) {
        CUresult rc = cu.cuMemFreeAsync(ptrs[i], NULL);
        if (rc) die("cuMemFreeAsync", rc);
    }
    /* The pool gives the freed memory back to the device here. */
    load_exec();
    CUresult rc = cu.stream_sync[per_thread](NULL);
    if (rc) die("cuStreamSynchronize", rc);
    if (cu.per_thread_calls) printf("per_thread_calls=%llu\n", cu.per_thread_calls());
    return 0;
}

static int cmd_pitch(size_t width, size_t height, long max) {
    context(0);
    CUdeviceptr *ptrs = calloc((size_t)max, sizeof *ptrs);
    long n = 0;
    size_t pitch = 0;
    CUresult last = 0;
    for (; n < max; n++) {
        last = cu.cuMemAllocPitch_v2(&ptrs[n], &pitch, width, height, 4);
        if (last) break;
    }
    printf("allocated=%ld\nlast_rc=%d\npitch=%zu\n", n, last, pitch);
    for (long i = 0; i < n; i++) {
        CUresult rc = cu.cuMemFree_v2(ptrs[i]);
        if (rc) die("cuMemFree_v2", rc);
    }
    return 0;
}

static int cmd_vmm(int dev, size_t bytes, long max) {
    CUresult rc = cu.cuInit(0);
    if (rc) die("cuInit", rc);
    CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = dev}};
    size_t granularity = 0;
    if ((rc = cu.cuMemGetAllocationGranularity(&granularity, &prop, 0))) die("cuMemGetAllocationGranularity", rc);
    CUmemGenericAllocationHandle *handles = calloc((size_t)max, sizeof *handles);
    long n = 0;
    CUresult last = 0;
    for (; n < max; n++) {
        last = cu.cuMemCreate(&handles[n], bytes, &prop, 0);
        if (last) break;
    }
    printf("granularity=%zu\nallocated=%ld\nlast_rc=%d\n", granularity, n, last);
    for (long i = 0; i < n; i++) {
        if ((rc = cu.cuMemRelease(handles[i]))) die("cuMemRelease", rc);
    }
    return 0;
}

static int cmd_meminfo(int dev) {
    context(dev);
    size_t free_b = 0, total = 0, devtotal = 0;
    CUresult rc = cu.cuMemGetInfo_v2(&free_b, &total);
    if (rc) die("cuMemGetInfo_v2", rc);
    CUdevice d;
    cu.cuDeviceGet(&d, dev);
    if ((rc = cu.cuDeviceTotalMem_v2(&devtotal, d))) die("cuDeviceTotalMem_v2", rc);
    printf("free=%zu\ntotal=%zu\ndevtotal=%zu\n", free_b, total, devtotal);
    printf("null_free_rc=%d\n", cu.cuMemGetInfo_v2(NULL, &total));
    printf("null_total_rc=%d\n", cu.cuMemGetInfo_v2(&free_b, NULL));
    printf("null_devtotal_rc=%d\n", cu.cuDeviceTotalMem_v2(NULL, d));
    return 0;
}

static _Noreturn void cmd_hold(size_t bytes) {
    context(0);
    CUdeviceptr p;
    CUresult rc = cu.cuMemAlloc_v2(&p, bytes);
    if (rc) die("cuMemAlloc_v2", rc);
    printf("ready=1\n");
    fflush(stdout);
    for (;;) pause();
}

struct racer {
    CUcontext ctx;
    long rounds;
    size_t bytes;
    useconds_t hold;
    long ok, oom, other;
};

static pthread_barrier_t start;

static void *race(void *arg) {
    struct racer *r = arg;
    cu.cuCtxSetCurrent(r->ctx);
    pthread_barrier_wait(&start);
    for (long i = 0; i < r->rounds; i++) {
        CUdeviceptr p;
        CUresult rc = cu.cuMemAlloc_v2(&p, r->bytes);
        if (rc == 0) {
            r->ok++;
            if (r->hold) usleep(r->hold);
            if (cu.cuMemFree_v2(p)) r->other++;
        } else if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            r->oom++;
        } else {
            r->other++;
        }
    }
    return NULL;
}

static int cmd_race(int threads, long rounds, size_t bytes, useconds_t hold) {
    CUcontext ctx = context(0);
    const char *start_file = getenv("PROBE_START");
    while (start_file && access(start_file, F_OK) != 0) usleep(1000);
    struct racer *rs = calloc((size_t)threads, sizeof *rs);
    pthread_t *ts = calloc((size_t)threads, sizeof *ts);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        rs[i] = (struct racer){.ctx = ctx, .rounds = rounds, .bytes = bytes, .hold = hold};
        pthread_create(&ts[i], NULL, race, &rs[i]);
    }
    long ok = 0, oom = 0, other = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(ts[i], NULL);
        ok += rs[i].ok;
        oom += rs[i].oom;
        other += rs[i].other;
    }
    printf("ok=%ld\noom=%ld\nother=%ld\n", ok, oom, other);
    return 0;
}

static int cmd_fork(size_t parent_bytes, size_t child_bytes) {
    context(0);
    CUdeviceptr held;
    CUresult rc = cu.cuMemAlloc_v2(&held, parent_bytes);
    if (rc) die("cuMemAlloc_v2 parent", rc);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        CUdeviceptr p;
        _exit(cu.cuMemAlloc_v2(&p, child_bytes) == 0 ? 0 : 3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child_exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    long n = 0;
    CUdeviceptr p;
    while (n < 100000 && cu.cuMemAlloc_v2(&p, 1 << 20) == 0) n++;
    printf("allocated=%ld\n", n);
    return 0;
}

static int cmd_nvml(unsigned index) {
    load_nvml();
    nvmlReturn_t rc = nvml.nvmlInit_v2();
    if (rc) die("nvmlInit_v2", rc);
    nvmlDevice_t device;
    if ((rc = nvml.nvmlDeviceGetHandleByIndex_v2(index, &device))) die("nvmlDeviceGetHandleByIndex_v2", rc);
    nvmlMemory_t v1;
    if ((rc = nvml.nvmlDeviceGetMemoryInfo(device, &v1))) die("nvmlDeviceGetMemoryInfo", rc);
    printf("total=%llu\nfree=%llu\nused=%llu\n", v1.total, v1.free, v1.used);
    nvmlMemory_v2_t v2 = {.version = nvmlMemory_v2};
    if ((rc = nvml.nvmlDeviceGetMemoryInfo_v2(device, &v2))) die("nvmlDeviceGetMemoryInfo_v2", rc);
    printf("v2_total=%llu\nv2_free=%llu\nv2_used=%llu\nv2_reserved=%llu\n", v2.total, v2.free, v2.used, v2.reserved);
    nvmlMemory_v2_t old = {.version = 1};
    printf("bad_version_rc=%d\n", nvml.nvmlDeviceGetMemoryInfo_v2(device, &old));
    printf("null_rc=%d\n", nvml.nvmlDeviceGetMemoryInfo(device, NULL));
    return 0;
}

struct bencher {
    CUcontext ctx;
    long rounds;
    size_t bytes;
    unsigned long long *ns;
};

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void *bench(void *arg) {
    struct bencher *b = arg;
    cu.cuCtxSetCurrent(b->ctx);
    pthread_barrier_wait(&start);
    for (long i = 0; i < b->rounds; i++) {
        CUdeviceptr p;
        unsigned long long t0 = now_ns();
        CUresult rc = cu.cuMemAlloc_v2(&p, b->bytes);
        if (rc == 0) rc = cu.cuMemFree_v2(p);
        b->ns[i] = now_ns() - t0;
        if (rc) die("bench alloc/free", rc);
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return (x > y) - (x < y);
}

static int cmd_bench(int threads, long rounds, size_t bytes) {
    CUcontext ctx = context(0);
    struct bencher *bs = calloc((size_t)threads, sizeof *bs);
    pthread_t *ts = calloc((size_t)threads, sizeof *ts);
    unsigned long long *all = calloc((size_t)(threads * rounds), sizeof *all);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        bs[i] = (struct bencher){.ctx = ctx, .rounds = rounds, .bytes = bytes, .ns = all + i * rounds};
        pthread_create(&ts[i], NULL, bench, &bs[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(ts[i], NULL);
    size_t n = (size_t)(threads * rounds);
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum += all[i];
    qsort(all, n, sizeof *all, by_value);
    printf("p50=%llu\np99=%llu\nmean=%llu\n", all[n / 2], all[n * 99 / 100], sum / n);
    return 0;
}

static int cmd_stats(int dev) {
    CUresult rc = cu.cuInit(0);
    if (rc) die("cuInit", rc);
    unsigned long long used = 0, peak = 0;
    if (!cu.stats) die("tesseraFakeStats (not the fake driver)", -1);
    if ((rc = cu.stats(dev, &used, &peak))) die("tesseraFakeStats", rc);
    printf("used=%llu\npeak=%llu\n", used, peak);
    return 0;
}

static int cmd_lookup(const char *name, int version) {
    void *p = NULL;
    int status = -1;
    CUresult rc = cu.cuGetProcAddress_v2(name, &p, version, 0, &status);
    printf("rc=%d\nstatus=%d\nfound=%d\n", rc, status, p != NULL);
    return 0;
}

/* A kernel handle: the fake driver only checks that it is not NULL. */
static char kernel_image;
#define KERNEL ((void *)&kernel_image)

static CUresult launch_once(const char *path, int pt, unsigned blocks, void *stream, void *graph_exec) {
    if (!strncmp(path, "kernel", 6)) return cu.launch[pt](KERNEL, blocks, 1, 1, 128, 1, 1, 0, stream, NULL, NULL);
    if (!strncmp(path, "coop", 4)) return cu.coop[pt](KERNEL, blocks, 1, 1, 128, 1, 1, 0, stream, NULL);
    if (!strncmp(path, "ex", 2)) {
        CUlaunchConfig config = {.gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1,
                                 .blockDimZ = 1, .hStream = stream};
        return cu.launch_ex[pt](&config, KERNEL, NULL, NULL);
    }
    if (!strncmp(path, "graph", 5)) return cu.graph_launch[pt](graph_exec, stream);
    die("unknown path", -1);
    return -1;
}

static unsigned long long realtime_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

/* This process's NVML samples, each in the window its time falls in (window i: sample times in
 * (start + i s, start + (i + 1) s], NVML's CPU clock), not in the window during which it was read: a
 * read that comes a little late would otherwise move a sample (200 ms of the 1 s) to the next
 * window. */
#define OWN_WINDOWS 256
struct own {
    unsigned long long start_us, seen;
    unsigned sum[OWN_WINDOWS], count[OWN_WINDOWS];
};

/* Reads the samples newer than o->seen into their windows and returns window w's mean utilisation
 * (0 when no sample of this process fell in it), or -1 when NVML does not support per-process
 * utilisation. */
static int own_utilization(nvmlDevice_t device, struct own *o, int w) {
    nvmlProcessUtilizationSample_t samples[64];
    unsigned count = 64;
    nvmlReturn_t rc = nvml.nvmlDeviceGetProcessUtilization(device, samples, &count, o->seen);
    if (rc == 3 /* NVML_ERROR_NOT_SUPPORTED */) return -1;
    if (rc == 6 /* NVML_ERROR_NOT_FOUND: no new sample */) count = 0;
    else if (rc) die("nvmlDeviceGetProcessUtilization", rc);
    for (unsigned i = 0; i < count; i++) {
        unsigned long long t = samples[i].timeStamp;
        if (t > o->seen) o->seen = t;
        if (samples[i].pid != (unsigned)getpid() || t <= o->start_us) continue;
        unsigned long long in = (t - o->start_us - 1) / 1000000ull;
        if (in < OWN_WINDOWS) o->sum[in] += samples[i].smUtil, o->count[in]++;
    }
    if (w >= OWN_WINDOWS || !o->count[w]) return 0;
    return (int)(o->sum[w] / o->count[w]);
}

/* The watchdog of `launch`: the worst lateness of its 2 ms sleeps since the main thread last took
 * it, ns. A late wake-up means the host ran nothing of this process for that long (a CPU queue, a
 * page fault waiting on a loaded disk): a window with one does not measure the limiter. */
static _Atomic unsigned long long worst_late_ns;
static atomic_bool watchdog_stop;

static void *watchdog(void *unused) {
    (void)unused;
    while (!atomic_load(&watchdog_stop)) {
        unsigned long long due = now_ns() + 2000000ull;
        struct timespec ts = {.tv_sec = (time_t)(due / 1000000000ull), .tv_nsec = (long)(due % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
        }
        unsigned long long late = now_ns() - due, worst = atomic_load(&worst_late_ns);
        while (late > worst && !atomic_compare_exchange_weak(&worst_late_ns, &worst, late)) {
        }
    }
    return NULL;
}

static int cmd_launch(const char *path, double seconds, unsigned blocks) {
    /* $PROBE_DEVICE: the CUDA ordinal and NVML index to use (default 0). */
    int dev = getenv("PROBE_DEVICE") ? atoi(getenv("PROBE_DEVICE")) : 0;
    context(dev);
    load_exec();
    load_nvml();
    nvmlReturn_t nrc = nvml.nvmlInit_v2();
    if (nrc) die("nvmlInit_v2", nrc);
    nvmlDevice_t device;
    if ((nrc = nvml.nvmlDeviceGetHandleByIndex_v2((unsigned)dev, &device))) die("nvmlDeviceGetHandleByIndex_v2", nrc);
    unsigned util[2];
    /* Starts this process's utilisation sample period. */
    if ((nrc = nvml.nvmlDeviceGetUtilizationRates(device, util))) die("nvmlDeviceGetUtilizationRates", nrc);
    static struct own own_samples;
    own_samples.seen = realtime_us();

    int pt = strstr(path, "_ptsz") != NULL;
    void *stream = NULL, *graph_exec = NULL;
    CUresult rc;
    if (!strncmp(path, "graph", 5)) {
        if ((rc = cu.cuStreamCreate(&stream, 0))) die("cuStreamCreate", rc);
        if ((rc = cu.cuStreamBeginCapture_v2(stream, 0))) die("cuStreamBeginCapture_v2", rc);
        for (int i = 0; i < 4; i++)
            if ((rc = cu.launch[pt](KERNEL, blocks / 4, 1, 1, 128, 1, 1, 0, stream, NULL, NULL))) die("capture", rc);
        void *graph = NULL;
        if ((rc = cu.cuStreamEndCapture(stream, &graph))) die("cuStreamEndCapture", rc);
        if ((rc = cu.cuGraphInstantiateWithFlags(&graph_exec, graph, 0))) die("cuGraphInstantiateWithFlags", rc);
    }
    /* Windows end on a fixed grid (start + 1 s, + 2 s, ...), so a late one does not delay the next. */
    unsigned long long start = now_ns(), window_end = start + 1000000000ull,
                       end = start + (unsigned long long)(seconds * 1e9);
    own_samples.start_us = realtime_us();
    long launches = 0;
    int windows = 0;
    pthread_t watcher;
    if (pthread_create(&watcher, NULL, watchdog, NULL)) die("pthread_create", 1);
    for (;;) {
        if ((rc = launch_once(path, pt, blocks, stream, graph_exec))) die("launch", rc);
        launches++;
        if (launches % 8 == 0 && (rc = cu.stream_sync[pt](stream))) die("cuStreamSynchronize", rc);
        unsigned long long t = now_ns();
        if (t >= window_end) {
            if ((nrc = nvml.nvmlDeviceGetUtilizationRates(device, util))) die("nvmlDeviceGetUtilizationRates", nrc);
            int own = own_utilization(device, &own_samples, windows);
            if (own >= 0) printf("own_%d=%d\n", windows, own);
            printf("stall_%d=%llu\n", windows, atomic_exchange(&worst_late_ns, 0) / 1000000ull);
            printf("window_%d=%u\n", windows++, util[0]);
            window_end += 1000000000ull;
        }
        if (t >= end) break;
    }
    atomic_store(&watchdog_stop, true);
    pthread_join(watcher, NULL);
    if ((rc = cu.stream_sync[pt](stream))) die("cuStreamSynchronize", rc);
    printf("windows=%d\nlaunches=%ld\n", windows, launches);
    if (cu.per_thread_calls) printf("per_thread_calls=%llu\n", cu.per_thread_calls());
    return 0;
}

static int cmd_procs(unsigned index) {
    load_nvml();
    nvmlReturn_t rc = nvml.nvmlInit_v2();
    if (rc) die("nvmlInit_v2", rc);
    nvmlDevice_t device;
    if ((rc = nvml.nvmlDeviceGetHandleByIndex_v2(index, &device))) die("nvmlDeviceGetHandleByIndex_v2", rc);
    char uuid[96];
    if ((rc = nvml.nvmlDeviceGetUUID(device, uuid, sizeof uuid))) die("nvmlDeviceGetUUID", rc);
    printf("uuid=%s\n", uuid);
    for (int v = 0; v < 3; v++) {
        /* How many: no buffer. */
        unsigned count = 0;
        rc = nvml.procs[v](device, &count, NULL);
        printf("v%d_size_rc=%d\nv%d_needed=%u\n", v + 1, rc, v + 1, count);
        nvmlProcessInfo_t infos[64];
        nvmlProcessInfo_v1_t infos_v1[64];
        count = 64;
        rc = nvml.procs[v](device, &count, v ? (void *)infos : (void *)infos_v1);
        printf("v%d_rc=%d\nv%d_count=%u\n", v + 1, rc, v + 1, count);
        for (unsigned i = 0; i < count && !rc; i++) {
            unsigned pid = v ? infos[i].pid : infos_v1[i].pid;
            unsigned long long used = v ? infos[i].usedGpuMemory : infos_v1[i].usedGpuMemory;
            printf("v%d_pid_%u=%u\nv%d_used_%u=%llu\n", v + 1, i, pid, v + 1, i, used);
        }
    }
    nvmlProcessUtilizationSample_t samples[64];
    unsigned count = 0;
    rc = nvml.nvmlDeviceGetProcessUtilization(device, NULL, &count, 0);
    printf("util_size_rc=%d\nutil_needed=%u\n", rc, count);
    count = 64;
    rc = nvml.nvmlDeviceGetProcessUtilization(device, samples, &count, 0);
    printf("util_rc=%d\nutil_count=%u\n", rc, rc ? 0 : count);
    for (unsigned i = 0; i < count && !rc; i++) printf("util_pid_%u=%u\n", i, samples[i].pid);
    return 0;
}

/* Every second for <seconds>: each process's NVML utilisation of the device over that second
 * (watch_<i>_<pid>=<percent>), an observer that does not launch. */
static int cmd_watch(unsigned index, double seconds) {
    load_nvml();
    nvmlReturn_t rc = nvml.nvmlInit_v2();
    if (rc) die("nvmlInit_v2", rc);
    nvmlDevice_t device;
    if ((rc = nvml.nvmlDeviceGetHandleByIndex_v2(index, &device))) die("nvmlDeviceGetHandleByIndex_v2", rc);
    unsigned long long start = now_ns(), seen = realtime_us();
    int windows = (int)seconds;
    for (int w = 0; w < windows; w++) {
        unsigned long long end = start + (unsigned long long)(w + 1) * 1000000000ull;
        struct timespec ts = {.tv_sec = (time_t)(end / 1000000000ull), .tv_nsec = (long)(end % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
        }
        nvmlProcessUtilizationSample_t samples[64];
        unsigned count = 64;
        rc = nvml.nvmlDeviceGetProcessUtilization(device, samples, &count, seen);
        if (rc == 6 /* NVML_ERROR_NOT_FOUND: no new sample */) continue;
        if (rc) die("nvmlDeviceGetProcessUtilization", rc);
        /* Each process's mean over the window's samples (one per driver period). */
        unsigned pids[64], sums[64], counts[64], n = 0;
        for (unsigned i = 0; i < count; i++) {
            unsigned j = 0;
            while (j < n && pids[j] != samples[i].pid) j++;
            if (j == n) pids[n] = samples[i].pid, sums[n] = 0, counts[n] = 0, n++;
            sums[j] += samples[i].smUtil, counts[j]++;
            if (samples[i].timeStamp > seen) seen = samples[i].timeStamp;
        }
        for (unsigned j = 0; j < n; j++) printf("watch_%d_%u=%u\n", w, pids[j], sums[j] / counts[j]);
    }
    printf("watched=%d\n", windows);
    return 0;
}

/* Launches timed together: the clock's resolution may be coarser than a launch. */
#define LAUNCH_BATCH 10

struct launcher {
    CUcontext ctx;
    long rounds;
    unsigned long long *ns;
};

static void *launch_bench(void *arg) {
    struct launcher *b = arg;
    cu.cuCtxSetCurrent(b->ctx);
    pthread_barrier_wait(&start);
    for (long i = 0; i < b->rounds; i++) {
        CUresult rc = 0;
        unsigned long long t0 = now_ns();
        for (int j = 0; j < LAUNCH_BATCH; j++) rc |= cu.launch[0](KERNEL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        b->ns[i] = (now_ns() - t0) / LAUNCH_BATCH;
        if (rc) die("bench launch", rc);
    }
    return NULL;
}

static int cmd_launchbench(int threads, long rounds) {
    CUcontext ctx = context(0);
    load_exec();
    struct launcher *bs = calloc((size_t)threads, sizeof *bs);
    pthread_t *ts = calloc((size_t)threads, sizeof *ts);
    unsigned long long *all = calloc((size_t)(threads * rounds), sizeof *all);
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        bs[i] = (struct launcher){.ctx = ctx, .rounds = rounds, .ns = all + i * rounds};
        pthread_create(&ts[i], NULL, launch_bench, &bs[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(ts[i], NULL);
    size_t n = (size_t)(threads * rounds);
    unsigned long long sum = 0;
    for (size_t i = 0; i < n; i++) sum += all[i];
    qsort(all, n, sizeof *all, by_value);
    printf("p50=%llu\np99=%llu\nmean=%llu\n", all[n / 2], all[n * 99 / 100], sum / n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) die("usage", -1);
    load();
    const char *c = argv[1];
    if (!strcmp(c, "init")) {
        printf("init_rc=%d\n", cu.cuInit(0));
        return 0;
    }
    if (!strcmp(c, "alloc") && argc == 5) return cmd_alloc(argv[2], strtoull(argv[3], NULL, 0), atol(argv[4]));
    if (!strcmp(c, "async") && argc == 5) return cmd_async(strtoull(argv[2], NULL, 0), atol(argv[3]), atoi(argv[4]));
    if (!strcmp(c, "pitch") && argc == 5) return cmd_pitch(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), atol(argv[4]));
    if (!strcmp(c, "vmm") && argc == 5) return cmd_vmm(atoi(argv[2]), strtoull(argv[3], NULL, 0), atol(argv[4]));
    if (!strcmp(c, "meminfo") && argc == 3) return cmd_meminfo(atoi(argv[2]));
    if (!strcmp(c, "hold") && argc == 3) cmd_hold(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "race") && argc == 6)
        return cmd_race(atoi(argv[2]), atol(argv[3]), strtoull(argv[4], NULL, 0), (useconds_t)atoi(argv[5]));
    if (!strcmp(c, "fork") && argc == 4) return cmd_fork(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
    if (!strcmp(c, "nvml") && argc == 3) return cmd_nvml((unsigned)atoi(argv[2]));
    if (!strcmp(c, "procs") && argc == 3) return cmd_procs((unsigned)atoi(argv[2]));
    if (!strcmp(c, "watch") && argc == 4) return cmd_watch((unsigned)atoi(argv[2]), atof(argv[3]));
    if (!strcmp(c, "bench") && argc == 5) return cmd_bench(atoi(argv[2]), atol(argv[3]), strtoull(argv[4], NULL, 0));
    if (!strcmp(c, "stats") && argc == 3) return cmd_stats(atoi(argv[2]));
    if (!strcmp(c, "lookup") && argc == 4) return cmd_lookup(argv[2], atoi(argv[3]));
    if (!strcmp(c, "launch") && argc == 5) return cmd_launch(argv[2], atof(argv[3]), (unsigned)atoi(argv[4]));
    if (!strcmp(c, "launchbench") && argc == 4) return cmd_launchbench(atoi(argv[2]), atol(argv[3]));
    die("usage", -1);
    return 1;
}
