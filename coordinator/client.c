/* client.c — submit / status / cancel / wait (see client.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "client.h"

#include <errno.h>
#include <libgen.h> /* dirname */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "errors.h"
#include "fileio.h"  /* tah_file_read */
#include "jobfile.h" /* jobfile_parse, jobfile_check_files */
#include "keys.h"    /* keys_read_public, keys_read_secret, keys_set_client */
#include "wire.h"

/* One request, one answer. NULL after printing why. */
static Tah__Envelope *s_request(const coord_client_opts_t *o, Tah__Envelope *req)
{
    char ep[300], err[512];
    if (wire_endpoint(o->coordinator, ep, sizeof ep, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: --coordinator %s\n", err);
        return NULL;
    }
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    Tah__Envelope *rep = NULL;
    if (o->coordinator_key || o->key) {
        char spub[KEYS_Z85_LEN + 1];
        keys_pair_t kp;
        if (!o->coordinator_key || !o->key) {
            fprintf(stderr, "tah-coord: --coordinator-key and --key go together (HINT: --coordinator-key "
                            "STATE_DIR/coord.pub --key STATE_DIR/admin.key)\n");
            goto out;
        }
        if (keys_read_public(o->coordinator_key, spub, err, sizeof err) != 0 ||
            keys_read_secret(o->key, &kp, err, sizeof err) != 0 || keys_set_client(s, spub, &kp, err, sizeof err) != 0) {
            fprintf(stderr, "tah-coord: %s\n", err);
            goto out;
        }
    }
    if (zmq_connect(s, ep) != 0) {
        fprintf(stderr, "tah-coord: cannot connect to %s: %s\n", ep, zmq_strerror(errno));
        goto out;
    }
    if (wire_send_envelope(s, NULL, 0, req, 0) != 0) {
        fprintf(stderr, "tah-coord: send to %s failed: %s\n", ep, zmq_strerror(errno));
        goto out;
    }
    int timed_out = 0;
    rep = wire_recv_envelope(s, o->timeout_ms, &timed_out, err, sizeof err);
    if (!rep) {
        if (timed_out)
            fprintf(stderr, "tah-coord: no answer from the coordinator at %s within %d ms; HINT: is `tah-coord serve` running there? %s\n",
                    ep, o->timeout_ms,
                    o->coordinator_key ? "is --coordinator-key its STATE_DIR/coord.pub?"
                                       : "a secure coordinator needs --coordinator-key and --key");
        else
            fprintf(stderr, "tah-coord: bad answer from %s: %s\n", ep, err);
        goto out;
    }
    if (rep->body_case == TAH__ENVELOPE__BODY_ERROR) {
        fprintf(stderr, "tah-coord: %s\n", rep->error->message);
        wire_envelope_free(&rep);
    }
out:
    zmq_close(s);
    zmq_ctx_term(ctx);
    return rep;
}

int coord_submit_ini(const coord_client_opts_t *o, const char *ini, const char *base_dir, const char *fname,
                     uint64_t *job)
{
    Tah__SubmitReq sr = TAH__SUBMIT_REQ__INIT;
    sr.ini = (char *)ini;
    sr.base_dir = (char *)base_dir;
    sr.file_name = (char *)fname;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_SUBMIT;
    env.submit = &sr;
    Tah__Envelope *rep = s_request(o, &env);
    if (!rep)
        return TAH_EIO;
    int rc = TAH_EIO;
    if (rep->body_case == TAH__ENVELOPE__BODY_SUBMIT_REP) {
        *job = rep->submit_rep->job;
        rc = 0;
    } else {
        fprintf(stderr, "tah-coord: unexpected answer '%s'\n", wire_body_name(rep));
    }
    wire_envelope_free(&rep);
    return rc;
}

int coord_submit(const coord_client_opts_t *o, const char *job_file)
{
    uint8_t *text = NULL;
    size_t len = 0;
    char err[1024];
    int rc = 1;
    job_spec_t *spec = malloc(sizeof *spec);
    if (!spec)
        return 1;
    if (tah_file_read(job_file, WIRE_MAX_CONTROL / 2, &text, &len, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s\n", err);
        goto out;
    }
    char *ini = malloc(len + 1);
    if (!ini)
        goto out;
    memcpy(ini, text, len);
    ini[len] = 0;
    free(text);
    text = (uint8_t *)ini;
    if (strlen(ini) != len) {
        fprintf(stderr, "tah-coord: %s: contains a NUL byte; not a job file\n", job_file);
        goto out;
    }
    if (jobfile_parse(ini, job_file, spec, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s\n", err);
        goto out;
    }
    char pathcopy[PATH_MAX], base[PATH_MAX];
    snprintf(pathcopy, sizeof pathcopy, "%s", job_file);
    if (!realpath(dirname(pathcopy), base)) {
        fprintf(stderr, "tah-coord: %s: cannot resolve its directory: %s\n", job_file, strerror(errno));
        goto out;
    }
    if (jobfile_check_files(spec, base, err, sizeof err) != 0) {
        fprintf(stderr, "tah-coord: %s: %s\n", job_file, err);
        goto out;
    }
    uint64_t id = 0;
    if (coord_submit_ini(o, ini, base, job_file, &id) == 0) {
        printf("%llu\n", (unsigned long long)id);
        rc = 0;
    }
out:
    free(text);
    free(spec);
    return rc;
}

static void s_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void s_print_json(const Tah__StatusRep *r)
{
    FILE *f = stdout;
    fprintf(f, "{\"jobs\":[");
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Tah__JobInfo *j = r->jobs[i];
        fprintf(f, "%s{\"id\":%llu,\"name\":", i ? "," : "", (unsigned long long)j->id);
        s_json_str(f, j->name);
        fprintf(f, ",\"state\":");
        s_json_str(f, j->state);
        fprintf(f, ",\"reason\":");
        s_json_str(f, j->reason);
        fprintf(f, ",\"step\":%d,\"steps\":%d,\"stages\":%u,", j->step, j->steps, j->stages);
        if (j->has_loss)
            fprintf(f, "\"loss\":%.6f,", j->loss);
        else
            fprintf(f, "\"loss\":null,");
        fprintf(f, "\"tokens_per_s\":%.1f,\"metrics\":", j->tokens_per_s);
        s_json_str(f, j->metrics_path);
        fprintf(f, ",\"link_shaping\":");
        s_json_str(f, j->link_shaping);
        fprintf(f, ",\"submitted\":%.3f,\"finished\":%.3f,\"nodes\":[", j->submitted, j->finished);
        for (size_t k = 0; k < j->n_nodes; k++) {
            fprintf(f, "%s", k ? "," : "");
            s_json_str(f, j->nodes[k]);
        }
        fprintf(f, "],\"links\":[");
        for (size_t k = 0; k < j->n_links; k++) {
            const Tah__LinkInfo *l = j->links[k];
            fprintf(f, "%s{\"src\":%u,\"dst\":%u,\"bytes\":%llu,\"fp32_bytes\":%llu,\"compression\":%.3f,"
                       "\"throughput_bytes_per_s\":%.1f}",
                    k ? "," : "", l->src_stage, l->dst_stage, (unsigned long long)l->bytes,
                    (unsigned long long)l->fp32_bytes, l->bytes ? (double)l->fp32_bytes / (double)l->bytes : 1.0,
                    l->seconds > 0 ? (double)l->bytes / l->seconds : 0.0);
        }
        fprintf(f, "],\"ckpt_step\":%d,\"recoveries\":%u,\"events\":[", j->ckpt_step, j->recoveries);
        for (size_t k = 0; k < j->n_events; k++) {
            const Tah__EventInfo *ev = j->events[k];
            fprintf(f, "%s{\"time\":%.3f,\"kind\":", k ? "," : "", ev->time);
            s_json_str(f, ev->kind);
            fprintf(f, ",\"node\":");
            s_json_str(f, ev->node);
            fprintf(f, ",\"stage\":%d,\"step\":%d,\"detail\":", ev->stage, ev->step);
            s_json_str(f, ev->detail);
            fprintf(f, "}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "],\"nodes\":[");
    for (size_t i = 0; i < r->n_nodes; i++) {
        const Tah__NodeInfo *n = r->nodes[i];
        fprintf(f, "%s{\"name\":", i ? "," : "");
        s_json_str(f, n->name);
        fprintf(f, ",\"state\":");
        s_json_str(f, n->state);
        fprintf(f, ",\"job\":%llu,\"stage\":%d,\"backend\":", (unsigned long long)n->job, n->stage);
        s_json_str(f, n->backend);
        fprintf(f, ",\"threads\":%u,\"gflops\":%.2f,\"last_heartbeat_s\":%.3f,\"endpoint\":", n->threads, n->gflops,
                n->last_heartbeat);
        s_json_str(f, n->endpoint);
        fprintf(f, ",\"rejected\":%llu,\"gflops_bf16\":%.2f,\"device_id\":", (unsigned long long)n->rejected,
                n->gflops_bf16);
        s_json_str(f, n->device_id);
        fprintf(f, ",\"seed_rules\":%u}", n->seed_rules);
    }
    fprintf(f, "],\"rejected\":%llu}\n", (unsigned long long)r->rejected);
}

static void s_fmt_bytes(char *buf, size_t n, double b)
{
    if (b >= 1e9)
        snprintf(buf, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, n, "%.2f MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(buf, n, "%.1f kB", b / 1e3);
    else
        snprintf(buf, n, "%.0f B", b);
}

static void s_print_text(const Tah__StatusRep *r)
{
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Tah__JobInfo *j = r->jobs[i];
        printf("job %llu '%s': %s", (unsigned long long)j->id, j->name, j->state);
        if (j->reason[0])
            printf(": %s", j->reason);
        printf("\n  step %d/%d, %u stages", j->step, j->steps, j->stages);
        if (j->has_loss)
            printf(", loss %.4f, %.0f tokens/s", j->loss, j->tokens_per_s);
        printf("\n  metrics %s\n", j->metrics_path);
        if (j->ckpt_step || j->recoveries)
            printf("  checkpoint replicas complete at step %d; %u recoveries\n", j->ckpt_step, j->recoveries);
        for (size_t k = 0; k < j->n_events; k++) {
            const Tah__EventInfo *ev = j->events[k];
            printf("  event %s at step %d", ev->kind, ev->step);
            if (ev->node[0])
                printf(" node %s", ev->node);
            if (ev->stage >= 0)
                printf(" stage %d", ev->stage);
            if (ev->detail[0])
                printf(": %s", ev->detail);
            printf("\n");
        }
        if (j->link_shaping[0])
            printf("  links: %s\n", j->link_shaping);
        if (j->n_nodes) {
            printf("  stages:");
            for (size_t k = 0; k < j->n_nodes; k++)
                printf(" %zu=%s", k, j->nodes[k]);
            printf("\n");
        }
        for (size_t k = 0; k < j->n_links; k++) {
            const Tah__LinkInfo *l = j->links[k];
            char b[32], t[32];
            s_fmt_bytes(b, sizeof b, (double)l->bytes);
            s_fmt_bytes(t, sizeof t, l->seconds > 0 ? (double)l->bytes / l->seconds : 0.0);
            printf("  link %u->%u: %s sent, compression %.2fx, %s/s\n", l->src_stage, l->dst_stage, b,
                   l->bytes ? (double)l->fp32_bytes / (double)l->bytes : 1.0, t);
        }
    }
    if (r->n_nodes)
        printf("nodes:\n");
    for (size_t i = 0; i < r->n_nodes; i++) {
        const Tah__NodeInfo *n = r->nodes[i];
        printf("  %-16s %-5s", n->name, n->state);
        if (n->stage >= 0)
            printf(" job %llu stage %d", (unsigned long long)n->job, n->stage);
        if (n->gflops_bf16 > 0.0) /* a GPU node: its fp32 and bf16 matrix products */
            printf(" | %s, %.0f GFLOP/s fp32, %.0f bf16", n->backend, n->gflops, n->gflops_bf16);
        else
            printf(" | %s, %u threads, %.1f GFLOP/s", n->backend, n->threads, n->gflops);
        printf(" | heartbeat %.1f s ago | rejected %llu | %s", n->last_heartbeat, (unsigned long long)n->rejected,
               n->endpoint);
        if (n->seed_rules != CODEC_SEED_RULES) /* kept off jobs with stochastic link codecs */
            printf(" | another build (codec seed rules %u)", n->seed_rules);
        printf("\n");
    }
    if (r->rejected)
        printf("coordinator: %llu malformed control messages rejected\n", (unsigned long long)r->rejected);
}

Tah__Envelope *coord_status_get(const coord_client_opts_t *o, uint64_t job)
{
    Tah__StatusReq sr = TAH__STATUS_REQ__INIT;
    sr.job = job;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_STATUS;
    env.status = &sr;
    Tah__Envelope *rep = s_request(o, &env);
    if (rep && rep->body_case != TAH__ENVELOPE__BODY_STATUS_REP) {
        fprintf(stderr, "tah-coord: unexpected answer '%s'\n", wire_body_name(rep));
        wire_envelope_free(&rep);
    }
    return rep;
}

int coord_status(const coord_client_opts_t *o, uint64_t job)
{
    Tah__Envelope *rep = coord_status_get(o, job);
    if (!rep)
        return 1;
    if (o->json)
        s_print_json(rep->status_rep);
    else
        s_print_text(rep->status_rep);
    wire_envelope_free(&rep);
    return 0;
}

int coord_cancel(const coord_client_opts_t *o, uint64_t job)
{
    Tah__CancelReq cr = TAH__CANCEL_REQ__INIT;
    cr.job = job;
    Tah__Envelope env = TAH__ENVELOPE__INIT;
    env.body_case = TAH__ENVELOPE__BODY_CANCEL;
    env.cancel = &cr;
    Tah__Envelope *rep = s_request(o, &env);
    if (!rep)
        return 1;
    int ok = rep->body_case == TAH__ENVELOPE__BODY_OK;
    if (ok)
        printf("job %llu cancelled\n", (unsigned long long)job);
    wire_envelope_free(&rep);
    return ok ? 0 : 1;
}

int coord_wait(const coord_client_opts_t *o, uint64_t job)
{
    for (;;) {
        Tah__Envelope *rep = coord_status_get(o, job);
        if (!rep)
            return 1;
        const Tah__StatusRep *r = rep->status_rep;
        if (r->n_jobs != 1) {
            fprintf(stderr, "tah-coord: coordinator does not list job %llu\n", (unsigned long long)job);
            wire_envelope_free(&rep);
            return 1;
        }
        const Tah__JobInfo *j = r->jobs[0];
        if (strcmp(j->state, "queued") != 0 && strcmp(j->state, "running") != 0 && strcmp(j->state, "paused") != 0) {
            int ok = !strcmp(j->state, "succeeded");
            printf("job %llu %s", (unsigned long long)job, j->state);
            if (j->reason[0])
                printf(": %s", j->reason);
            printf(" (step %d/%d", j->step, j->steps);
            if (j->has_loss)
                printf(", loss %.4f", j->loss);
            printf(")\nmetrics: %s\n", j->metrics_path);
            wire_envelope_free(&rep);
            return ok ? 0 : 1;
        }
        wire_envelope_free(&rep);
        struct timespec ts = { 0, 300 * 1000000L };
        nanosleep(&ts, NULL);
    }
}

int coord_token_create(const coord_client_opts_t *o, uint64_t job, int64_t expires_s)
{
    Tah__TokenReq r = TAH__TOKEN_REQ__INIT;
    r.job = job;
    r.expires_s = expires_s;
    Tah__Envelope req = TAH__ENVELOPE__INIT;
    req.body_case = TAH__ENVELOPE__BODY_TOKEN_REQ;
    req.token_req = &r;
    Tah__Envelope *rep = s_request(o, &req);
    if (!rep)
        return 1;
    int rc = 1;
    if (rep->body_case == TAH__ENVELOPE__BODY_TOKEN_REP) {
        printf("%s\n", rep->token_rep->token);
        rc = 0;
    } else {
        fprintf(stderr, "tah-coord: unexpected answer '%s' to a token request\n", wire_body_name(rep));
    }
    wire_envelope_free(&rep);
    return rc;
}
