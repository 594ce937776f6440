/* The disk model's LD_PRELOAD shim: reads of files under a root directory are charged as a spinning disk would.
 *
 * Built at run time by multitables_bench/diskmodel.py (which documents the model and what it leaves out).
 * Every process that loads it maps one state file (named by $MULTITABLES_DISKMODEL), so all of them share
 * each disk's head, its queue (the time it is busy until), the page cache and the counters. A read of a file
 * under the state's root, while the state is enabled, is done for real first (from wherever the file's bytes
 * are, normally this machine's page cache), then charged: under the state's lock, the modelled page cache
 * narrows it to the pages it lacks, each disk it touches starts it when free (FIFO), adds a seek unless it
 * continues near where that disk's previous request ended, and transfers at the rate; the caller then sleeps
 * until the last of its disks is done. POSIX_FADV_WILLNEED queues a read without waiting; cachestat(2) (through
 * syscall(3)) counts the pages the modelled page cache holds. The layout of
 * struct dm_state is mirrored by _State in diskmodel.py; DM_VERSION changes with it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define DM_MAGIC 0x4c444d44u /* "DMDL" */
#define DM_VERSION 4
#define DM_MAX_DISKS 8
#define DM_ROOT_MAX 4096
#define DM_PAGE 4096
#define DM_CACHE_FILES 4
#define DM_CACHE_PAGES (1 << 20) /* pages of one file the page cache model tracks: its first 4 GiB */
#define DM_INFLIGHT 64             /* hinted reads of one file remembered until the disk is done with them */

struct dm_disk {
    int64_t head_dev, head_ino, head_off; /* where this disk's last read ended; head_ino -1: none yet */
    int64_t busy_until_ns;                /* CLOCK_MONOTONIC time this disk's queue empties */
    uint64_t reads, seeks, bytes, busy_ns;
};

/* A read the disk does for a POSIX_FADV_WILLNEED hint: its pages count as cached, but arrive at done_ns. */
struct dm_inflight {
    int64_t start, end, done_ns;
};

/* Which pages of one file are in the (modelled) page cache. */
struct dm_cached_file {
    int64_t dev, ino; /* ino 0: a free slot */
    int64_t next_inflight;
    struct dm_inflight inflight[DM_INFLIGHT];
    uint64_t pages[DM_CACHE_PAGES / 64];
};

struct dm_state {
    uint32_t magic, version;
    int32_t lock;    /* 0: free, else the holder's pid */
    int32_t enabled; /* reads are charged only while nonzero */
    int64_t seek_ns, bytes_per_s, stripe;
    int64_t readahead; /* bytes a disk reads on past a read, into its buffer, while no request is queued */
    int32_t n_disks;
    uint32_t root_gen;   /* bumped whenever root changes, so that processes re-check their files */
    int32_t page_cache;  /* model a page cache in front of the disks: a page read once is not read again */
    int32_t reserved;
    uint64_t calls;        /* read calls seen */
    uint64_t cached_calls; /* ... of which the page cache served every byte */
    uint64_t bytes;        /* bytes the disks transferred */
    uint64_t seeks, split_calls, sleep_ns;
    uint64_t hints;        /* POSIX_FADV_WILLNEED calls seen */
    char root[DM_ROOT_MAX];
    struct dm_disk disks[DM_MAX_DISKS];
    struct dm_cached_file cache[DM_CACHE_FILES];
};

size_t dm_state_size(void) { return sizeof(struct dm_state); }
uint32_t dm_version(void) { return DM_VERSION; }

static struct dm_state *state;
/* Which (device, inode) pairs are under the root, per process; a spinlock because threads share it
 * and a fork may copy it mid-update (the child resets it). */
#define CACHE_SLOTS 64
struct file_entry { int64_t dev, ino; uint32_t gen; int32_t inside; };
static struct file_entry file_cache[CACHE_SLOTS];
static int file_cache_lock;

static void reset_after_fork(void) { __atomic_store_n(&file_cache_lock, 0, __ATOMIC_RELEASE); }

/* Map the state file named by $MULTITABLES_DISKMODEL; without one, every call goes straight through. */
__attribute__((constructor)) static void dm_init(void) {
    pthread_atfork(NULL, NULL, reset_after_fork);
    const char *path = getenv("MULTITABLES_DISKMODEL");
    if (!path || !*path) return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "diskmodel: cannot open state file %s: %s; reads are not modelled\n", path, strerror(errno));
        return;
    }
    void *p = mmap(NULL, sizeof(struct dm_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "diskmodel: cannot map state file %s: %s; reads are not modelled\n", path, strerror(errno));
        return;
    }
    struct dm_state *s = p;
    if (s->magic != DM_MAGIC || s->version != DM_VERSION || s->n_disks < 1 || s->n_disks > DM_MAX_DISKS) {
        fprintf(stderr, "diskmodel: %s is not a version %d state file; reads are not modelled\n", path, DM_VERSION);
        munmap(p, sizeof(struct dm_state));
        return;
    }
    state = s;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The shared lock: 0 -> our pid. A holder that died (SIGKILL mid-charge) is detected and the lock taken over. */
static void lock_state(struct dm_state *s) {
    int32_t me = (int32_t)getpid();
    for (unsigned spins = 0;; spins++) {
        int32_t expected = 0;
        if (__atomic_compare_exchange_n(&s->lock, &expected, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
        if (spins % 4096 == 4095 && expected != me && kill(expected, 0) < 0 && errno == ESRCH)
            __atomic_compare_exchange_n(&s->lock, &expected, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        sched_yield();
    }
}

static void unlock_state(struct dm_state *s) { __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE); }

static int path_under_root(int fd, const char *root) {
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    size_t r = strlen(root);
    return r > 0 && strncmp(target, root, r) == 0 && (target[r] == '/' || target[r] == 0 || root[r - 1] == '/');
}

/* Whether fd is a regular file under the root (then *st is filled in); only while the model is enabled. */
static int modelled(int fd, struct stat *st) {
    struct dm_state *s = state;
    if (!s || !__atomic_load_n(&s->enabled, __ATOMIC_ACQUIRE)) return 0;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) return 0;
    uint32_t gen = __atomic_load_n(&s->root_gen, __ATOMIC_ACQUIRE);
    unsigned slot = (unsigned)((st->st_ino * 2654435761u) ^ st->st_dev) % CACHE_SLOTS;
    int inside = -1;
    while (__atomic_exchange_n(&file_cache_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
    struct file_entry *e = &file_cache[slot];
    if (e->gen == gen && e->dev == (int64_t)st->st_dev && e->ino == (int64_t)st->st_ino) inside = e->inside;
    __atomic_store_n(&file_cache_lock, 0, __ATOMIC_RELEASE);
    if (inside >= 0) return inside;
    char root[DM_ROOT_MAX];
    lock_state(s);
    memcpy(root, s->root, sizeof root);
    unlock_state(s);
    root[DM_ROOT_MAX - 1] = 0;
    inside = path_under_root(fd, root);
    while (__atomic_exchange_n(&file_cache_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
    *e = (struct file_entry){(int64_t)st->st_dev, (int64_t)st->st_ino, gen, inside};
    __atomic_store_n(&file_cache_lock, 0, __ATOMIC_RELEASE);
    return inside;
}

/* One disk serves [off, off + len) of its own address space, and returns when it is done.
 * The drive's buffer holds the last `readahead` bytes it read, and after each request the disk reads on into
 * it, up to `readahead` bytes, while it has nothing else to do (read look-ahead). So a request of the same
 * file that starts within `readahead` bytes of where the previous one ended, before or after, needs no seek:
 * bytes before that end come from the buffer, and the disk streams on over any gap to the request's end,
 * a transfer that may have begun as early as `readahead` bytes' time before the request arrived (never
 * before the previous transfer ended); the request is done when both the transfer and its arrival are past.
 * Any other request waits for the queue, seeks, and transfers. With readahead 0 only a request that starts
 * exactly where the last ended continues. */
static int64_t serve(struct dm_state *s, struct dm_disk *d, const struct stat *st, int64_t off, int64_t len, int64_t arrive) {
    int64_t gap = off - d->head_off;
    int continues = d->head_ino == (int64_t)st->st_ino && d->head_dev == (int64_t)st->st_dev && gap <= s->readahead &&
                    -gap <= s->readahead;
    int64_t start, cost, end = off + len;
    if (continues) {
        int64_t ahead = (int64_t)((__int128)s->readahead * 1000000000 / s->bytes_per_s);
        int64_t fresh = end > d->head_off ? end - d->head_off : 0; /* bytes past the previous end, gap included */
        start = d->busy_until_ns > arrive - ahead ? d->busy_until_ns : arrive - ahead;
        cost = (int64_t)((__int128)fresh * 1000000000 / s->bytes_per_s);
        if (end < d->head_off) end = d->head_off;
    } else {
        start = d->busy_until_ns > arrive ? d->busy_until_ns : arrive;
        cost = s->seek_ns + (int64_t)((__int128)len * 1000000000 / s->bytes_per_s);
        d->seeks++;
        s->seeks++;
    }
    d->head_dev = (int64_t)st->st_dev;
    d->head_ino = (int64_t)st->st_ino;
    d->head_off = end;
    d->busy_until_ns = start + cost; /* in the past if the buffer held it all: the disk is free */
    d->reads++;
    d->bytes += (uint64_t)len;
    d->busy_ns += (uint64_t)cost;
    return d->busy_until_ns > arrive ? d->busy_until_ns : arrive;
}

/* The page cache's record of st's file: found, or a free slot claimed; NULL when all slots hold other files. */
static struct dm_cached_file *cached_file(struct dm_state *s, const struct stat *st) {
    for (int i = 0; i < DM_CACHE_FILES; i++) {
        struct dm_cached_file *f = &s->cache[i];
        if (f->ino == (int64_t)st->st_ino && f->dev == (int64_t)st->st_dev) return f;
        if (f->ino == 0) {
            f->dev = (int64_t)st->st_dev;
            f->ino = (int64_t)st->st_ino;
            return f;
        }
    }
    return NULL;
}

/* Narrow a read to the pages the page cache lacks, as the kernel would read them (whole pages, from the first
 * missing to the last missing), and note all its pages as cached. Returns 0 if every page was cached.
 * *ready: when the cached pages it needs are there (later than now while a hinted read of them is in flight).
 * *file: the file's cache record (NULL when all slots hold other files). */
static int through_page_cache(struct dm_state *s, const struct stat *st, int64_t *off, int64_t *len, int64_t *ready,
                              struct dm_cached_file **file) {
    struct dm_cached_file *f = *file = cached_file(s, st);
    if (!f) return 1;
    for (int i = 0; i < DM_INFLIGHT; i++) {
        struct dm_inflight *h = &f->inflight[i];
        if (h->done_ns > *ready && h->start < *off + *len && *off < h->end) *ready = h->done_ns;
    }
    int64_t p0 = *off / DM_PAGE, p1 = (*off + *len - 1) / DM_PAGE, first = -1, last = -1;
    for (int64_t p = p0; p <= p1; p++) {
        int in = p < DM_CACHE_PAGES && (f->pages[p / 64] >> (p % 64) & 1);
        if (!in) {
            if (first < 0) first = p;
            last = p;
        }
        if (p < DM_CACHE_PAGES) f->pages[p / 64] |= 1ull << (p % 64);
    }
    if (first < 0) return 0;
    int64_t start = first * DM_PAGE, end = (last + 1) * DM_PAGE;
    if (end > (int64_t)st->st_size) end = (int64_t)st->st_size > *off + *len ? (int64_t)st->st_size : *off + *len;
    *off = start;
    *len = end - start;
    return 1;
}

/* Charge a read of file bytes [off, off + len) that arrived at `arrive`; return when the last disk is done.
 * `cacheable`: the read goes through the page cache (not O_DIRECT). `hint`: a POSIX_FADV_WILLNEED, which the
 * disk queues like a read while the caller goes on; the pages it reads are in the cache once it is done.
 * RAID 0: stripe k of the file lies on disk k % n at disk offset (k / n) * stripe, so the stripes of one
 * read that fall on one disk are contiguous there and that disk serves them as one request. */
static int64_t charge(const struct stat *st, int64_t off, int64_t len, int64_t arrive, int cacheable, int hint) {
    struct dm_state *s = state;
    int64_t done = arrive, ready = arrive;
    struct dm_cached_file *file = NULL;
    lock_state(s);
    if (hint)
        s->hints++;
    else
        s->calls++;
    if (cacheable && s->page_cache && !through_page_cache(s, st, &off, &len, &ready, &file)) {
        if (!hint) s->cached_calls++;
        unlock_state(s);
        return ready;
    }
    int n = s->n_disks;
    if (n == 1) {
        done = serve(s, &s->disks[0], st, off, len, arrive);
    } else {
        int64_t first[DM_MAX_DISKS], bytes[DM_MAX_DISKS];
        int touched = 0;
        for (int i = 0; i < n; i++) bytes[i] = 0;
        for (int64_t pos = off, end = off + len; pos < end;) {
            int64_t k = pos / s->stripe, within = pos % s->stripe;
            int64_t piece = s->stripe - within < end - pos ? s->stripe - within : end - pos;
            int disk = (int)(k % n);
            if (bytes[disk] == 0) {
                first[disk] = (k / n) * s->stripe + within;
                touched++;
            }
            bytes[disk] += piece;
            pos += piece;
        }
        for (int i = 0; i < n; i++) {
            if (bytes[i] == 0) continue;
            int64_t t = serve(s, &s->disks[i], st, first[i], bytes[i], arrive);
            if (t > done) done = t;
        }
        if (touched > 1) s->split_calls++;
    }
    s->bytes += (uint64_t)len;
    if (hint && file) {
        struct dm_inflight *h = &file->inflight[file->next_inflight++ % DM_INFLIGHT];
        *h = (struct dm_inflight){off, off + len, done};
    }
    unlock_state(s);
    return done > ready ? done : ready;
}

static void wait_until(int64_t t) {
    int64_t before = now_ns();
    if (t <= before) return;
    /* The default 50 us of timer slack per sleep would idle the disk between a reader's small reads. */
    static __thread int slack_set;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        slack_set = 1;
    }
    struct timespec ts = {.tv_sec = t / 1000000000, .tv_nsec = t % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
    __atomic_add_fetch(&state->sleep_ns, (uint64_t)(t - before), __ATOMIC_RELAXED);
}

/* After the real read on fd returned got bytes from off (offset -1: the read did not say, none charged). */
static ssize_t finish(int fd, ssize_t got, const struct stat *st, int64_t off, int64_t arrive) {
    if (got > 0 && off >= 0) {
        int saved = errno;
        int flags = fcntl(fd, F_GETFL);
        wait_until(charge(st, off, got, arrive, flags >= 0 && !(flags & O_DIRECT), 0));
        errno = saved;
    }
    return got;
}

/* The real calls, looked up on first use: another library's constructor may read before ours has run. */
static void *next(void **slot, const char *symbol) {
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, symbol);
        __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    }
    return f;
}

typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef ssize_t (*preadv_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*preadv2_fn)(int, const struct iovec *, int, off_t, int);
typedef ssize_t (*read_chk_fn)(int, void *, size_t, size_t);
typedef ssize_t (*pread_chk_fn)(int, void *, size_t, off_t, size_t);
static void *real_read, *real_readv, *real_pread, *real_pread64, *real_preadv, *real_preadv64, *real_preadv2,
    *real_preadv64v2, *real_read_chk, *real_pread_chk, *real_pread64_chk;

/* Positioned reads: charged at their offset. */
static ssize_t positioned_pread(void **slot, const char *sym, int fd, void *buf, size_t n, off_t off) {
    pread_fn f = (pread_fn)next(slot, sym);
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, buf, n, off);
    int64_t arrive = now_ns();
    return finish(fd, f(fd, buf, n, off), &st, off, arrive);
}

static ssize_t positioned_preadv(void **slot, const char *sym, int fd, const struct iovec *iov, int cnt, off_t off) {
    preadv_fn f = (preadv_fn)next(slot, sym);
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, iov, cnt, off);
    int64_t arrive = now_ns();
    return finish(fd, f(fd, iov, cnt, off), &st, off, arrive);
}

/* preadv2 with offset -1 reads at the file position, as readv. */
static ssize_t positioned_preadv2(void **slot, const char *sym, int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    preadv2_fn f = (preadv2_fn)next(slot, sym);
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, iov, cnt, off, flags);
    int64_t arrive = now_ns();
    off_t at = off == -1 ? lseek(fd, 0, SEEK_CUR) : off;
    return finish(fd, f(fd, iov, cnt, off, flags), &st, at, arrive);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) { return positioned_pread(&real_pread, "pread", fd, buf, n, off); }
ssize_t pread64(int fd, void *buf, size_t n, off_t off) { return positioned_pread(&real_pread64, "pread64", fd, buf, n, off); }
ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) {
    return positioned_preadv(&real_preadv, "preadv", fd, iov, cnt, off);
}
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) {
    return positioned_preadv(&real_preadv64, "preadv64", fd, iov, cnt, off);
}
ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    return positioned_preadv2(&real_preadv2, "preadv2", fd, iov, cnt, off, flags);
}
ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    return positioned_preadv2(&real_preadv64v2, "preadv64v2", fd, iov, cnt, off, flags);
}

/* read and readv: charged at the file position before the call. */
ssize_t read(int fd, void *buf, size_t n) {
    read_fn f = (read_fn)next(&real_read, "read");
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, buf, n);
    int64_t arrive = now_ns();
    off_t at = lseek(fd, 0, SEEK_CUR);
    return finish(fd, f(fd, buf, n), &st, at, arrive);
}

ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    readv_fn f = (readv_fn)next(&real_readv, "readv");
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, iov, cnt);
    int64_t arrive = now_ns();
    off_t at = lseek(fd, 0, SEEK_CUR);
    return finish(fd, f(fd, iov, cnt), &st, at, arrive);
}

/* The fortified entry points that _FORTIFY_SOURCE builds call where a buffer's size is known. */
ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
    read_chk_fn f = (read_chk_fn)next(&real_read_chk, "__read_chk");
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, buf, n, buflen);
    int64_t arrive = now_ns();
    off_t at = lseek(fd, 0, SEEK_CUR);
    return finish(fd, f(fd, buf, n, buflen), &st, at, arrive);
}

static ssize_t positioned_pread_chk(void **slot, const char *sym, int fd, void *buf, size_t n, off_t off, size_t buflen) {
    pread_chk_fn f = (pread_chk_fn)next(slot, sym);
    struct stat st;
    if (!modelled(fd, &st)) return f(fd, buf, n, off, buflen);
    int64_t arrive = now_ns();
    return finish(fd, f(fd, buf, n, off, buflen), &st, off, arrive);
}

ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
    return positioned_pread_chk(&real_pread_chk, "__pread_chk", fd, buf, n, off, buflen);
}
ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
    return positioned_pread_chk(&real_pread64_chk, "__pread64_chk", fd, buf, n, off, buflen);
}

/* POSIX_FADV_WILLNEED on a modelled file: the disk reads the range into the page cache in the background (the
 * kernel queues the reads and returns); the real hint goes through too. Other advice is not modelled. */
typedef int (*fadvise_fn)(int, off_t, off_t, int);
static void *real_posix_fadvise, *real_posix_fadvise64;

static int hinted(void **slot, const char *sym, int fd, off_t off, off_t len, int advice) {
    fadvise_fn f = (fadvise_fn)next(slot, sym);
    struct stat st;
    int rc = f(fd, off, len, advice);
    if (rc != 0 || advice != POSIX_FADV_WILLNEED || !modelled(fd, &st) || !state->page_cache) return rc;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_DIRECT) || off >= st.st_size) return rc;
    int64_t end = len == 0 || off + len > st.st_size ? st.st_size : off + len;
    if (end > off) charge(&st, off, end - off, now_ns(), 1, 1);
    return rc;
}

int posix_fadvise(int fd, off_t off, off_t len, int advice) {
    return hinted(&real_posix_fadvise, "posix_fadvise", fd, off, len, advice);
}
int posix_fadvise64(int fd, off_t off, off_t len, int advice) {
    return hinted(&real_posix_fadvise64, "posix_fadvise64", fd, off, len, advice);
}

/* cachestat(2), which multitables asks before it hints (NOTE [hints on cached bytes] in multitables/_io/chunks/
 * pread.py), reached through syscall(3): on a modelled file it counts the pages of the range that the modelled page
 * cache holds, arrived (a hinted read still on the disk's queue is not cached yet), and nothing else. */
#define DM_SYS_CACHESTAT 451 /* the same number on every architecture */
struct dm_cachestat_range {
    uint64_t off, len;
};
struct dm_cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
typedef long (*syscall_fn)(long, ...);
static void *real_syscall;

static uint64_t cached_pages(const struct stat *st, int64_t off, int64_t len) {
    struct dm_state *s = state;
    uint64_t n = 0;
    int64_t end = len == 0 || off + len > (int64_t)st->st_size ? (int64_t)st->st_size : off + len;
    lock_state(s);
    for (int i = 0; s->page_cache && i < DM_CACHE_FILES; i++) {
        struct dm_cached_file *f = &s->cache[i];
        if (f->ino != (int64_t)st->st_ino || f->dev != (int64_t)st->st_dev) continue;
        int64_t now = now_ns(), busy[DM_INFLIGHT][2]; /* the hinted reads over the range still on the queue */
        int n_busy = 0;
        for (int h = 0; h < DM_INFLIGHT; h++) {
            struct dm_inflight *r = &f->inflight[h];
            if (r->done_ns > now && r->start < end && off < r->end) {
                busy[n_busy][0] = r->start;
                busy[n_busy++][1] = r->end;
            }
        }
        for (int64_t p = off / DM_PAGE; p * DM_PAGE < end && p < DM_CACHE_PAGES; p++) {
            int in = f->pages[p / 64] >> (p % 64) & 1;
            for (int h = 0; in && h < n_busy; h++)
                if (busy[h][0] < (p + 1) * DM_PAGE && p * DM_PAGE < busy[h][1]) in = 0;
            n += (uint64_t)in;
        }
    }
    unlock_state(s);
    return n;
}

long syscall(long number, ...) {
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long); /* as glibc's own syscall(3) reads them */
    va_end(ap);
    syscall_fn f = (syscall_fn)next(&real_syscall, "syscall");
    struct stat st;
    if (number == DM_SYS_CACHESTAT && modelled((int)a[0], &st)) {
        const struct dm_cachestat_range *range = (const struct dm_cachestat_range *)a[1];
        struct dm_cachestat *out = (struct dm_cachestat *)a[2];
        if (!range || !out || a[3] != 0) {
            errno = EINVAL;
            return -1;
        }
        memset(out, 0, sizeof *out);
        out->nr_cache = cached_pages(&st, (int64_t)range->off, (int64_t)range->len);
        return 0;
    }
    return f(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
