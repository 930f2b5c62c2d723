/* Whole decimal numbers with bounds, as the command line and `ditd serve`'s
 * options (server/daemon/config.c) read them. Shared by server/cmd and
 * server/daemon, so it sits below both. Not a general option parser. */
#ifndef DITD_SERVER_COMMON_PARSE_H
#define DITD_SERVER_COMMON_PARSE_H

/* Parses a whole decimal integer / float with bounds; 0 or DITD_EINVAL with
 * a detail naming `what`. */
int ditd_parse_long(const char *s, long lo, long hi, const char *what, long *out);
int ditd_parse_double(const char *s, double lo, double hi, const char *what, double *out);

#endif
