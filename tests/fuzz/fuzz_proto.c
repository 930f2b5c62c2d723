/* libFuzzer target: every protobuf message a worker or the front-end
 * decodes (proto/ditd.proto). All of them travel inside an Envelope, which
 * both sides unpack; the bytes are also unpacked as each message type
 * alone. What the front-end and the workers read of a decoded Envelope
 * (its oneof member, repeated fields and their lengths) must be there.
 * Never a crash or a leak. (No pack/unpack round trip is asserted:
 * protobuf-c 1.4 keeps unknown fields, even tag 0, in a form it does not
 * always decode again, and nothing of ours packs what it decoded.) The front-end's handling of decoded messages is fuzzed by
 * tests/unit/test_sched.c (mutated messages into ditd__sched_on_message). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/ditd.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Each message type alone: decoded and freed (protobuf-c's repacking of a
 * message decoded from another type's bytes is its own affair: nothing of
 * ours packs what it decoded). */
#define TRY(T, t)                                                               \
    do {                                                                        \
        T *msg = t##__unpack(NULL, size, data);                                 \
        if (msg)                                                                \
            t##__free_unpacked(msg, NULL);                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Ditd__Envelope *env = ditd__envelope__unpack(NULL, size, data);
    if (env) {
        switch (env->msg_case) {
        case DITD__ENVELOPE__MSG_BATCH:
            if (!env->batch || (env->batch->n_samples && !env->batch->samples))
                abort();
            for (size_t i = 0; i < env->batch->n_samples; i++)
                if (!env->batch->samples[i])
                    abort();
            break;
        case DITD__ENVELOPE__MSG_PROGRESS:
            for (size_t i = 0; i < env->progress->n_previews; i++)
                if (env->progress->previews[i]->pixels.len && !env->progress->previews[i]->pixels.data)
                    abort();
            break;
        case DITD__ENVELOPE__MSG_RESULT:
            for (size_t i = 0; i < env->result->n_images; i++)
                if (env->result->images[i]->pixels.len && !env->result->images[i]->pixels.data)
                    abort();
            break;
        case DITD__ENVELOPE__MSG_ERROR:
            if (!env->error->message)
                abort();
            break;
        case DITD__ENVELOPE__MSG_CANCEL:
            if (env->cancel->n_slots && !env->cancel->slots)
                abort();
            break;
        default:
            break;
        }
        ditd__envelope__free_unpacked(env, NULL);
    }
    TRY(Ditd__Batch, ditd__batch);
    TRY(Ditd__Progress, ditd__progress);
    TRY(Ditd__Result, ditd__result);
    TRY(Ditd__Cancel, ditd__cancel);
    TRY(Ditd__Error, ditd__error);
    TRY(Ditd__Heartbeat, ditd__heartbeat);
    TRY(Ditd__Shutdown, ditd__shutdown);
    return 0;
}
