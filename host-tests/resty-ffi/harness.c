/*
 * A stand-in for lua-resty-ffi's C side, so a runtime library (our lua-shim)
 * can be tested against the exact ABI without OpenResty.
 *
 * Build: gcc -shared -fPIC -O2 -pthread -o libresty_ffi_harness.so harness.c -ldl
 * Load this library RTLD_GLOBAL so the runtime under test finds the three
 * ngx_http_lua_ffi_* symbols.
 *
 * ---------------------------------------------------------------------------
 * The contract, as read from kingluo/lua-resty-ffi (ngx_http_lua_ffi.c,
 * resty_ffi.lua / ffi.lua, README.md "Lua API" and "API provided by/used by
 * the runtime", examples/{go,rust,python}):
 *
 *   int   libffi_init(char *cfg, void *tq);                  (runtime exports)
 *   void *ngx_http_lua_ffi_task_poll(void *tq);              (nginx exports)
 *   char *ngx_http_lua_ffi_get_req(void *tsk, int *len);     (nginx exports)
 *   void  ngx_http_lua_ffi_respond(void *tsk, int rc, char *rsp, int rsp_len);
 *
 * libffi_init: called once per (library, cfg) pair per worker, from the nginx
 *   worker thread; it should start the runtime's thread(s) and return at once.
 *   cfg is NULL when Lua passes nil, otherwise a malloc'ed NUL-terminated copy
 *   that lua-resty-ffi free()s as soon as libffi_init returns, so a runtime
 *   must copy what it keeps (it may scribble on cfg meanwhile: the Python
 *   loader splits it in place). 0 = success; any other value makes
 *   ngx.load_ffi return (nil, rc). On failure the queue is simply dropped:
 *   nothing ever finishes it, so a runtime that fails must not poll tq.
 *   The library is dlopen'ed RTLD_LAZY and, by default, never dlclose'd.
 *
 * poll: blocks (mutex + condvar) until a task is queued; tasks come out in
 *   FIFO order. NULL means the runtime was unloaded: Lua's runtime:__unload()
 *   appends an end marker behind all pending tasks, and the poll that takes
 *   it frees the queue itself before returning NULL. So after NULL, tq is
 *   dangling: never poll again, and only one thread may poll at all (a second
 *   poller would be sleeping on a destroyed condvar). NULL is also returned
 *   if the mutex/condvar calls fail. Worker exit or nginx reload does NOT
 *   produce a NULL; the process just exits under the runtime's threads.
 *
 * get_req: gives the request buffer and, if len is non-NULL, its length. The
 *   buffer is a malloc'ed copy of the Lua string with a trailing NUL (not
 *   counted in len), or NULL with len 0 when Lua called with no argument.
 *   It belongs to lua-resty-ffi and is free()d together with the task once
 *   the response has been handed to Lua, so it must not be used after
 *   respond. Embedded NULs are possible: len is the truth.
 *
 * respond: must be called exactly once per polled task, from any thread (it
 *   queues the task onto nginx's thread-pool "done" list and wakes the event
 *   loop through eventfd). Calling it twice, or never, corrupts or leaks the
 *   task; if the Lua side went away meanwhile the task is still freed on
 *   respond, so respond is still required. rsp is taken over and released
 *   with free(), so it must come from malloc (or be NULL). rsp_len > 0: that
 *   many bytes; rsp_len == 0 and rsp != NULL: read with strlen; rsp == NULL:
 *   Lua gets nil. A negative rsp_len would be fed to lua_pushlstring as a
 *   huge size_t.
 *   Lua's runtime:call(req) then returns
 *       rc == 0:  true,  rsp_or_nil, nil
 *       rc != 0:  false, rc (integer), rsp_or_nil
 *
 * Not modelled here: max_queue (default 65536; a full queue makes the Lua
 * call fail before the runtime sees the task).
 * ---------------------------------------------------------------------------
 *
 * What the harness adds: every misuse it can detect without crashing (poll
 * after NULL or on an unknown queue, get_req/respond on a task that is not
 * currently polled, double respond, negative rsp_len) is counted instead of
 * being undefined behaviour. Queues are never freed, so a late poll is still
 * observable; task records live until their response is collected.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { QUEUED, POLLED, RESPONDED };

struct runtime;

struct task {
    struct task *prev, *next; /* registry of live tasks, to vet pointers */
    struct task *qnext;
    struct runtime *rt;
    int state, abandoned;
    char *req;
    int req_len;
    int rc;
    char *rsp;
    int rsp_len;
    pthread_cond_t done;
};

struct runtime {
    struct runtime *next_rt;
    struct task *qhead, **qtail;
    pthread_cond_t nonempty, nulled;
    int finishing, null_returned, outstanding;
};

/* One lock for everything: simplicity beats throughput in a test harness. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct task g_live = {.prev = &g_live, .next = &g_live};
static struct runtime *g_runtimes;
static int g_violations, g_poll_after_null;
static char g_last_violation[256];
static __thread char g_err[512];

static void set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
}

/* caller holds g_mu */
static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_violation, sizeof g_last_violation, fmt, ap);
    va_end(ap);
    g_violations++;
}

static void cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    /* timeouts must not jump with the wall clock */
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

static struct timespec deadline_after(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Returns ETIMEDOUT once the deadline passed; a NULL deadline waits forever. */
static int wait_until(pthread_cond_t *c, const struct timespec *deadline)
{
    if (!deadline)
        return pthread_cond_wait(c, &g_mu);
    return pthread_cond_timedwait(c, &g_mu, deadline);
}

/* Pointers handed back by the runtime are looked up, never trusted. */
static struct runtime *find_runtime(void *p)
{
    for (struct runtime *r = g_runtimes; r; r = r->next_rt)
        if (r == p)
            return r;
    return NULL;
}

static struct task *find_task(void *p)
{
    for (struct task *t = g_live.next; t != &g_live; t = t->next)
        if (t == p)
            return t;
    return NULL;
}

static void release_task(struct task *t)
{
    t->prev->next = t->next;
    t->next->prev = t->prev;
    pthread_cond_destroy(&t->done);
    free(t);
}

/* ---- the three functions nginx exports to runtimes ---- */

void *ngx_http_lua_ffi_task_poll(void *tq)
{
    pthread_mutex_lock(&g_mu);
    struct runtime *rt = find_runtime(tq);
    if (!rt) {
        violation("poll on unknown queue %p", tq);
        pthread_mutex_unlock(&g_mu);
        return NULL;
    }
    for (;;) {
        if (rt->null_returned) {
            /* real nginx: use after free. Also catches a second poller. */
            g_poll_after_null++;
            pthread_mutex_unlock(&g_mu);
            usleep(10000); /* keep a runtime that loops on NULL from spinning */
            return NULL;
        }
        if (rt->qhead) {
            struct task *t = rt->qhead;
            rt->qhead = t->qnext;
            if (!rt->qhead)
                rt->qtail = &rt->qhead;
            t->state = POLLED;
            pthread_mutex_unlock(&g_mu);
            return t;
        }
        if (rt->finishing) {
            rt->null_returned = 1;
            pthread_cond_broadcast(&rt->nonempty); /* flag other pollers */
            pthread_cond_broadcast(&rt->nulled);
            pthread_mutex_unlock(&g_mu);
            return NULL;
        }
        pthread_cond_wait(&rt->nonempty, &g_mu);
    }
}

char *ngx_http_lua_ffi_get_req(void *tsk, int *len)
{
    pthread_mutex_lock(&g_mu);
    struct task *t = find_task(tsk);
    char *req = NULL;
    int n = 0;
    if (!t || t->state != POLLED) {
        violation("get_req on %s task %p", !t ? "an unknown" :
                  t->state == RESPONDED ? "a responded" : "an unpolled", tsk);
    } else {
        req = t->req;
        n = t->req_len;
    }
    pthread_mutex_unlock(&g_mu);
    if (len)
        *len = n;
    return req;
}

void ngx_http_lua_ffi_respond(void *tsk, int rc, char *rsp, int rsp_len)
{
    pthread_mutex_lock(&g_mu);
    struct task *t = find_task(tsk);
    if (!t || t->state != POLLED) {
        /* rsp is left alone: after a bad task pointer nothing is trusted */
        violation("%s respond on task %p",
                  !t ? "unknown-task" : t->state == RESPONDED ? "double" : "unpolled",
                  tsk);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    if (rsp_len < 0) {
        violation("negative rsp_len %d on task %p", rsp_len, tsk);
        free(rsp);
        rsp = NULL;
        rsp_len = 0;
    }
    /* lua-resty-ffi frees the request about now; poison it so a runtime that
     * still reads it sees garbage rather than plausible data */
    if (t->req) {
        memset(t->req, 0xA5, (size_t)t->req_len);
        free(t->req);
        t->req = NULL;
    }
    t->state = RESPONDED;
    t->rc = rc;
    t->rsp = rsp;
    t->rsp_len = rsp_len;
    t->rt->outstanding--;
    if (t->abandoned) {
        /* like an aborted Lua coroutine: the answer is dropped, not leaked */
        free(t->rsp);
        release_task(t);
    } else {
        pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- driver API for tests ---- */

const char *harness_error(void) { return g_err; }

void harness_free(void *p) { free(p); }

void *harness_load(const char *so_path, const char *cfg)
{
    void *so = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        set_error("dlopen: %s", dlerror());
        return NULL;
    }
    /* never dlclose'd, as lua-resty-ffi pins libraries by default */
    int (*init)(char *, void *) = (int (*)(char *, void *))dlsym(so, "libffi_init");
    if (!init) {
        set_error("dlsym libffi_init: %s", dlerror());
        return NULL;
    }

    struct runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        set_error("out of memory");
        return NULL;
    }
    rt->qtail = &rt->qhead;
    cond_init(&rt->nonempty);
    cond_init(&rt->nulled);
    pthread_mutex_lock(&g_mu);
    rt->next_rt = g_runtimes;
    g_runtimes = rt;
    pthread_mutex_unlock(&g_mu);

    size_t n = cfg ? strlen(cfg) : 0;
    char *copy = cfg ? strdup(cfg) : NULL;
    if (cfg && !copy) {
        set_error("out of memory");
        return NULL;
    }
    int rc = init(copy, rt);
    if (copy) {
        /* a runtime that kept the pointer now reads "#####" (or crashes) */
        memset(copy, '#', n);
        free(copy);
    }
    if (rc != 0) {
        /* the queue stays allocated and unfinished, as in lua-resty-ffi */
        set_error("libffi_init returned %d", rc);
        return NULL;
    }
    return rt;
}

void *harness_submit(void *h, const char *req, int len)
{
    struct runtime *rt = h;
    if (!rt || len < 0 || (!req && len)) {
        set_error("bad arguments");
        return NULL;
    }
    struct task *t = calloc(1, sizeof *t);
    char *buf = NULL;
    if (req) {
        buf = malloc((size_t)len + 1);
        if (buf) {
            memcpy(buf, req, (size_t)len);
            buf[len] = '\0'; /* Lua's copy carries the string's NUL */
        }
    }
    if (!t || (req && !buf)) {
        free(t);
        free(buf);
        set_error("out of memory");
        return NULL;
    }
    t->rt = rt;
    t->req = buf;
    t->req_len = req ? len : 0;
    cond_init(&t->done);

    pthread_mutex_lock(&g_mu);
    if (rt->finishing) {
        pthread_mutex_unlock(&g_mu);
        pthread_cond_destroy(&t->done);
        free(buf);
        free(t);
        set_error("task queue is finished");
        return NULL;
    }
    t->next = &g_live;
    t->prev = g_live.prev;
    g_live.prev->next = t;
    g_live.prev = t;
    *rt->qtail = t;
    rt->qtail = &t->qnext;
    rt->outstanding++;
    pthread_cond_signal(&rt->nonempty);
    pthread_mutex_unlock(&g_mu);
    return t;
}

/*
 * 0 with the response, -1 on timeout (timeout_ms < 0 waits forever). Either
 * way the task handle is spent: a late response is dropped like one for an
 * aborted coroutine. *rsp is a NUL-terminated malloc'ed copy (free it with
 * harness_free), NULL when the runtime responded with NULL.
 */
int harness_wait(void *task, int timeout_ms, int *rc, char **rsp, int *rsp_len)
{
    struct task *t = task;
    struct timespec dl;
    if (timeout_ms >= 0)
        dl = deadline_after(timeout_ms);

    pthread_mutex_lock(&g_mu);
    while (t->state != RESPONDED) {
        if (wait_until(&t->done, timeout_ms >= 0 ? &dl : NULL) == ETIMEDOUT &&
            t->state != RESPONDED) {
            t->abandoned = 1;
            pthread_mutex_unlock(&g_mu);
            return -1;
        }
    }
    char *out = NULL;
    int n = 0;
    if (t->rsp) {
        n = t->rsp_len ? t->rsp_len : (int)strlen(t->rsp);
        out = malloc((size_t)n + 1);
        if (out) {
            memcpy(out, t->rsp, (size_t)n);
            out[n] = '\0';
        }
        free(t->rsp);
    }
    if (rc)
        *rc = t->rc;
    if (rsp)
        *rsp = out;
    else
        free(out);
    if (rsp_len)
        *rsp_len = out ? n : 0;
    release_task(t);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* 1 once the task has its response (collect it with harness_wait), else 0.
 * Lets a Lua stand-in of lua-resty-ffi poll from nginx's event loop. */
int harness_done(void *task)
{
    struct task *t = task;
    pthread_mutex_lock(&g_mu);
    int done = t->state == RESPONDED;
    pthread_mutex_unlock(&g_mu);
    return done;
}

/* As harness_wait; -2 if the task could not be submitted (see harness_error). */
int harness_call(void *h, const char *req, int len, int timeout_ms,
                 int *rc, char **rsp, int *rsp_len)
{
    void *t = harness_submit(h, req, len);
    if (!t)
        return -2;
    return harness_wait(t, timeout_ms, rc, rsp, rsp_len);
}

/*
 * What runtime:__unload() does: pending tasks are still delivered, then poll
 * returns NULL. Returns 0 once that NULL was returned (after a short settle so
 * an immediate re-poll is counted), -1 if it did not happen within 5 s.
 */
int harness_shutdown(void *h)
{
    struct runtime *rt = h;
    struct timespec dl = deadline_after(5000);
    pthread_mutex_lock(&g_mu);
    rt->finishing = 1;
    pthread_cond_broadcast(&rt->nonempty);
    while (!rt->null_returned && wait_until(&rt->nulled, &dl) != ETIMEDOUT)
        ;
    int ok = rt->null_returned;
    pthread_mutex_unlock(&g_mu);
    if (ok)
        usleep(100000);
    return ok ? 0 : -1;
}

/* Tasks submitted on h that the runtime has not responded to yet. */
int harness_outstanding(void *h)
{
    pthread_mutex_lock(&g_mu);
    int n = ((struct runtime *)h)->outstanding;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Process-wide: a bad task pointer cannot be attributed to one runtime. */
int harness_violations(void)
{
    pthread_mutex_lock(&g_mu);
    int n = g_violations;
    pthread_mutex_unlock(&g_mu);
    return n;
}

int harness_poll_after_null(void)
{
    pthread_mutex_lock(&g_mu);
    int n = g_poll_after_null;
    pthread_mutex_unlock(&g_mu);
    return n;
}

/* Copied out under the lock: the runtime may add a violation meanwhile. */
const char *harness_last_violation(void)
{
    static __thread char copy[sizeof g_last_violation];
    pthread_mutex_lock(&g_mu);
    memcpy(copy, g_last_violation, sizeof copy);
    pthread_mutex_unlock(&g_mu);
    return copy;
}

void harness_reset_counters(void)
{
    pthread_mutex_lock(&g_mu);
    g_violations = 0;
    g_poll_after_null = 0;
    g_last_violation[0] = '\0';
    pthread_mutex_unlock(&g_mu);
}
