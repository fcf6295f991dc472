/*
 * A stand-in for HAMi-core's libvgpu.so, built by integration/tests/enforcement.rs.
 *
 * ld.so loads it through /etc/ld.so.preload into a process, exactly as it loads the real library;
 * if ld.so cannot read the preload file it loads nothing, silently, and the process runs without
 * limits. Its constructor records what HAMi-core would act on (the real uid and the limits in the
 * environment) in a file it creates in the directory of the shared cache, and creates a file in
 * the lock directory: HAMi-core must create both its cache and its lock there, as whatever user
 * the container runs as.
 *
 * Like HAMi-core it then opens the shared cache (O_RDWR | O_CREAT, 0666, umask 0), extends it to
 * the region's size, maps it and, when it is not initialised yet, fills it: structure version 1.2,
 * the devices of NVIDIA_VISIBLE_DEVICES, the limits of the environment, utilization_switch 1,
 * recent_kernel 2, the priority of CUDA_TASK_PRIORITY (default 1). Each process takes a slot with
 * its pid and the memory and SM use of STAND_IN_MEMORY_BYTES and STAND_IN_SM_UTIL (a real
 * process's allocations and NVML samples), and frees it at exit.
 *
 * With STAND_IN_KERNELS set, a child process stands for a CUDA program's kernel launches: while
 * the file `stand-in-active` exists in the claim directory it "launches" every 200 ms as
 * HAMi-core's rate limiter does (wait while recent_kernel is negative, then set it to 2 and
 * last_kernel_time to now), and appends to `stand-in-events` each time it starts and stops
 * waiting and each change of utilization_switch it sees.
 *
 * Build: cc -shared -fPIC -DLOCK_DIR='"/path"' -o libvgpu.so libvgpu-stand-in.c
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef LOCK_DIR
#error "build with -DLOCK_DIR='\"<lock dir>\"', as HAMi-core has its lock directory built in"
#endif

static const char *env_or_empty(const char *name) {
    const char *value = getenv(name);
    return value != NULL ? value : "";
}

/* The region as HAMi-core's multiprocess_memory_limit.h lays it out (version 1.2); the driver's
 * reader (driver/src/monitor/region.rs) has the same offsets, asserted on both sides. */
#define MAGIC_FLAG 19920718
#define MAX_DEVICES 16
#define MAX_PROCS 1024

struct device_memory { uint64_t context_size, module_size, data_size, offset, total, unused[3]; };
struct device_util { uint64_t dec_util, enc_util, sm_util, unused[3]; };
struct proc_slot {
    int32_t pid, hostpid;
    struct device_memory used[MAX_DEVICES];
    uint64_t monitorused[MAX_DEVICES];
    struct device_util device_util[MAX_DEVICES];
    int32_t status;
    uint64_t seqlock, unused[2];
};
struct shared_region {
    int32_t initialized_flag;
    uint32_t major_version, minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    unsigned char sem[32] __attribute__((aligned(8)));
    uint64_t device_num;
    char uuids[MAX_DEVICES][96];
    uint64_t limit[MAX_DEVICES], sm_limit[MAX_DEVICES];
    struct proc_slot procs[MAX_PROCS];
    int32_t proc_num, utilization_switch, recent_kernel, priority;
    uint64_t last_kernel_time;
    unsigned char sem_postinit[32] __attribute__((aligned(8)));
};
_Static_assert(sizeof(struct proc_slot) == 1960, "slot size");
_Static_assert(offsetof(struct shared_region, procs) == 1856, "procs offset");
_Static_assert(offsetof(struct shared_region, proc_num) == 2008896, "proc_num offset");
_Static_assert(offsetof(struct shared_region, recent_kernel) == 2008904, "recent_kernel offset");
_Static_assert(sizeof(struct shared_region) == 2008952, "region size");

static struct shared_region *region;
static int my_slot = -1;

static uint64_t parse_bytes(const char *v) {
    if (v == NULL || *v == '\0') return 0;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    switch (*end) {
    case 'g': case 'G': return (uint64_t)n << 30;
    case 'm': case 'M': return (uint64_t)n << 20;
    case 'k': case 'K': return (uint64_t)n << 10;
    default: return n;
    }
}

static void free_slot(void) {
    if (region != NULL && my_slot >= 0) {
        __atomic_store_n(&region->procs[my_slot].pid, 0, __ATOMIC_RELEASE);
    }
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void event(const char *dir, const char *what, int value) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/stand-in-events", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0666);
    if (fd >= 0) {
        dprintf(fd, "%lld %s %d\n", now_ms(), what, value);
        close(fd);
    }
}

/* The kernel launches of a CUDA program, as HAMi-core's rate_limiter gates them. */
static void launch_kernels(const char *dir) {
    /* One launcher per claim directory, however many programs of the container load us. */
    char lock[PATH_MAX + 32];
    snprintf(lock, sizeof lock, "%s/stand-in-launcher", dir);
    int lock_fd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        _exit(0);
    }
    char active[PATH_MAX + 32];
    snprintf(active, sizeof active, "%s/stand-in-active", dir);
    int seen_switch = -2;
    for (;;) {
        int sw = __atomic_load_n(&region->utilization_switch, __ATOMIC_ACQUIRE);
        if (sw != seen_switch) {
            event(dir, "switch", sw);
            seen_switch = sw;
        }
        if (access(active, F_OK) == 0) {
            if (__atomic_load_n(&region->recent_kernel, __ATOMIC_ACQUIRE) < 0) {
                event(dir, "blocked", 1);
                while (__atomic_load_n(&region->recent_kernel, __ATOMIC_ACQUIRE) < 0) {
                    usleep(50 * 1000);
                }
                event(dir, "blocked", 0);
            }
            __atomic_store_n(&region->recent_kernel, 2, __ATOMIC_RELEASE);
            __atomic_store_n(&region->last_kernel_time, (uint64_t)time(NULL), __ATOMIC_RELEASE);
        }
        usleep(200 * 1000);
    }
}

static void join_region(const char *cache) {
    mode_t old = umask(0);
    int fd = open(cache, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    umask(old);
    if (fd < 0) {
        dprintf(2, "libvgpu stand-in: cannot open the shared cache %s: %s\n", cache, strerror(errno));
        exit(EXIT_FAILURE); /* as HAMi-core does */
    }
    if (lseek(fd, sizeof(struct shared_region), SEEK_SET) < 0 || write(fd, "", 1) != 1) {
        dprintf(2, "libvgpu stand-in: cannot extend %s: %s\n", cache, strerror(errno));
        exit(EXIT_FAILURE);
    }
    region = mmap(NULL, sizeof(struct shared_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED) {
        region = NULL;
        exit(EXIT_FAILURE);
    }
    lockf(fd, F_LOCK, 0);
    if (region->initialized_flag != MAGIC_FLAG) {
        region->major_version = 1;
        region->minor_version = 2;
        char devices[16 * 100];
        snprintf(devices, sizeof devices, "%s", env_or_empty("NVIDIA_VISIBLE_DEVICES"));
        uint64_t n = 0;
        for (char *save = NULL, *d = strtok_r(devices, ",", &save); d != NULL && n < MAX_DEVICES; d = strtok_r(NULL, ",", &save)) {
            snprintf(region->uuids[n], sizeof region->uuids[n], "%s", d);
            char name[64];
            snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%llu", (unsigned long long)n);
            region->limit[n] = parse_bytes(getenv(name));
            snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%llu", (unsigned long long)n);
            region->sm_limit[n] = parse_bytes(getenv(name));
            n++;
        }
        region->device_num = n;
        region->utilization_switch = 1;
        region->recent_kernel = 2;
        region->proc_num = 0;
        const char *priority = getenv("CUDA_TASK_PRIORITY");
        region->priority = priority != NULL ? atoi(priority) : 1;
        __atomic_store_n(&region->initialized_flag, MAGIC_FLAG, __ATOMIC_RELEASE);
    }
    /* A program that exec'd another keeps its pid and its slot, as in HAMi-core. */
    for (int i = 0; i < region->proc_num && i < MAX_PROCS; i++) {
        if (region->procs[i].pid == getpid()) {
            my_slot = i;
        }
    }
    if (my_slot < 0 && region->proc_num >= 0 && region->proc_num < MAX_PROCS) {
        my_slot = region->proc_num++;
    }
    if (my_slot >= 0) {
        struct proc_slot *slot = &region->procs[my_slot];
        memset(slot, 0, sizeof *slot);
        slot->pid = getpid();
        slot->status = 1;
        slot->used[0].total = slot->used[0].data_size = parse_bytes(getenv("STAND_IN_MEMORY_BYTES"));
        slot->device_util[0].sm_util = parse_bytes(getenv("STAND_IN_SM_UTIL"));
        atexit(free_slot);
    }
    lseek(fd, 0, SEEK_SET);
    lockf(fd, F_ULOCK, 0);
    close(fd);
}


__attribute__((constructor)) static void record_limits(void) {
    const char *cache = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    /* Only the container's program gets a claim's environment; the test's own helpers that run
     * after the preload is mounted (setpriv, env) carry none and record nothing. */
    if (cache == NULL) {
        return;
    }
    unsigned uid = (unsigned)getuid();

    char lock[PATH_MAX + 64];
    char lock_result[128] = "ok";
    snprintf(lock, sizeof lock, "%s/stand-in.%u", LOCK_DIR, uid);
    int lock_fd = open(lock, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (lock_fd < 0) {
        snprintf(lock_result, sizeof lock_result, "%s", strerror(errno));
    } else {
        close(lock_fd);
    }

    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cache);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        dprintf(2, "libvgpu stand-in: CUDA_DEVICE_MEMORY_SHARED_CACHE=%s has no directory\n", cache);
        return;
    }
    *slash = '\0';
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/stand-in-record.%u", dir, uid);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        /* The test quotes stderr, so a failure says which of the two host files is at fault. */
        dprintf(2, "libvgpu stand-in: loaded as uid %u but cannot create %s: %s\n", uid, path, strerror(errno));
        return;
    }
    dprintf(fd, "uid=%u\nmemory=%s\ncores=%s\nvisible=%s\ncache=%s\nlock=%s\n", uid,
            env_or_empty("CUDA_DEVICE_MEMORY_LIMIT_0"), env_or_empty("CUDA_DEVICE_SM_LIMIT"),
            env_or_empty("NVIDIA_VISIBLE_DEVICES"), cache, lock_result);
    close(fd);

    join_region(cache);
    if (getenv("STAND_IN_KERNELS") != NULL && fork() == 0) {
        /* The launcher outlives the program that loaded it, as the container's other processes
         * do; it ends with the container. */
        launch_kernels(dir);
    }
}
