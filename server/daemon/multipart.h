/* multipart/form-data (RFC 7578) for a request body already in memory: the
 * form of /v1/images/edits (issue 23: image, image[], mask, prompt, ...).
 *
 * The boundary comes from the request's Content-Type. Each part must carry
 * Content-Disposition: form-data with a name; filename and the part's own
 * Content-Type are kept when present. Repeated names (image[]) are kept in
 * order. A part's data points into the body (no copy); the body must outlive
 * the form. Limits on the number of parts, each part's header block and
 * data; every length is checked.
 *
 * Not here: streaming (the HTTP edge collects the body first, under its own
 * size limit), header folding, the filename* / RFC 2231 encodings (RFC 7578
 * 4.2 says senders must not use them), Content-Transfer-Encoding (deprecated
 * by RFC 7578 4.7; a part that sets anything but 7bit/8bit/binary is refused).
 */
#ifndef DITD_SERVER_DAEMON_MULTIPART_H
#define DITD_SERVER_DAEMON_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

typedef struct ditd_multipart_limits {
    int max_parts;           /* parts in one body */
    size_t max_header_bytes; /* one part's header block */
    size_t max_part_bytes;   /* one part's data */
} ditd_multipart_limits;

#define DITD_MULTIPART_MAX_PARTS_DEFAULT 64
#define DITD_MULTIPART_MAX_HEADER_DEFAULT 4096
#define DITD_MULTIPART_MAX_PART_DEFAULT ((size_t)25 << 20)

typedef struct ditd_multipart_part {
    char *name;            /* the form field's name (never NULL) */
    char *filename;        /* NULL when the part has none */
    char *content_type;    /* the part's Content-Type; NULL when absent */
    const uint8_t *data;   /* into the body */
    size_t len;
} ditd_multipart_part;

typedef struct ditd_multipart_form {
    ditd_multipart_part *parts;
    int n_parts;
} ditd_multipart_form;

void ditd_multipart_limits_default(ditd_multipart_limits *lim);

/* The boundary of a "multipart/form-data; boundary=..." Content-Type into
 * out (NUL-terminated, 1..70 characters per RFC 2046). DITD_EINVAL when the
 * type is not multipart/form-data or the boundary is missing or malformed. */
int ditd_multipart_boundary(const char *content_type, char *out, size_t cap);

/* Parses body[0..len) into *form (zeroed on failure). lim NULL: defaults.
 * DITD_EINVAL with a detail naming the part (index, name) and what is wrong:
 * no boundary, truncated body, a part without a name, a limit. */
int ditd_multipart_parse(const char *content_type, const uint8_t *body, size_t len,
                         const ditd_multipart_limits *lim, ditd_multipart_form *form);

void ditd_multipart_free(ditd_multipart_form *form);

/* The form as the JSON object a JSON body would be (the official OpenAI
 * client sends its create calls as forms, every value text): a text part
 * as a string, one named in `ints` (`nums`) as an integer (number) when its
 * whole text is one, one named in `objs` parsed as JSON, a file part as
 * true (its bytes are not carried; the caller refuses or reads it; file
 * parts of one name given several times, a list such as `image[]`, are one
 * true). The lists are NULL-terminated (NULL: none). NULL on a text part
 * given twice (or a text and a file part of one name), a NUL
 * byte, text that is not UTF-8 or an `objs` part that is not JSON:
 * DITD_EINVAL with a detail naming the field, its name in field[0..n). */
struct json_t;
struct json_t *ditd_multipart_to_json(const ditd_multipart_form *form, const char *const *ints,
                                      const char *const *nums, const char *const *objs,
                                      char *field, size_t n);

/* The nth (0-based) part named name, or NULL; ditd_multipart_count: how many. */
const ditd_multipart_part *ditd_multipart_find(const ditd_multipart_form *form, const char *name,
                                               int nth);
int ditd_multipart_count(const ditd_multipart_form *form, const char *name);

#endif
