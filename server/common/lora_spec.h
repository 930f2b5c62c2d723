/* The LoRA adapters a command is given (docs/lora.md): `--lora NAME=PATH`
 * (repeatable) and `--lora-dir DIR` (every *.safetensors file in it, named
 * by its file's stem), as `ditd generate` and `ditd serve` read them.
 * Names only: the files are read by the replica's loader
 * (engine/models/lora.h). Shared by server/cmd and server/daemon. */
#ifndef DITD_SERVER_COMMON_LORA_SPEC_H
#define DITD_SERVER_COMMON_LORA_SPEC_H

#include <stddef.h>

#define DITD_LORA_SPEC_MAX 64      /* adapters one server holds */
#define DITD_LORA_NAME_MAX 64      /* bytes of a name, with the NUL */
#define DITD_LORA_PATH_MAX 1024    /* bytes of a path, with the NUL */

typedef struct ditd_lora_spec {
    char name[DITD_LORA_NAME_MAX];
    char path[DITD_LORA_PATH_MAX];
} ditd_lora_spec;

typedef struct ditd_lora_specs {
    int n;
    ditd_lora_spec v[DITD_LORA_SPEC_MAX];
} ditd_lora_specs;

/* Whether name[0 .. len) is an adapter name: 1..63 bytes of letters,
 * digits, '_', '-' and '.'. */
int ditd_lora_name_ok(const char *name, size_t len);

/* Adds "NAME=PATH". DITD_EINVAL naming `who` (the option): no '=', a bad
 * name, a name given twice (naming both paths), too many, a path too long. */
int ditd_lora_specs_add(ditd_lora_specs *s, const char *arg, const char *who);
/* Adds every regular *.safetensors file of dir, sorted by file name, each
 * named by its stem. DITD_ENOENT / DITD_EIO (the folder), DITD_EINVAL (a
 * stem that is not a name, a name given twice, too many) naming `who`, the
 * folder and the file. A folder without adapters adds none. */
int ditd_lora_specs_add_dir(ditd_lora_specs *s, const char *dir, const char *who);
/* The index of name, or -1. */
int ditd_lora_specs_find(const ditd_lora_specs *s, const char *name);

/* Where a run-time load (POST /v1/loras) may read from. A relative path
 * is taken under base (NULL or "": refused, there is nothing to take it
 * under). The path is resolved with realpath (links followed, "." and
 * ".." gone) into out (DITD_LORA_PATH_MAX bytes), and must name a regular
 * file (not a folder, a device or a pipe, which a read would never end
 * on). DITD_EINVAL (empty, relative without a base, too long, not a
 * regular file), DITD_ENOENT / DITD_EIO (it does not resolve), each
 * naming the path as given. */
int ditd_lora_path_resolve(const char *base, const char *path, char *out);
/* 1 when the resolved path lies inside one of roots[0 .. n) (each resolved
 * too; one that does not resolve holds nothing), else 0. */
int ditd_lora_path_under(const char *const *roots, int n, const char *resolved);

#endif
