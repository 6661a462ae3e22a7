/*
 * Test-only runtime for the harness self-test: a minimal well-behaved
 * lua-resty-ffi library, plus switches that misbehave on purpose so the
 * harness's detectors can be checked.
 *
 *   cfg "fail"    libffi_init returns 7
 *   cfg "repoll"  polls once more after NULL (a violation)
 *   req "err..."  rc 1, rsp = "failed: <cfg>" as a C string (rsp_len 0)
 *   req "dup..."  responds twice (a violation)
 *   req "slow..." sleeps 300 ms first
 *   req NULL      rc 0, rsp NULL
 *   otherwise     rc 0, the request uppercased, explicit length
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *ngx_http_lua_ffi_task_poll(void *tq);
char *ngx_http_lua_ffi_get_req(void *tsk, int *len);
void ngx_http_lua_ffi_respond(void *tsk, int rc, char *rsp, int rsp_len);

struct state {
    void *tq;
    char *cfg; /* our own copy: the caller frees its string after init */
};

static int starts(const char *req, int len, const char *prefix)
{
    size_t n = strlen(prefix);
    return req && (size_t)len >= n && memcmp(req, prefix, n) == 0;
}

static void serve(struct state *st, void *task)
{
    int len;
    char *req = ngx_http_lua_ffi_get_req(task, &len);
    if (!req) {
        ngx_http_lua_ffi_respond(task, 0, NULL, 0);
        return;
    }
    if (starts(req, len, "err")) {
        char *msg = malloc(strlen(st->cfg) + 16);
        sprintf(msg, "failed: %s", st->cfg);
        ngx_http_lua_ffi_respond(task, 1, msg, 0);
        return;
    }
    if (starts(req, len, "slow"))
        usleep(300000);
    int dup = starts(req, len, "dup");
    /* NUL-terminated: an empty echo (length 0) is then read as "". */
    char *out = calloc((size_t)len + 1, 1);
    for (int i = 0; i < len; i++)
        out[i] = (char)toupper((unsigned char)req[i]);
    ngx_http_lua_ffi_respond(task, 0, out, len);
    if (dup)
        ngx_http_lua_ffi_respond(task, 0, NULL, 0);
}

static void *poller(void *arg)
{
    struct state *st = arg;
    void *task;
    while ((task = ngx_http_lua_ffi_task_poll(st->tq)) != NULL)
        serve(st, task);
    if (strcmp(st->cfg, "repoll") == 0)
        ngx_http_lua_ffi_task_poll(st->tq);
    free(st->cfg);
    free(st);
    return NULL;
}

int libffi_init(char *cfg, void *tq)
{
    if (cfg && strcmp(cfg, "fail") == 0)
        return 7;
    struct state *st = malloc(sizeof *st);
    st->tq = tq;
    st->cfg = strdup(cfg ? cfg : "");
    pthread_t th;
    if (pthread_create(&th, NULL, poller, st) != 0) {
        free(st->cfg);
        free(st);
        return 1;
    }
    pthread_detach(th);
    return 0;
}
