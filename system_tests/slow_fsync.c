/* Slow storage for the system tests: an LD_PRELOAD shim whose fsync() sleeps once, for the first file or directory
 * synced under a given directory, across every process of the job.
 *
 *   cc -shared -fPIC -o libslowfsync.so slow_fsync.c -ldl
 *   LD_PRELOAD=libslowfsync.so SLOW_FSYNC_SECONDS=35 SLOW_FSYNC_UNDER=/run/dir/checkpoints/ \
 *     SLOW_FSYNC_TOKEN=/tmp/token COMMAND...
 *
 * The first fsync() of a path that starts with SLOW_FSYNC_UNDER creates SLOW_FSYNC_TOKEN (O_EXCL: one process, once),
 * writes what it slowed into it, sleeps SLOW_FSYNC_SECONDS and then syncs. Every other call is the real fsync(). The
 * trainer fsyncs each checkpoint file before the save completes (torch.distributed.checkpoint with sync_files, the
 * manifest, the directories), so a save under SLOW_FSYNC_UNDER takes at least SLOW_FSYNC_SECONDS: storage that is
 * slow once, as a loaded parallel file system is, the duration set by the test. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsync(int fd) {
  static int (*real_fsync)(int) = NULL;
  if (real_fsync == NULL) {
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  }
  const char *seconds = getenv("SLOW_FSYNC_SECONDS");
  const char *under = getenv("SLOW_FSYNC_UNDER");
  const char *token = getenv("SLOW_FSYNC_TOKEN");
  if (seconds != NULL && under != NULL && token != NULL) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
      path[n] = '\0';
      if (strncmp(path, under, strlen(under)) == 0) {
        int once = open(token, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (once >= 0) {
          dprintf(once, "pid %d slept %s s in fsync of %s\n", (int)getpid(), seconds, path);
          close(once);
          sleep((unsigned)atoi(seconds));
        }
      }
    }
  }
  return real_fsync(fd);
}
