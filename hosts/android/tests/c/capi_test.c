/*
 * The C API as a C program uses it (frugal.h, libfrugal.a), natively and on aarch64 under
 * qemu-aarch64 (`cargo xtask android` builds and runs both):
 *
 *   capi_test MODEL.frgm TRAIN-IMAGES.idx TRAIN-LABELS.idx TEST-IMAGES.idx TEST-LABELS.idx
 *
 * 1. Walks every error path: NULL and misaligned pointers, bad lengths, wrong shapes and labels,
 *    corrupt model and weights bytes, budgets below the smallest plan, buffers too small, handles
 *    that were never made or were destroyed, and a trainer used from two threads at once.
 * 2. Trains the bundled digits MLP on a background thread within a budget of 4x the smallest plan,
 *    drops the budget to a quarter from the main thread while a step is in flight (the step switches
 *    plans before its next instruction, the arena shrinks when it ends), keeps training inside the
 *    quarter, and checks >= 95 % held-out accuracy.
 * Exits 0 and prints "N passed, 0 failed" when every check holds.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frugal.h"

static int passed, failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            passed++;                                                      \
        } else {                                                           \
            failed++;                                                      \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " (last error: %s)\n", frugal_last_error());   \
        }                                                                  \
    } while (0)

/* `call` returns `want` and, for a failure, leaves a non-empty message. */
#define EXPECT(call, want)                                                   \
    do {                                                                     \
        FrugalStatus s_ = (call);                                            \
        CHECK(s_ == (want), "%s returned %d, want %d", #call, (int)s_, (int)(want)); \
        if ((want) != FRUGAL_STATUS_OK)                                      \
            CHECK(frugal_last_error()[0] != 0, "no message after %s", #call); \
        else                                                                 \
            CHECK(frugal_last_error()[0] == 0, "a message after success: %s", #call); \
    } while (0)

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len ? *len : 1);
    if (fread(b, 1, *len, f) != *len) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    return b;
}

/* IDX digits: 16-byte image header, 8-byte label header; pixels 0..16 scaled to [0, 1]. */
static size_t load_digits(const char *images, const char *labels, float **x, uint32_t **y) {
    size_t li, ll;
    unsigned char *im = read_file(images, &li), *lb = read_file(labels, &ll);
    size_t n = ll - 8;
    *x = malloc(n * 64 * sizeof(float));
    *y = malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n * 64; i++) (*x)[i] = im[16 + i] / 16.0f;
    for (size_t i = 0; i < n; i++) (*y)[i] = lb[8 + i];
    free(im);
    free(lb);
    return n;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static FrugalPlanInfo info_of(FrugalTrainer t) {
    FrugalPlanInfo p;
    memset(&p, 0, sizeof p);
    if (frugal_plan_info(t, &p) != FRUGAL_STATUS_OK) {
        fprintf(stderr, "plan_info failed: %s\n", frugal_last_error());
        exit(1);
    }
    return p;
}

struct job {
    FrugalTrainer t;
    uint32_t steps, done;
    float *losses;
    FrugalStatus status;
};

static void *train(void *arg) {
    struct job *j = arg;
    j->status = frugal_train_steps(j->t, j->steps, j->losses, j->steps, &j->done);
    return NULL;
}

static void error_paths(const unsigned char *model, size_t model_len, const float *x,
                        const uint32_t *y, size_t n) {
    FrugalTrainer t = 12345;
    FrugalOptions o = frugal_options_default();
    const unsigned char junk[32] = {1, 2, 3};

    CHECK(frugal_abi_version() == FRUGAL_ABI_VERSION, "ABI version %u", frugal_abi_version());
    /* create */
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, NULL),
           FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_create(NULL, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, &t),
           FRUGAL_STATUS_NULL_POINTER);
    CHECK(t == 0, "a failed create leaves 0 in *out, got %llu", (unsigned long long)t);
    EXPECT(frugal_create(model, 0, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, &t), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_create(junk, sizeof junk, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, &t), FRUGAL_STATUS_MODEL);
    EXPECT(frugal_create(model, model_len - 1, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, &t), FRUGAL_STATUS_MODEL);
    EXPECT(frugal_create(model, model_len, junk, sizeof junk, FRUGAL_BUDGET_UNLIMITED, &o, &t),
           FRUGAL_STATUS_WEIGHTS);
    EXPECT(frugal_create(model, model_len, NULL, 5, FRUGAL_BUDGET_UNLIMITED, &o, &t),
           FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_create(model, model_len, NULL, 0, 1000, &o, &t), FRUGAL_STATUS_BUDGET);
    uint64_t needed = frugal_last_error_needed_bytes();
    CHECK(needed > 1000, "a budget error names the smallest budget, got %llu",
          (unsigned long long)needed);
    FrugalOptions bad = o;
    bad.size = 8;
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &bad, &t), FRUGAL_STATUS_ARGUMENT);
    bad = o;
    bad.flags = 6;
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &bad, &t), FRUGAL_STATUS_ARGUMENT);
    bad = o;
    bad.batch = 0;
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &bad, &t), FRUGAL_STATUS_ARGUMENT);
    CHECK(frugal_live_trainers() == 0, "failed creates leave no trainer, %zu live",
          frugal_live_trainers());

    /* a good one, at the smallest budget the failure named */
    EXPECT(frugal_create(model, model_len, NULL, 0, needed, NULL, &t), FRUGAL_STATUS_OK);
    CHECK(t != 0, "a handle");
    FrugalPlanInfo p = info_of(t);
    CHECK(p.floor_bytes == needed && p.allocated_bytes <= needed && p.rung == 0,
          "floor %llu allocated %llu rung %u", (unsigned long long)p.floor_bytes,
          (unsigned long long)p.allocated_bytes, p.rung);

    /* samples */
    float nan_x[64];
    memcpy(nan_x, x, sizeof nan_x);
    nan_x[5] = NAN;
    EXPECT(frugal_add_sample(t, NULL, 64, 0), FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_add_sample(t, x, 63, 0), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_add_sample(t, x, 0, 0), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_add_sample(t, x, 64, 10), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_add_sample(t, nan_x, 64, 0), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_add_sample(t, (const float *)((const char *)x + 1), 64, 0), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_add_sample(t, x, SIZE_MAX / 2, 0), FRUGAL_STATUS_ARGUMENT);
    float losses[4];
    uint32_t done = 99;
    EXPECT(frugal_train_steps(t, 1, losses, 4, &done), FRUGAL_STATUS_ARGUMENT); /* no samples */
    CHECK(done == 0, "no step done, got %u", done);
    for (size_t i = 0; i < 40 && i < n; i++) EXPECT(frugal_add_sample(t, x + i * 64, 64, y[i]), FRUGAL_STATUS_OK);
    EXPECT(frugal_train_steps(t, 5, losses, 4, &done), FRUGAL_STATUS_BUFFER_TOO_SMALL);
    EXPECT(frugal_train_steps(t, 2, losses, 4, &done), FRUGAL_STATUS_OK);
    CHECK(done == 2 && isfinite(losses[0]) && isfinite(losses[1]), "done %u", done);
    EXPECT(frugal_train_steps(t, 1, NULL, 0, NULL), FRUGAL_STATUS_OK);
    EXPECT(frugal_train_steps(t, 1, NULL, 1, NULL), FRUGAL_STATUS_NULL_POINTER);

    /* predict */
    float probs[20];
    EXPECT(frugal_predict(t, x, 128, probs, 19), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_predict(t, x, 100, probs, 20), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_predict(t, x, 128, NULL, 20), FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_predict(t, nan_x, 64, probs, 10), FRUGAL_STATUS_ARGUMENT);
    EXPECT(frugal_predict(t, x, 128, probs, 20), FRUGAL_STATUS_OK);
    float sum = 0;
    for (int i = 0; i < 10; i++) sum += probs[i];
    CHECK(fabsf(sum - 1.0f) < 1e-4f, "probabilities sum to %f", sum);

    /* budgets */
    EXPECT(frugal_set_budget(t, p.floor_bytes - 1), FRUGAL_STATUS_BUDGET);
    CHECK(frugal_last_error_needed_bytes() == p.floor_bytes, "needed %llu",
          (unsigned long long)frugal_last_error_needed_bytes());
    EXPECT(frugal_set_budget(t, FRUGAL_BUDGET_UNLIMITED), FRUGAL_STATUS_OK);
    FrugalPlanInfo q = info_of(t);
    CHECK(q.rung == q.rungs - 1 && q.budget == FRUGAL_BUDGET_UNLIMITED && q.switches == 1,
          "rung %u of %u, switches %llu", q.rung, q.rungs, (unsigned long long)q.switches);
    EXPECT(frugal_plan_info(t, NULL), FRUGAL_STATUS_NULL_POINTER);

    /* weights */
    size_t written = 0;
    EXPECT(frugal_export_weights(t, NULL, 0, NULL), FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_export_weights(t, NULL, 0, &written), FRUGAL_STATUS_OK);
    CHECK(written > 64 * 128 * 4, "weights size %zu", written);
    unsigned char small[16];
    size_t w2 = 0;
    EXPECT(frugal_export_weights(t, small, sizeof small, &w2), FRUGAL_STATUS_BUFFER_TOO_SMALL);
    CHECK(w2 == written, "the needed size is written: %zu vs %zu", w2, written);
    unsigned char *wb = malloc(written);
    EXPECT(frugal_export_weights(t, wb, written, &w2), FRUGAL_STATUS_OK);
    /* the exported weights load back with the same predictions */
    FrugalTrainer u = 0;
    EXPECT(frugal_create(model, model_len, wb, written, FRUGAL_BUDGET_UNLIMITED, &o, &u), FRUGAL_STATUS_OK);
    float probs2[20];
    EXPECT(frugal_predict(u, x, 128, probs2, 20), FRUGAL_STATUS_OK);
    CHECK(memcmp(probs, probs2, sizeof probs) == 0, "same predictions from the exported weights");
    free(wb);
    CHECK(frugal_live_trainers() == 2, "%zu live", frugal_live_trainers());

    /* two threads at once: the second call is BUSY; set_budget and plan_info never are. The
     * background run is sized to last about half a second on this machine. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    EXPECT(frugal_train_steps(t, 20, NULL, 0, NULL), FRUGAL_STATUS_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double step_s = ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 20;
    uint32_t long_run = (uint32_t)(0.5 / (step_s > 1e-7 ? step_s : 1e-7));
    long_run = long_run < 50 ? 50 : long_run > 200000 ? 200000 : long_run;
    q = info_of(t);
    struct job j = {.t = t, .steps = long_run, .losses = malloc(long_run * sizeof(float))};
    pthread_t th;
    pthread_create(&th, NULL, train, &j);
    while (info_of(t).steps < q.steps + 2) sleep_ms(1);
    EXPECT(frugal_add_sample(t, x, 64, 0), FRUGAL_STATUS_BUSY);
    EXPECT(frugal_predict(t, x, 64, probs, 10), FRUGAL_STATUS_BUSY);
    EXPECT(frugal_export_weights(t, NULL, 0, &written), FRUGAL_STATUS_BUSY);
    EXPECT(frugal_train_steps(t, 1, NULL, 0, NULL), FRUGAL_STATUS_BUSY);
    EXPECT(frugal_set_budget(t, p.floor_bytes), FRUGAL_STATUS_OK);
    EXPECT(frugal_plan_info(t, &q), FRUGAL_STATUS_OK);
    EXPECT(frugal_predict(u, x, 64, probs, 10), FRUGAL_STATUS_OK); /* another trainer is free */
    pthread_join(th, NULL);
    CHECK(j.status == FRUGAL_STATUS_OK && j.done == long_run, "background run: status %d, %u steps",
          (int)j.status, j.done);
    free(j.losses);
    q = info_of(t);
    CHECK(q.rung == 0 && q.allocated_bytes <= p.floor_bytes, "the budget set meanwhile holds: rung %u",
          q.rung);

    /* destroyed and made-up handles */
    EXPECT(frugal_destroy(t), FRUGAL_STATUS_OK);
    EXPECT(frugal_destroy(t), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_add_sample(t, x, 64, 0), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_train_steps(t, 1, NULL, 0, NULL), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_predict(t, x, 64, probs, 10), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_set_budget(t, FRUGAL_BUDGET_UNLIMITED), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_plan_info(t, &q), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_export_weights(t, NULL, 0, &written), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_clear_samples(t), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_plan_info(0, &q), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_plan_info(0xdeadbeefULL << 20, &q), FRUGAL_STATUS_HANDLE);
    /* a new trainer may reuse the slot; the old handle still names nothing */
    FrugalTrainer v = 0;
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, NULL, &v), FRUGAL_STATUS_OK);
    CHECK(v != t, "a fresh handle");
    EXPECT(frugal_plan_info(t, &q), FRUGAL_STATUS_HANDLE);
    EXPECT(frugal_destroy(v), FRUGAL_STATUS_OK);
    EXPECT(frugal_destroy(u), FRUGAL_STATUS_OK);
    CHECK(frugal_live_trainers() == 0, "%zu live", frugal_live_trainers());

    /* the memory policy */
    FrugalMemorySignal s = {64u << 20, 2u << 20, FRUGAL_TRIM_RUNNING_LOW, 0, 0, 0};
    uint64_t b = 0;
    EXPECT(frugal_budget_for_memory(&s, &b), FRUGAL_STATUS_OK);
    CHECK(b == (16u << 20), "RUNNING_LOW quarters the ceiling: %llu", (unsigned long long)b);
    EXPECT(frugal_budget_for_memory(NULL, &b), FRUGAL_STATUS_NULL_POINTER);
    EXPECT(frugal_budget_for_memory(&s, NULL), FRUGAL_STATUS_NULL_POINTER);
}

static void training(const unsigned char *model, size_t model_len, const float *x, const uint32_t *y,
                     size_t n, const float *tx, const uint32_t *ty, size_t tn) {
    FrugalTrainer t = 0;
    FrugalOptions o = frugal_options_default();
    o.flags = FRUGAL_OPTION_SEED;
    o.seed = 7;
    EXPECT(frugal_create(model, model_len, NULL, 0, FRUGAL_BUDGET_UNLIMITED, &o, &t), FRUGAL_STATUS_OK);
    const uint64_t floor = info_of(t).floor_bytes, budget = 4 * floor, quarter = budget / 4;
    EXPECT(frugal_set_budget(t, budget), FRUGAL_STATUS_OK);
    for (size_t i = 0; i < n; i++) EXPECT(frugal_add_sample(t, x + i * 64, 64, y[i]), FRUGAL_STATUS_OK);
    FrugalPlanInfo before = info_of(t);
    printf("digits MLP, batch %u: plans from %llu to %llu bytes in %u rungs; budget %llu, then %llu\n",
           before.micro_batch, (unsigned long long)before.floor_bytes,
           (unsigned long long)before.allocated_bytes, before.rungs, (unsigned long long)budget,
           (unsigned long long)quarter);

    const uint32_t epoch = (uint32_t)((n + 31) / 32), steps = 14 * epoch;
    struct job j = {.t = t, .steps = steps, .losses = malloc(steps * sizeof(float))};
    pthread_t th;
    pthread_create(&th, NULL, train, &j);
    /* Drop to a quarter while steps run. A drop that lands between two steps switches at the next
     * step's start instead; then the budget goes back up (lazily, after a step) and drops again. */
    FrugalPlanInfo p;
    int tries = 0;
    do {
        uint32_t at = info_of(t).steps + epoch;
        while (info_of(t).steps < at) sleep_ms(1);
        tries++;
        if (tries > 1) {
            EXPECT(frugal_set_budget(t, budget), FRUGAL_STATUS_OK);
            at = info_of(t).steps + 2;
            while (info_of(t).steps < at) sleep_ms(1);
        }
        EXPECT(frugal_set_budget(t, quarter), FRUGAL_STATUS_OK);
        at = info_of(t).steps + 1;
        while (info_of(t).steps < at) sleep_ms(1);
        p = info_of(t);
    } while (p.mid_step_switches == 0 && tries < 5);
    printf("drop to a quarter at step %u (try %d): rung %u, %u recomputes, allocated %llu bytes, "
           "%llu switches (%llu mid-step)\n",
           p.steps, tries, p.rung, p.recomputes, (unsigned long long)p.allocated_bytes,
           (unsigned long long)p.switches, (unsigned long long)p.mid_step_switches);
    CHECK(p.mid_step_switches >= 1, "a switch mid-step");
    CHECK(p.rung == 0 && p.allocated_bytes <= quarter && p.budget == quarter,
          "the step in flight switched to the quarter's plan: rung %u, allocated %llu",
          p.rung, (unsigned long long)p.allocated_bytes);
    CHECK(p.steps < steps, "training was still running (step %u of %u)", p.steps, steps);
    pthread_join(th, NULL);
    CHECK(j.status == FRUGAL_STATUS_OK && j.done == steps, "training: status %d, %u of %u steps",
          (int)j.status, j.done, steps);
    p = info_of(t);
    CHECK(p.rung == 0 && p.allocated_bytes <= quarter, "training went on inside the quarter");
    CHECK(j.losses[steps - 1] < j.losses[0], "the loss fell: %f -> %f", j.losses[0], j.losses[steps - 1]);

    float *probs = malloc(tn * 10 * sizeof(float));
    EXPECT(frugal_predict(t, tx, tn * 64, probs, tn * 10), FRUGAL_STATUS_OK);
    size_t right = 0;
    for (size_t i = 0; i < tn; i++) {
        int best = 0;
        for (int c = 1; c < 10; c++)
            if (probs[i * 10 + c] > probs[i * 10 + best]) best = c;
        right += (uint32_t)best == ty[i];
    }
    double acc = (double)right / (double)tn;
    printf("held-out accuracy after %u steps: %.2f %% (%zu of %zu)\n", steps, 100 * acc, right, tn);
    CHECK(acc >= 0.95, "held-out accuracy %.4f", acc);
    free(probs);
    free(j.losses);
    EXPECT(frugal_destroy(t), FRUGAL_STATUS_OK);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL.frgm TRAIN-IMAGES TRAIN-LABELS TEST-IMAGES TEST-LABELS\n", argv[0]);
        return 2;
    }
    size_t model_len;
    unsigned char *model = read_file(argv[1], &model_len);
    float *x, *tx;
    uint32_t *y, *ty;
    size_t n = load_digits(argv[2], argv[3], &x, &y), tn = load_digits(argv[4], argv[5], &tx, &ty);
    error_paths(model, model_len, x, y, n);
    training(model, model_len, x, y, n, tx, ty, tn);
    CHECK(frugal_live_trainers() == 0, "%zu live at the end", frugal_live_trainers());
    printf("%d passed, %d failed\n", passed, failed);
    free(model);
    free(x);
    free(y);
    free(tx);
    free(ty);
    return failed ? 1 : 0;
}
