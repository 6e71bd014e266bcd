/* What prefilter.c and sqlite_walk.c share. */
#ifndef MEMSNAP_PREFILTER_H
#define MEMSNAP_PREFILTER_H
#include <node_api.h>
#include <stdint.h>

/* The pre-filter scan (prefilter.c): the first offset in [from, end) where a scanner could match, or -1. */
long memsnap_scan(const uint8_t *b, long lo, long from, long end);
/* The first backslash in [from, to) that starts a JSON escape which can hide a secret (ending by `end`), or -1. */
long memsnap_hiding_escape(const uint8_t *b, long from, long to, long end);
/* Adds sqliteWalk (sqlite_walk.c) to the addon's exports. */
void memsnap_register_sqlite_walk(napi_env env, napi_value exports);
#endif
