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
 * Build: cc -shared -fPIC -DLOCK_DIR='"/path"' -o libvgpu.so libvgpu-stand-in.c
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef LOCK_DIR
#error "build with -DLOCK_DIR='\"<lock dir>\"', as HAMi-core has its lock directory built in"
#endif

static const char *env_or_empty(const char *name) {
    const char *value = getenv(name);
    return value != NULL ? value : "";
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
}
